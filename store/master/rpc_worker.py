"""A master client *process* for multi-process tests and the benchmark, driven by JSON lines on stdin.

Run: ``python -m mooncake.store.master.rpc_worker --master HOST:PORT [--client_id ID]``. Each stdin line is
one request, answered by exactly one stdout line, in order:

  {"op": "call", "method": "PutStart", "fields": {...}}   -> {"ok": true, "reply": {...}} (reply as a dict)
  {"op": "mount", "segment": {...Segment fields...}}      -> {"ok": true, "code": 0}   (remembered for remount)
  {"op": "heartbeat", "interval": 0.2}                    -> {"ok": true}  (pings; remounts on NEED_REMOUNT)
  {"op": "loop", "kind": K, "prefix": P, "size": S, "count": N | "seconds": T, "batch": B}
        -> {"ok": true, "items": n, "rpcs": n, "elapsed": s, "errors": {code: n}}
     K: "put" (PutStart+PutEnd per key), "batch_put" (BatchPutStart+BatchPutEnd of B keys), "get"
        (GetReplicaList of keys P0..P{N-1}, cycling), "batch_get", "exist", "put_get_remove" (a full cycle
        per key: PutStart, PutEnd, GetReplicaList, Remove(force)), "info" (GetServiceInfo: no store work).
  {"op": "echo", "address": A, "seconds": T, "payload": N} -> like "loop": a plain gRPC echo (bytes in, same
        bytes out, no protobuf) against bench.py's echo server at A: the gRPC round-trip floor.
  {"op": "exit"}                                          -> {"ok": true}, then the process exits
Errors (a gRPC failure, bad request) are answered {"ok": false, "error": "..."}; the process keeps going.
The first line written is {"ready": true, "client_id": ...} once the channel is connected.
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc

from mooncake.store.common.master_client import MasterClient, segment
from mooncake.store.master.testing import serve_json_lines
from mooncake.store.proto import mooncake_master_pb2 as pb


def to_dict(msg) -> dict:
    """Message -> dict with every field present (ints stay ints, enums as numbers)."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.message_type is not None:
            if f.is_repeated:
                out[f.name] = [to_dict(x) for x in v]
            else:
                out[f.name] = to_dict(v) if msg.HasField(f.name) else None
        else:
            out[f.name] = list(v) if f.is_repeated else v
    return out


def _build(method: str, fields: dict):
    """Turns nested dicts for message-typed fields into messages (config, segment(s))."""
    req_type = getattr(pb, pb.DESCRIPTOR.services_by_name["MasterService"].methods_by_name[method].input_type.name)
    out = {}
    for name, value in fields.items():
        f = req_type.DESCRIPTOR.fields_by_name.get(name)
        if f is not None and f.message_type is not None:
            cls = getattr(pb, f.message_type.name)
            value = [cls(**v) for v in value] if f.is_repeated else cls(**value)
        out[name] = value
    return out


def run_loop(client: MasterClient, kind: str, prefix: str, size: int, count: int, seconds: float, batch: int) -> dict:
    """Runs `count` items (or for `seconds`) of one operation kind; returns counters."""
    errors: dict[int, int] = {}
    items = rpcs = 0
    deadline = time.perf_counter() + seconds if seconds else None
    t0 = time.perf_counter()
    call = client.call

    def note(code: int) -> None:
        if code:
            errors[code] = errors.get(code, 0) + 1

    i = 0
    while (deadline is None and items < count) or (deadline is not None and time.perf_counter() < deadline):
        if kind in ("put", "put_get_remove"):
            key = f"{prefix}{i}"
            note(call("PutStart", key=key, size=size).code)
            note(call("PutEnd", key=key).code)
            rpcs += 2
            if kind == "put_get_remove":
                note(call("GetReplicaList", key=key).code)
                note(call("Remove", key=key, force=True).code)
                rpcs += 2
            items += 1
        elif kind == "batch_put":
            keys = [f"{prefix}{i + j}" for j in range(batch)]
            for r in call("BatchPutStart", keys=keys, sizes=[size] * batch).results:
                note(r.code)
            for c in call("BatchPutEnd", keys=keys).codes:
                note(c)
            rpcs += 2
            items += batch
            i += batch - 1
        elif kind in ("get", "exist"):
            key = f"{prefix}{i % count}" if count else f"{prefix}0"
            reply = call("GetReplicaList" if kind == "get" else "ExistKey", key=key)
            note(reply.code)
            rpcs += 1
            items += 1
        elif kind == "batch_get":
            n = max(count, 1)
            keys = [f"{prefix}{(i + j) % n}" for j in range(batch)]
            for r in call("BatchGetReplicaList", keys=keys).results:
                note(r.code)
            rpcs += 1
            items += batch
            i += batch - 1
        elif kind == "info":
            note(call("GetServiceInfo").code)
            rpcs += 1
            items += 1
        else:
            raise ValueError(f"unknown loop kind {kind!r}")
        i += 1
    return {"items": items, "rpcs": rpcs, "elapsed": time.perf_counter() - t0,
            "errors": {str(k): v for k, v in errors.items()}}


ECHO_METHOD = "/mooncake.bench.Echo/Echo"


def run_echo(address: str, seconds: float, payload: int) -> dict:
    with grpc.insecure_channel(address) as channel:
        echo = channel.unary_unary(ECHO_METHOD)  # no serializers: bytes in, bytes out
        body = b"x" * payload
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            if echo(body, timeout=20) != body:
                raise RuntimeError("echo returned different bytes")
            n += 1
        return {"items": n, "rpcs": n, "elapsed": time.perf_counter() - t0, "errors": {}}


def handle(client: MasterClient, req: dict) -> dict:
    op = req.get("op")
    if op == "echo":
        return {"ok": True, **run_echo(req["address"], float(req.get("seconds", 1)), int(req.get("payload", 16)))}
    if op == "call":
        method = req["method"]
        return {"ok": True, "reply": to_dict(client.call(method, **_build(method, req.get("fields", {}))))}
    if op == "mount":
        return {"ok": True, "code": client.mount(segment(**req["segment"]))}
    if op == "heartbeat":
        client.start_heartbeat(float(req.get("interval", 1.0)))
        return {"ok": True}
    if op == "loop":
        return {"ok": True, **run_loop(client, req["kind"], req.get("prefix", "k"), int(req.get("size", 4096)),
                                       int(req.get("count", 0)), float(req.get("seconds", 0)),
                                       int(req.get("batch", 1)))}
    raise ValueError(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--master", required=True)
    p.add_argument("--client_id", default=None)
    args = p.parse_args(argv)
    client = MasterClient(args.master, args.client_id, timeout=20.0)
    client.wait_ready(timeout=20.0)
    serve_json_lines(lambda req: handle(client, req), {"ready": True, "client_id": client.client_id})
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
