"""``setup(..., engine)`` with the 8th positional a TransferEngine's ``get_engine()`` handle (SGLang's shared
engine): the store uses that engine (its name, registrations and transports), memory its owner registered
works with the zero-copy calls, the owner's own transfers keep working beside the store's, and close undoes
only what the store did to the engine."""

import numpy as np
import pytest

from mooncake.engine import InnerTransferEngine, TransferEngine, owner_of
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store.client.testing import local_store
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.testing import MasterProcess

MiB = 1 << 20
NOT_REGISTERED = -3  # Transfer Engine: no registration starts at the address


@pytest.fixture(scope="module")
def master():
    m = MasterProcess("--default_kv_lease_ttl=300")
    yield m
    m.stop()


def _engine():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


def test_handles_name_their_engine():
    e = _engine()
    h = e.get_engine()
    assert isinstance(h, InnerTransferEngine) and owner_of(h) is e and owner_of(e.get_engine()) is e
    assert owner_of(object()) is None and owner_of(None) is None
    e.close()


def test_store_shares_the_engine_its_registrations_and_transports(master):
    engine = _engine()
    name = engine.get_local_segment_name()
    peer = _engine()  # another process's engine, reached by the owner's own transfers
    peer_buf = np.zeros(MiB, dtype=np.uint8)
    assert peer.register_memory(peer_buf.ctypes.data, peer_buf.nbytes) == 0
    kv = np.zeros(4 * MiB, dtype=np.uint8)  # e.g. a KV pool the owner registered for its PD transfers
    assert engine.register_memory(kv.ctypes.data, kv.nbytes) == 0

    store = MooncakeDistributedStore()  # SGLang's 8 positionals, then its keywords
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "tcp", "", master.address,
                       engine.get_engine(), enable_ssd_offload=False, ssd_offload_path="", tenant_id="default") == 0
    try:
        assert store.get_hostname() == name
        assert store.register_buffer(kv.ctypes.data, kv.nbytes) == 0  # the owner's registration, shared
        kv[:MiB] = np.random.default_rng(1).integers(0, 256, MiB, dtype=np.uint8)
        assert store.batch_put_from(["a", "b"], [kv.ctypes.data, kv.ctypes.data + 4096], [4096, 8192]) == [0, 0]
        assert store.batch_get_into(["b", "a"], [kv.ctypes.data + MiB, kv.ctypes.data + 2 * MiB],
                                    [8192, 4096]) == [8192, 4096]
        assert (kv[MiB:MiB + 8192] == kv[4096:12288]).all() and (kv[2 * MiB:2 * MiB + 4096] == kv[:4096]).all()
        mine = np.zeros(MiB, dtype=np.uint8)  # registered by the store: the owner's transfers may use it
        assert store.register_buffer(mine.ctypes.data, mine.nbytes) == 0
        mine[:] = 7
        peer_name, peer_addr = peer.get_local_segment_name(), peer_buf.ctypes.data
        assert engine.transfer_sync_write(peer_name, mine.ctypes.data, peer_addr, MiB) == 0
        assert (peer_buf == 7).all()
        with local_store(master.address) as other:  # another client reads what lives in the shared segment
            here = ReplicateConfig(preferred_segment=store.get_hostname())
            assert store.put("here", b"shared segment" * 100, here) == 0
            assert store.get_replica_desc("here")[0].segment_name == name
            assert other.get("here") == b"shared segment" * 100
            assert other.put("there", b"v" * 5000, ReplicateConfig(preferred_segment=other.get_hostname())) == 0
            assert store.get("there") == b"v" * 5000  # the shared engine's transports read it
            assert store.unregister_buffer(kv.ctypes.data) == 0  # the owner's: not unregistered
            assert store.remove_all(force=True) >= 0
        second = MooncakeDistributedStore()  # one store per engine
        assert second.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master.address, engine) == \
            E.INVALID_PARAMS
    finally:
        assert store.close() == 0
    # the engine lives on: the owner's registration kept, the store's undone, its transfers work
    assert engine.get_local_segment_name() == name
    assert engine.transfer_sync_write(peer_name, kv.ctypes.data, peer_addr, 4096) == 0
    assert engine.unregister_memory(mine.ctypes.data) == NOT_REGISTERED
    assert engine.unregister_memory(kv.ctypes.data) == 0
    again = MooncakeDistributedStore()  # the engine can be shared again (the TransferEngine itself works too)
    assert again.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MiB, 4 * MiB, "tcp", "", master.address, engine) == 0
    assert again.put("again", b"x") == 0 and again.get("again") == b"x"
    again.remove_all(force=True)
    again.close()
    engine.close()
    peer.close()


def test_engines_that_cannot_be_shared(master):
    s = MooncakeDistributedStore()
    args = ("127.0.0.1", "P2PHANDSHAKE", 8 * MiB, 4 * MiB, "tcp", "", master.address)
    for bad in (12345, "engine", object()):
        with pytest.raises(TypeError, match="engine"):
            s.setup(*args, bad)
    e = _engine()
    with pytest.raises(TypeError, match="get_engine"):
        s.setup(*args, e.get_engine_ptr())  # an address, not the handle
    never = TransferEngine()  # not initialized
    assert s.setup(*args, never) == E.INVALID_PARAMS and s.setup(*args, never.get_engine()) == E.INVALID_PARAMS
    e.close()
    assert s.setup(*args, e) == E.INVALID_PARAMS  # closed
    assert s.setup(*args, None) == 0  # None: the store's own engine, as without the argument
    s.close()
