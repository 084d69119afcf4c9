"""A store client *process* for multi-process tests and the benchmark, driven by JSON lines on stdin.

Run: ``python -m mooncake.store.client.store_worker --master HOST:PORT [--segment 64MB] [--buffer 16MB]
[--ssd DIR] [--metadata P2PHANDSHAKE]`` (--ssd: enable_ssd_offload with ssd_offload_path DIR; --metadata: the
Transfer Engine's metadata server).
The first stdout line is {"ready": true, "hostname": ..., "code": setup's return value}. Then each stdin
line is one request answered by exactly one stdout line, in order:

  {"op": "call", "m": "put", "a": [...], "kw": {...}} -> {"ok": true, "r": <return value>}
      runs store.<m>(*a, **kw). Bytes travel as {"b64": "..."}; a "config" kw / list arg given as a dict
      becomes a ReplicateConfig; return values are encoded the same way (lists recursively).
  {"op": "fill", "prefix": P, "count": N, "size": S, "seed": X} -> {"ok": true, "codes": {code: n}}
      puts keys P0..P{N-1} with the deterministic content pattern(S, X + i).
  {"op": "verify", "prefix": P, "count": N, "size": S, "seed": X} -> {"ok": true, "good": n, "bad": [keys]}
  {"op": "put_start_only", "key": K, "size": S} -> {"ok": true, "code": c}: a put that never ends (the
      process is about to be killed in the middle of a put).
  {"op": "get_into", "key": K, "size": S} -> {"ok": true, "n": get_into's result, "data": bytes read}: through
      a buffer of S bytes given to register_buffer (and unregistered afterwards).
  {"op": "descs", "key": K} -> {"ok": true, "descs": [{"memory": bool, "local_disk": bool, "size": n,
      "client_id": owner (disk), "endpoint": ...}]}: get_replica_desc(K) in plain form.
  {"op": "flush_disk"} -> {"ok": true, "done": bool}: waits until this client's SSD tier persisted (and
      reported) every object committed to its segment so far.
  {"op": "client_id"} -> {"ok": true, "client_id": this client's id at the master}.
  {"op": "engine_stats"} -> {"ok": true, "stats": its Transfer Engine's get_stats() (parsed)}.
  {"op": "exit"} -> {"ok": true}, then the store is closed and the process exits.
A failing request is answered {"ok": false, "error": "..."}; the process keeps going.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

import numpy as np

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store.master.testing import serve_json_lines


def pattern(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def encode(v):
    if isinstance(v, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if isinstance(v, dict):
        return {str(k): encode(x) for k, x in v.items()}
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return repr(v)


def decode(v):
    if isinstance(v, dict):
        if set(v) == {"b64"}:
            return base64.b64decode(v["b64"])
        return {k: decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v


def _handle(store: MooncakeDistributedStore, req: dict) -> dict:
    op = req["op"]
    if op == "call":
        kw = {k: decode(v) for k, v in req.get("kw", {}).items()}
        if isinstance(kw.get("config"), dict):
            kw["config"] = ReplicateConfig(**kw["config"])
        return {"ok": True, "r": encode(getattr(store, req["m"])(*decode(req.get("a", [])), **kw))}
    if op in ("fill", "verify"):
        codes, bad = {}, []
        for i in range(req["count"]):
            key, want = f"{req['prefix']}{i}", pattern(req["size"], req["seed"] + i)
            if op == "fill":
                c = store.put(key, want)
                codes[c] = codes.get(c, 0) + 1
            elif store.get(key) != want:
                bad.append(key)
        if op == "fill":
            return {"ok": True, "codes": codes}
        return {"ok": True, "good": req["count"] - len(bad), "bad": bad}
    if op == "put_start_only":
        reply = store._rpc("PutStart", key=req["key"], size=req["size"])
        return {"ok": True, "code": reply if isinstance(reply, int) else reply.code}
    if op == "get_into":
        buf = np.zeros(req["size"], dtype=np.uint8)
        assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        try:
            n = store.get_into(req["key"], buf.ctypes.data, buf.nbytes)
        finally:
            store.unregister_buffer(buf.ctypes.data)
        return {"ok": True, "n": n, "data": encode(buf[:max(n, 0)].tobytes())}
    if op == "descs":
        out = []
        for d in store.get_replica_desc(req["key"]):
            if d.is_local_disk_replica():
                dd = d.get_disk_descriptor()
                out.append({"memory": False, "local_disk": True, "size": dd.object_size, "client_id": dd.client_id,
                            "endpoint": dd.transport_endpoint})
            else:
                md = d.get_memory_descriptor()
                out.append({"memory": True, "local_disk": False, "size": md.size, "client_id": "",
                            "endpoint": md.transport_endpoint})
        return {"ok": True, "descs": out}
    if op == "flush_disk":
        return {"ok": True, "done": store._flush_disk()}
    if op == "client_id":
        return {"ok": True, "client_id": store._master.client_id}
    if op == "engine_stats":
        return {"ok": True, "stats": json.loads(store._engine.get_stats())}
    raise ValueError(f"unknown op {op!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--segment", default="64MB")
    p.add_argument("--buffer", default="16MB")
    p.add_argument("--ssd", default="")
    p.add_argument("--metadata", default="P2PHANDSHAKE")
    p.add_argument("--protocol", default="tcp", help="the transfer engine's protocol (tcp, rdma, efa, ...)")
    p.add_argument("--device", default="", help="the protocol's device names (device_name), e.g. 'lo'")
    args = p.parse_args(argv)
    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", args.metadata, args.segment, args.buffer, args.protocol, args.device, args.master,
                       enable_ssd_offload=bool(args.ssd), ssd_offload_path=args.ssd)
    serve_json_lines(lambda req: _handle(store, req),
                     {"ready": True, "code": code, "hostname": store.get_hostname()})
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
