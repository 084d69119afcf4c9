"""Seeded fuzzing of a store client's disk-replica service (DiskServer, fast_rpc framing) in a real store
process with an SSD tier: random, mutated and oversized frames while other connections announce the largest
frame and never finish it; after each batch a reader must still get a disk replica, and the process's memory
must stay bounded."""

import struct
import time

import pytest

from mooncake.store.client.disk_serve import _MAX_FRAME
from mooncake.store.client.testing import StoreWorker
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.common.fast_rpc import FastRpcClient
from mooncake.store.master.testing import MasterProcess
from mooncake.store.proto import mooncake_master_pb2 as pb
from mooncake.testing.listener_fuzz import Stalled, exchange, fuzz_batches, mutate

METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["DiskReplicaService"].methods]
READ, RELEASE = METHODS.index("ReadDiskObject"), METHODS.index("ReleaseDiskObject")


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    master = MasterProcess()
    worker = StoreWorker(master.address, segment="16MB", buffer="8MB", ssd=str(tmp_path_factory.mktemp("ssd")))
    try:
        assert worker.call("put", "on-disk", b"d" * 4096) == 0
        deadline = time.monotonic() + 20
        while not worker.request({"op": "flush_disk"})["done"] and time.monotonic() < deadline:
            time.sleep(0.05)
        disk = [d for d in worker.request({"op": "descs", "key": "on-disk"})["descs"] if d["local_disk"]]
        assert disk, "the object was not persisted"
        host, _, port = disk[0]["endpoint"].rpartition(":")
        yield worker, (host.strip("[]"), int(port))
    finally:
        worker.stop()
        master.stop()


def test_disk_replica_service(owner):
    worker, addr = owner
    reader = FastRpcClient(*addr, timeout=10, service="DiskReplicaService")

    def still_serves():
        reply = reader.call("ReadDiskObject", pb.DiskReadRequest(key="on-disk"))
        assert reply.code == 0 and reply.size == 4096, reply
        assert reader.call("ReleaseDiskObject", pb.DiskReleaseRequest(handle=reply.handle)).code == 0

    def case(rng):
        read = pb.DiskReadRequest(key=rng.choice(["on-disk", "nope", "nope", "", "é", "x" * rng.randint(0, 70000)]),
                                  seq=rng.choice((0, 1, 2**63))).SerializeToString()
        release = pb.DiskReleaseRequest(handle=rng.randrange(1 << 32)).SerializeToString()
        index, payload = rng.choice(((READ, read), (RELEASE, release)))
        frame = struct.pack("<IH", len(payload), index) + payload
        kind = rng.randrange(4)
        if kind == 0:
            data = rng.randbytes(rng.randint(1, 64))
        elif kind == 1:
            data = frame if rng.random() < 0.3 else mutate(rng, frame, 80000)
        elif kind == 2:
            junk = rng.randbytes(rng.randint(0, 100))
            data = struct.pack("<IH", len(junk), rng.randrange(8)) + junk
        else:
            data = struct.pack("<IH", rng.choice((_MAX_FRAME, _MAX_FRAME + 1, 1 << 31)), index) + payload[:8]
        exchange(addr, data, timeout=0.5)

    try:
        with Stalled(addr, struct.pack("<IH", _MAX_FRAME, READ), 16):
            for seed in (1, 2):
                assert fuzz_batches(seed, 6, 40, case, still_serves, worker.proc.pid, 64 << 10, 15) >= 40
        still_serves()
        assert reader.call("ReleaseDiskObject", pb.DiskReleaseRequest(handle=1 << 40)).code == E.INVALID_PARAMS
    finally:
        reader.close()
