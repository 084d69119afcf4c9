"""Dummy clients (``setup_dummy``) of a real ``mooncake_client`` process on its --port: they join the store the
service serves without a segment of their own, their objects land in its pool and outlive them, their memory
pool serves alloc_from_mem_pool; bad addresses, absent or foreign services and wrong types are refused."""

import socket
import subprocess
import sys

import numpy as np
import pytest

from mooncake.store import MooncakeDistributedStore
from mooncake.store.client.testing import local_store
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess, child_env, read_line, stop_process

MiB = 1 << 20


class Service:
    """`python -m mooncake.store.client.service` with a 32 MiB pool; `port`: its --port as bound."""

    def __init__(self, master, *flags):
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake.store.client.service", "--master_server_address",
                                      master.address, "--global_segment_size", "32MB", "--log_level", "WARNING",
                                      *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env())
        banner = read_line(self.proc, 30).split()
        assert banner[:3] == ["mooncake_client", "ready:", "segment"], banner
        self.segment, self.port = banner[3], int(banner[banner.index("port") + 1])

    def stop(self):
        return stop_process(self.proc, 10)


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def service(master):
    s = Service(master, "--port", "0")
    yield s
    s.stop()


def _dummy(service, pool="8MB"):
    d = MooncakeDistributedStore()
    assert d.setup_dummy(pool, 4 * MiB, f"127.0.0.1:{service.port}") == 0
    return d


def test_dummy_puts_land_in_the_pool_and_outlive_the_dummy(service):
    d = _dummy(service)
    try:
        assert d.get_hostname() and d.get_hostname() != service.segment
        value = bytes(range(256)) * 1000
        assert d.put("dummy/bytes", value) == 0 and d.get("dummy/bytes") == value
        assert [r.segment_name for r in d.get_replica_desc("dummy/bytes")] == [service.segment]
        # memory of the dummy's pool: registered, usable with every zero-copy call
        a, b = d.alloc_from_mem_pool(MiB), d.alloc_from_mem_pool(MiB)
        assert a and b and abs(a - b) >= MiB
        src = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * MiB).from_address(a))
        src[:] = np.arange(MiB, dtype=np.uint64).astype(np.uint8)
        assert d.batch_put_from(["dummy/z0", "dummy/z1"], [a, a + 4096], [4096, 8192]) == [0, 0]
        assert d.batch_get_into(["dummy/z1", "dummy/z0"], [b, b + 8192], [8192, 4096]) == [8192, 4096]
        dst = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (3 * 4096)).from_address(b))
        assert (dst[:8192] == src[4096:12288]).all() and (dst[8192:] == src[:4096]).all()
        assert d.alloc_from_mem_pool(16 * MiB) == 0 and d.alloc_from_mem_pool(0) == 0  # more than the pool
    finally:
        assert d.close() == 0
    again = _dummy(service)  # a restarted inference process finds what the last one put
    try:
        assert again.get("dummy/bytes") == value and again.batch_is_exist(["dummy/z0", "dummy/z1"]) == [1, 1]
        assert again.remove_all(force=True) >= 3
    finally:
        again.close()


def test_setup_dummy_refusals(master, service, caplog):
    d = MooncakeDistributedStore()
    for address in ("127.0.0.1", "127.0.0.1:x", ":50052", "127.0.0.1:70000"):
        assert d.setup_dummy("8MB", "4MB", address) == E.INVALID_PARAMS, address
    assert d.setup_dummy("50%", "4MB", f"127.0.0.1:{service.port}") == E.INVALID_PARAMS
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert d.setup_dummy("8MB", "4MB", f"127.0.0.1:{free}") == E.RPC_FAIL  # nothing listens
    assert "no mooncake_client at" in caplog.text
    assert d.setup_dummy("8MB", "4MB", master.address) in (E.RPC_FAIL, E.RPC_TIMEOUT)  # gRPC, not a service
    for args in ((None, "4MB", "h:1"), ("8MB", [], "h:1"), ("8MB", "4MB", 50052)):
        with pytest.raises(TypeError, match="setup_dummy"):
            d.setup_dummy(*args)
    assert d.health_check() == 1 and d.put("k", b"v") < 0  # nothing was set up
    assert d.alloc_from_mem_pool(4096) == 0
    with local_store(master.address) as s:
        assert s.alloc_from_mem_pool(4096) == 0  # setup(): no memory pool
        assert s.setup_dummy("8MB", "4MB", f"127.0.0.1:{service.port}") == E.UNAVAILABLE_IN_CURRENT_STATUS


def test_service_port_flag(master, service):
    proc = subprocess.Popen([sys.executable, "-m", "mooncake.store.client.service", "--master_server_address",
                             master.address, "--global_segment_size", "8MB", "--port", str(service.port),
                             "--log_level", "ERROR"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and f"cannot listen on --port {service.port}" in err, err
    default = Service(master)  # Mooncake's default port (this test has its own network namespace)
    try:
        assert default.port == 50052
        d = MooncakeDistributedStore()
        assert d.setup_dummy(0, "4MB", "127.0.0.1:50052") == 0  # no pool: zero-copy needs register_buffer
        assert d.put("via-default-port", b"x") == 0 and d.alloc_from_mem_pool(1) == 0
        d.remove_all(force=True)
        d.close()
    finally:
        default.stop()
