"""One Transfer Engine in a process of a network-namespace "host", driven by JSON lines on stdin: the peer of the
transports' multi-host tests. ``python -m mooncake.testing.netns_peer <ip> <buffer bytes> <protocol>`` prints
{"rc", "segment", "addr"} once ready (rc != 0: initialize or register_memory failed), then answers each command
with one line: {"cmd": "fill", "seed"} (pseudo-random bytes, numpy default_rng), {"cmd": "digest", "length"}
(sha256 of the first bytes), {"cmd": "transfer", "op": "write"|"read", "segment", "remote", "length"} ({"rc",
"seconds"}: a sync transfer from/to the buffer's start), {"cmd": "stats"} (get_stats())."""

import hashlib
import json
import sys
import time

import numpy as np


def main() -> None:
    from mooncake.engine import TransferEngine

    ip, size, protocol = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = TransferEngine()
    rc = e.initialize(ip, "P2PHANDSHAKE", protocol, "")
    buf = np.zeros(size, dtype=np.uint8)
    if rc == 0:
        rc = e.register_memory(buf.ctypes.data, size)
    print(json.dumps({"rc": rc, "segment": e.get_local_segment_name() if rc == 0 else "", "addr": buf.ctypes.data}),
          flush=True)
    for line in sys.stdin:
        r = json.loads(line)
        out = {}
        if r["cmd"] == "fill":
            buf[:] = np.random.default_rng(r["seed"]).integers(0, 256, size, dtype=np.uint8)
        elif r["cmd"] == "digest":
            out["sha256"] = hashlib.sha256(buf[:r["length"]]).hexdigest()
        elif r["cmd"] == "transfer":
            fn = e.transfer_sync_write if r["op"] == "write" else e.transfer_sync_read
            t0 = time.monotonic()
            out["rc"] = fn(r["segment"], buf.ctypes.data, r["remote"], r["length"])
            out["seconds"] = time.monotonic() - t0
        elif r["cmd"] == "stats":
            out["stats"] = json.loads(e.get_stats())
        print(json.dumps(out), flush=True)
    e.close()


if __name__ == "__main__":
    main()
