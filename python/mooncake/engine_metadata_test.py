"""etcd and Redis metadata backends, against real etcd and redis-server processes (and, where the behaviour
is common to every key-value backend, the HTTP metadata server)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine
from mooncake.testing.engine_peer import EnginePeer, pattern
from mooncake.testing.services import Etcd, Redis, free_port

TTL = 2  # seconds; MC_METADATA_LEASE_TTL for engines whose keys must expire quickly


@pytest.fixture(scope="module", params=["etcd", "redis"])
def service(request):
    svc = Etcd() if request.param == "etcd" else Redis()
    svc.scheme = request.param
    yield svc
    svc.close()


class _Http:
    """The HTTP metadata server behind the same small interface as testing.services.Etcd/Redis."""

    scheme = "http"

    def __init__(self):
        from mooncake.http_metadata_server import HttpMetadataServer

        self.server = HttpMetadataServer("127.0.0.1", 0).start()
        self.endpoint = f"127.0.0.1:{self.server.port}/metadata"

    def get(self, key):
        value = self.server.store.get(key)
        return value.decode() if value is not None else None

    def keys(self):
        return self.server.store.keys()

    def put(self, key, value):
        self.server.store.set(key, value.encode())  # as another engine's PUT (rpc_meta: after a delete)

    def close(self):
        self.server.stop()


def put(svc, key, value):
    """Writes a key the way another engine would (no lease / TTL)."""
    if isinstance(svc, _Http):
        svc.put(key, value)
    elif isinstance(svc, Etcd):
        subprocess.run(["etcdctl", "--endpoints", svc.endpoint, "put", key, value], check=True,
                       capture_output=True, env={**os.environ, "ETCDCTL_API": "3"})
    else:
        subprocess.run(["redis-cli", "-p", str(svc.port), "SET", key, value], check=True, capture_output=True)


@pytest.fixture(scope="module", params=["http", "etcd", "redis"])
def any_service(request):
    svc = _Http() if request.param == "http" else Etcd() if request.param == "etcd" else Redis()
    svc.scheme = request.param
    yield svc
    svc.close()


def url(svc):
    return f"{svc.scheme}://{svc.endpoint}"


def wait_until(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_transfer_and_clean_exit_removes_keys(service):
    peer = EnginePeer(url(service), "127.0.0.1:32001", 1 << 20)
    engine = TransferEngine()
    try:
        assert engine.initialize("127.0.0.1:32002", url(service), "tcp", "") == 0
        keys = service.keys()
        assert "mooncake/ram/127.0.0.1:32001" in keys and "mooncake/rpc_meta/127.0.0.1:32001" in keys
        desc = json.loads(service.get("mooncake/ram/127.0.0.1:32001"))
        assert desc["name"] == "127.0.0.1:32001" and desc["buffers"][0]["addr"] == peer.buffer
        buf = np.zeros(1 << 20, dtype=np.uint8)
        assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
        buf[:] = pattern(1 << 20, 1)
        assert engine.transfer_sync_write(peer.segment, buf.ctypes.data, peer.buffer, buf.nbytes) == 0
        assert engine.send_probe(peer.segment) == 0
    finally:
        engine.close()
        peer.close()
    assert not [k for k in service.keys() if "3200" in k]  # both exited cleanly: nothing left behind


def test_crashed_engine_keys_expire(service):
    peer = EnginePeer(url(service), "127.0.0.1:32011", 4096, env={"MC_METADATA_LEASE_TTL": str(TTL)})
    assert service.get("mooncake/ram/127.0.0.1:32011") is not None
    time.sleep(TTL * 1.5)  # keep-alive must hold the keys past one TTL while the engine lives
    assert service.get("mooncake/ram/127.0.0.1:32011") is not None
    peer.kill()
    assert wait_until(lambda: service.get("mooncake/ram/127.0.0.1:32011") is None, TTL * 4 + 5)
    assert service.get("mooncake/rpc_meta/127.0.0.1:32011") is None


def test_cluster_id_namespaces_keys(service):
    os.environ["MC_METADATA_CLUSTER_ID"] = "tenant-a"
    try:
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1:32021", url(service), "tcp", "") == 0
    finally:
        del os.environ["MC_METADATA_CLUSTER_ID"]
    try:
        assert service.get("mooncake/tenant-a/rpc_meta/127.0.0.1:32021") is not None
        assert service.get("mooncake/rpc_meta/127.0.0.1:32021") is None
    finally:
        engine.close()


def test_unreachable_metadata_fails_initialize_quickly(service):
    engine = TransferEngine()
    t0 = time.monotonic()
    assert engine.initialize("127.0.0.1:32031", f"{service.scheme}://127.0.0.1:{free_port()}", "tcp", "") == -1
    assert time.monotonic() - t0 < 15


def test_etcd_endpoint_list_fails_over():
    with Etcd() as etcd:
        engine = TransferEngine()
        conn = f"etcd://127.0.0.1:{free_port()};{etcd.endpoint}"
        assert engine.initialize("127.0.0.1:32041", conn, "tcp", "") == 0
        assert etcd.get("mooncake/rpc_meta/127.0.0.1:32041") is not None
        engine.close()
        bare = TransferEngine()  # Mooncake: a connection string without a scheme means etcd
        assert bare.initialize("127.0.0.1:32042", etcd.endpoint, "tcp", "") == 0
        bare.close()


def test_restarted_http_metadata_server_is_repopulated():
    """The HTTP server keeps keys in memory only; engines write theirs back after it restarts."""
    from mooncake.http_metadata_server import HttpMetadataServer

    first = HttpMetadataServer("127.0.0.1", 0).start()
    port = first.port
    os.environ["MC_METADATA_LEASE_TTL"] = str(TTL)
    try:
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1:32051", first.url, "tcp", "") == 0
    finally:
        del os.environ["MC_METADATA_LEASE_TTL"]
    first.stop()
    second = HttpMetadataServer("127.0.0.1", port).start()
    try:
        assert wait_until(lambda: second.store.get("mooncake/ram/127.0.0.1:32051") is not None and
                          second.store.get("mooncake/rpc_meta/127.0.0.1:32051") is not None, TTL * 4 + 5)
        engine.close()
        assert second.store.keys() == []  # a clean exit still removes them
    finally:
        second.stop()


def _reachable(svc, name, size):
    """A fresh engine finds `name` through the metadata and moves bytes to it."""
    engine = TransferEngine()
    try:
        assert engine.initialize("127.0.0.1:32199", url(svc), "tcp", "") == 0
        buf = np.frombuffer(pattern(size, 7).tobytes(), dtype=np.uint8).copy()
        assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
        first = engine.get_first_buffer_address(name)
        assert first != 0
        assert engine.transfer_sync_write(name, buf.ctypes.data, first, size) == 0
        return first
    finally:
        engine.close()


def test_failed_initialize_leaves_the_live_owners_keys(any_service):
    """A second engine under a live engine's name fails to initialize and removes nothing of the first's: new
    peers still find and reach the live one."""
    svc = any_service
    owner = EnginePeer(url(svc), "127.0.0.1:32101", 4096)
    try:
        keys = {k: svc.get(k) for k in ("mooncake/ram/127.0.0.1:32101", "mooncake/rpc_meta/127.0.0.1:32101")}
        assert all(keys.values())
        twin = TransferEngine()
        assert twin.initialize("127.0.0.1:32101", url(svc), "tcp", "") == -1
        twin.close()
        assert {k: svc.get(k) for k in keys} == keys  # untouched
        assert _reachable(svc, owner.segment, 4096) == owner.buffer
        assert owner.digest(0, 4096) == hashlib.sha256(pattern(4096, 7)).hexdigest()
    finally:
        owner.close()
    assert not [k for k in svc.keys() if "32101" in k]


def test_restart_under_a_dead_engines_name_takes_it_over(any_service):
    """An engine restarted under the name of its SIGKILLed predecessor (whose keys are still there: the HTTP
    server keeps them forever, etcd/Redis until their TTL) initializes, and peers reach the new one."""
    svc = any_service
    dead = EnginePeer(url(svc), "127.0.0.1:32111", 4096)
    dead.kill()
    stale = svc.get("mooncake/rpc_meta/127.0.0.1:32111")
    assert stale is not None
    t0 = time.monotonic()
    heir = EnginePeer(url(svc), "127.0.0.1:32111", 8192)
    try:
        assert time.monotonic() - t0 < 8
        rpc = json.loads(svc.get("mooncake/rpc_meta/127.0.0.1:32111"))
        assert rpc["rpc_port"] == heir.info["rpc_port"] != json.loads(stale)["rpc_port"]
        assert _reachable(svc, heir.segment, 8192) == heir.buffer
        assert heir.digest(0, 8192) == hashlib.sha256(pattern(8192, 7)).hexdigest()
    finally:
        heir.close()
    assert not [k for k in svc.keys() if "32111" in k]


def test_a_stopped_owner_still_holds_its_name(any_service):
    """An owner that does not answer (SIGSTOP) is not proven gone: the name stays its own, and it serves again
    once resumed."""
    svc = any_service
    owner = EnginePeer(url(svc), "127.0.0.1:32121", 4096)
    try:
        before = svc.get("mooncake/rpc_meta/127.0.0.1:32121")
        owner.stop()
        os.environ["MC_HANDSHAKE_CONNECT_TIMEOUT"] = "1"
        try:
            twin = TransferEngine()
            assert twin.initialize("127.0.0.1:32121", url(svc), "tcp", "") == -1
            twin.close()
        finally:
            del os.environ["MC_HANDSHAKE_CONNECT_TIMEOUT"]
            owner.stop(signal.SIGCONT)
        assert svc.get("mooncake/rpc_meta/127.0.0.1:32121") == before
        assert _reachable(svc, owner.segment, 4096) == owner.buffer
    finally:
        owner.close()


def test_restart_at_the_same_address_keeps_the_name_alive(service):
    """An engine restarted at its predecessor's very address finds its own rpc_meta value there: it adopts
    the entry (binds it to its own lease / TTL), so the name outlives the dead engine's lease and stays
    claimed against newcomers."""
    port = free_port()
    name = f"127.0.0.1:{port}"
    env = {"MC_METADATA_LEASE_TTL": str(TTL), "MC_LEGACY_RPC_PORT_BINDING": "1"}
    EnginePeer(url(service), name, 4096, env=env).kill()
    heir = EnginePeer(url(service), name, 8192, env=env)
    try:
        assert heir.info["rpc_port"] == port
        time.sleep(TTL * 3)  # the dead engine's lease / TTL is long gone
        assert json.loads(service.get(f"mooncake/rpc_meta/{name}"))["rpc_port"] == port
        assert service.get(f"mooncake/ram/{name}") is not None
        twin = TransferEngine()
        assert twin.initialize(name, url(service), "tcp", "") == -1  # the name is claimed by a live engine
        twin.close()
        assert _reachable(service, name, 8192) == heir.buffer
    finally:
        heir.close()
    assert not [k for k in service.keys() if str(port) in k]


def test_restart_at_the_same_address_is_republished_after_an_http_server_restart():
    """The same on HTTP: the adopted entry is the engine's own, so it is written back after the (in-memory)
    metadata server restarts."""
    from mooncake.http_metadata_server import HttpMetadataServer

    port = free_port()
    name = f"127.0.0.1:{port}"
    env = {"MC_METADATA_LEASE_TTL": str(TTL), "MC_LEGACY_RPC_PORT_BINDING": "1"}
    first = HttpMetadataServer("127.0.0.1", 0).start()
    http_port = first.port
    EnginePeer(first.url, name, 4096, env=env).kill()
    heir = EnginePeer(first.url, name, 4096, env=env)
    first.stop()
    second = HttpMetadataServer("127.0.0.1", http_port).start()
    try:
        assert wait_until(lambda: second.store.get(f"mooncake/rpc_meta/{name}") is not None and
                          second.store.get(f"mooncake/ram/{name}") is not None, TTL * 4 + 5)
    finally:
        heir.close()
        second.stop()


def test_an_engine_that_lost_its_name_stops_publishing(any_service):
    """Once another engine holds our rpc_meta entry, our descriptor is never written over its one: publishing
    fails (register/unregister report it) and the new owner's descriptor stays."""
    svc = any_service
    name = "127.0.0.1:32141"
    owner = EnginePeer(url(svc), name, 4096, env={"MC_METADATA_LEASE_TTL": str(TTL)})
    try:
        heir_rpc = json.dumps({"ip_or_host_name": "127.0.0.1", "rpc_port": free_port()})
        heir_desc = json.dumps({"name": name, "buffers": [], "heir": True})
        put(svc, f"mooncake/rpc_meta/{name}", heir_rpc)  # another engine took the name over
        put(svc, f"mooncake/ram/{name}", heir_desc)
        assert owner.call("unregister")["rc"] != 0
        assert owner.call("register")["rc"] != 0
        time.sleep(TTL * 2)  # keep-alive / re-publication rounds must not write it back either
        assert svc.get(f"mooncake/ram/{name}") == heir_desc
        assert svc.get(f"mooncake/rpc_meta/{name}") == heir_rpc
    finally:
        owner.close()
    assert svc.get(f"mooncake/ram/{name}") == heir_desc  # a clean exit removes only what is still ours
    assert svc.get(f"mooncake/rpc_meta/{name}") == heir_rpc


def test_a_stale_entry_that_leads_to_ourselves_is_taken_over(any_service):
    """A stale entry with another address of this host and our own RPC port reaches our own server: that is
    no live owner (we hold the port), so the name is taken over."""
    svc = any_service
    port = free_port()
    name = f"127.0.0.1:{port}"
    put(svc, f"mooncake/rpc_meta/{name}", json.dumps({"ip_or_host_name": "127.0.0.2", "rpc_port": port}))
    engine = EnginePeer(url(svc), name, 4096, env={"MC_LEGACY_RPC_PORT_BINDING": "1"})
    try:
        assert json.loads(svc.get(f"mooncake/rpc_meta/{name}")) == {"ip_or_host_name": "127.0.0.1",
                                                                    "rpc_port": port}
    finally:
        engine.close()


@pytest.mark.parametrize("entry", [
    {"ip_or_host_name": "127.0.0.1", "rpc_port": 70000},  # no such port (not truncated to 4464)
    {"ip_or_host_name": "127.0.0.1", "rpc_port": 0},
    {"ip_or_host_name": "", "rpc_port": 1234},
])
def test_malformed_rpc_entries_are_replaced(any_service, entry):
    svc = any_service
    name = "127.0.0.1:32151"
    put(svc, f"mooncake/rpc_meta/{name}", json.dumps(entry))
    engine = TransferEngine()
    try:
        assert engine.initialize(name, url(svc), "tcp", "") == 0
        assert json.loads(svc.get(f"mooncake/rpc_meta/{name}"))["rpc_port"] == engine.get_rpc_port()
    finally:
        engine.close()


def test_redis_without_scripting_keeps_and_releases_keys():
    """Where Redis refuses EVAL (ACL -@scripting), keys are still kept alive past their TTL, taken over and
    removed, with WATCH/MULTI transactions instead."""
    with Redis() as redis:
        redis.scheme = "redis"
        assert redis._cli("ACL", "SETUSER", "default", "-@scripting") == "OK"
        assert redis._cli("EVAL", "return 1", "0").startswith("NOPERM")
        env = {"MC_METADATA_LEASE_TTL": str(TTL)}
        dead = EnginePeer(url(redis), "127.0.0.1:32161", 4096, env=env)
        dead.kill()
        peer = EnginePeer(url(redis), "127.0.0.1:32161", 4096, env=env)  # takes the dead one's name over
        try:
            time.sleep(TTL * 2.5)
            assert redis.get("mooncake/ram/127.0.0.1:32161") is not None
            assert json.loads(redis.get("mooncake/rpc_meta/127.0.0.1:32161"))["rpc_port"] == peer.info["rpc_port"]
            assert _reachable(redis, peer.segment, 4096) == peer.buffer
        finally:
            peer.close()
        assert not redis.keys()


# A same-named engine for the restart test: its buffer is engine-allocated (memfd-backed: same-host peers map
# it) or anonymous memory at a given address (0: anywhere), registered. Prints its segment, buffer and pid,
# then the sha256 of the first 4096 bytes for each line it reads.
_RESTARTED_CHILD = textwrap.dedent("""
    import ctypes, hashlib, json, mmap, os, sys
    from mooncake.engine import TransferEngine
    name, metadata, size, kind, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    e = TransferEngine()
    assert e.initialize(name, metadata, "tcp", "") == 0
    if kind == "managed":
        addr = e.allocate_managed_buffer(size)
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        MAP_FIXED_NOREPLACE = 0x100000
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_FIXED_NOREPLACE if at else 0)
        addr = libc.mmap(at or None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value) or (at and addr != at):
            print(json.dumps({"error": "address taken"}), flush=True)
            sys.exit(0)
        assert e.register_memory(addr, size) == 0
    print(json.dumps({"segment": e.get_local_segment_name(), "addr": addr, "pid": os.getpid()}), flush=True)
    for _ in sys.stdin:
        print(hashlib.sha256(bytes((ctypes.c_uint8 * 4096).from_address(addr))).hexdigest(), flush=True)
""")


class _Restarted:
    def __init__(self, name, metadata, size, kind, at=0):
        self.proc = subprocess.Popen([sys.executable, "-c", _RESTARTED_CHILD, name, metadata, str(size), kind,
                                      str(at)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        self.info = json.loads(self.proc.stdout.readline() or '{"error": "exited"}')

    def sha(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.mark.parametrize("kind,force_tcp", [("managed", False), ("anonymous", False), ("managed", True)],
                         ids=["memfd-mapping", "cross-memory-attach", "tcp"])
def test_a_replaced_peer_gets_the_data_never_its_dead_predecessor(kind, force_tcp):
    """A writer cached the descriptor (and, same-host, the mapping) of engine P; P is SIGKILLed (its HTTP
    metadata stays) and P' starts under the same name with a buffer at the same address. A write while only
    the dead P is published fails; once P' is published, a write reaches P'. Never a success into the dead
    process's memory."""
    http = _Http()
    name, size = "127.0.0.1:32171", 1 << 20
    saved = os.environ.get("MC_FORCE_TCP")
    os.environ["MC_FORCE_TCP"] = "1" if force_tcp else "0"
    writer = TransferEngine()
    try:
        assert writer.initialize("127.0.0.1:32172", url(http), "tcp", "") == 0
    finally:
        os.environ.pop("MC_FORCE_TCP") if saved is None else os.environ.update(MC_FORCE_TCP=saved)
    buf = np.zeros(4096, dtype=np.uint8)
    assert writer.register_memory(buf.ctypes.data, buf.nbytes) == 0
    old = _Restarted(name, url(http), size, kind)
    new = None
    try:
        addr = old.info["addr"]
        buf[:] = pattern(4096, 1)
        assert writer.transfer_sync_write(name, buf.ctypes.data, addr, 4096) == 0
        assert old.sha() == hashlib.sha256(buf).hexdigest()
        old.kill()
        assert http.get(f"mooncake/ram/{name}") is not None  # the dead engine is still published
        buf[:] = pattern(4096, 2)
        t0 = time.monotonic()
        assert writer.transfer_sync_write(name, buf.ctypes.data, addr, 4096) != 0  # nobody alive to take it
        assert time.monotonic() - t0 < 10
        new = _Restarted(name, url(http), size, "anonymous", at=addr)
        if "error" in new.info:
            pytest.skip(f"address {addr:#x} is taken in the restarted process")
        assert new.info["pid"] != old.info["pid"]
        buf[:] = pattern(4096, 3)
        assert writer.transfer_sync_write(name, buf.ctypes.data, addr, 4096) == 0
        assert new.sha() == hashlib.sha256(buf).hexdigest()
    finally:
        old.kill()
        if new:
            new.kill()
        writer.close()
        http.close()
