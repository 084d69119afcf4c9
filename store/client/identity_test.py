"""A store client restarted under its old ``local_hostname`` (HTTP metadata: the name is the segment's name)
while the master still lists its dead predecessor's segment: the new instance never copies from or into the
dead one's memory (it used to, by comparing names: a SIGSEGV, or wrong bytes where the address was mapped),
the master drops the dead instance's segment and objects, and every later put lands in live memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from mooncake.http_metadata_server import HttpMetadataServer
from mooncake.store.master.testing import MasterProcess, child_env, read_line, stop_process

_CLIENT = textwrap.dedent("""
    import json, sys, time
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    from mooncake.store.client.soak_worker import value_of

    host, meta, master, mode = sys.argv[1:5]
    for attempt in range(10):  # the first attempt meets the dead one's metadata keys
        s = MooncakeDistributedStore()
        if s.setup(host, meta, "32MB", "8MB", "tcp", "", master) == 0:
            break
        s.close()
        time.sleep(0.2)
    else:
        sys.exit(3)
    size = 256 << 10
    mine = ReplicateConfig(preferred_segments=[s.get_hostname()])
    if mode == "first":
        codes = [s.put(f"k{i}", value_of(f"k{i}", size), mine) for i in range(20)]
        print(json.dumps({"codes": codes}), flush=True)
        time.sleep(600)  # killed here: its segment stays listed at the master
    old = [s.get(f"k{i}") for i in range(20)]
    wrong = [i for i, v in enumerate(old) if v and v != value_of(f"k{i}", size)]
    codes = [s.put(f"n{i}", value_of(f"n{i}", size)) for i in range(60)]
    back = [s.get(f"n{i}") == value_of(f"n{i}", size) for i in range(60)]
    print(json.dumps({"old_found": sum(1 for v in old if v), "old_wrong": wrong, "codes": codes,
                      "readable": sum(back)}), flush=True)
    s.close()
""")


def _client(host: str, meta: str, master: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CLIENT, host, meta, master, mode], stdout=subprocess.PIPE,
                            text=True, env=child_env())


def test_restarted_client_never_touches_its_predecessors_segment():
    from mooncake.testing.services import free_port

    meta = HttpMetadataServer("127.0.0.1", 0).start()
    master = MasterProcess("--client_ttl=60")  # the dead instance stays "alive" for a minute
    host = f"127.0.0.1:{free_port()}"
    procs = []
    try:
        first = _client(host, meta.url, master.address, "first")
        procs.append(first)
        assert json.loads(read_line(first, 60))["codes"] == [0] * 20
        first.kill()
        first.wait(5)
        second = _client(host, meta.url, master.address, "second")
        procs.append(second)
        out = json.loads(read_line(second, 120))
        assert second.wait(30) == 0
        assert out["old_wrong"] == [] and out["old_found"] == 0, out  # its memory died with it
        assert out["codes"] == [0] * 60 and out["readable"] == 60, out
    finally:
        for p in procs:
            stop_process(p, 2)
        master.stop()
        meta.stop()
