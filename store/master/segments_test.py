import random

from mooncake.store.common.errors import ErrorCode
from mooncake.store.master.segments import SegmentRegistry

MiB = 1 << 20


def _registry(strategy="random"):
    return SegmentRegistry(strategy, random.Random(3))


def test_mount_validation_and_idempotence():
    r = _registry()
    assert r.mount("c1", "s1", "h:1", 0x1000, MiB)[0] == ErrorCode.OK
    assert r.mount("c1", "s1", "h:1", 0x1000, MiB)[0] == ErrorCode.OK  # same again
    assert r.capacity == MiB and len(r) == 1
    assert r.mount("c1", "s1", "h:1", 0x1000, 2 * MiB)[0] == ErrorCode.SEGMENT_ALREADY_EXISTS
    assert r.mount("c2", "s1", "h:1", 0x1000, MiB)[0] == ErrorCode.SEGMENT_ALREADY_EXISTS
    for bad in [("", "s", "h", 1, MiB), ("c", "", "h", 1, MiB), ("c", "s", "", 1, MiB), ("c", "s", "h", 0, MiB),
                ("c", "s", "h", 1, 0), ("c", "s", "h", (1 << 64) - 10, MiB)]:
        assert r.mount(*bad)[0] == ErrorCode.INVALID_PARAMS, bad
    # overlapping range under the same segment name
    assert r.mount("c1", "s2", "h:1", 0x1000 + MiB // 2, MiB)[0] == ErrorCode.INVALID_PARAMS
    assert r.mount("c1", "s2", "h:1", 0x1000 + MiB, MiB)[0] == ErrorCode.OK


def test_replicas_land_on_distinct_segments_preferring_distinct_names():
    r = _registry()
    r.mount("a", "a1", "host-a", 0x10000, MiB)
    r.mount("a", "a2", "host-a", 0x10000 + MiB, MiB)
    r.mount("b", "b1", "host-b", 0x10000, MiB)
    for _ in range(20):
        reps = r.allocate(4096, 2)
        assert len({x.segment.id for x in reps}) == 2
        assert {x.segment.name for x in reps} == {"host-a", "host-b"}
    reps = r.allocate(4096, 3)
    assert len({x.segment.id for x in reps}) == 3
    assert len(r.allocate(4096, 5)) == 3  # best effort: only three segments


def test_preferred_segment_first_then_random_spread():
    r = _registry()
    for i in range(4):
        r.mount(f"c{i}", f"s{i}", f"h{i}", 0x1000, MiB)
    assert all(r.allocate(1024, 1, preferred=("h2",))[0].segment.name == "h2" for _ in range(10))
    names = {r.allocate(1024, 1)[0].segment.name for _ in range(40)}
    assert len(names) >= 3  # random start spreads load
    # preferred segment full: fall back elsewhere
    while r.allocate(64 * 1024, 1, preferred=("h1",))[0].segment.name == "h1":
        pass
    assert r.allocate(64 * 1024, 1, preferred=("h1",))[0].segment.name != "h1"


def test_free_ratio_first_picks_emptiest():
    r = _registry("free_ratio_first")
    r.mount("a", "a", "a", 0x1000, MiB)
    r.mount("b", "b", "b", 0x1000, MiB)
    r.allocate(MiB // 2, 1, preferred=("a",))
    assert all(r.allocate(1024, 1)[0].segment.name == "b" for _ in range(10))


def test_used_bytes_and_unmount():
    r = _registry()
    r.mount("a", "a", "a", 0x1000, MiB)
    reps = r.allocate(1000, 1)
    assert r.used == 1024
    seg = r.unmount("a")
    assert seg is not None and not seg.mounted and r.used == 0 and r.capacity == 0
    r.release(reps[0])  # no-op after unmount
    assert r.unmount("a") is None
    assert r.allocate(10, 1) == []
    assert r.of_client("a") == [] and r.by_name("a") == []


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_remount_soon_after_start_is_held_back():
    from mooncake.store.master.segments import REMOUNT_HOLD_SEC
    clock = _Clock()
    r = SegmentRegistry("random", random.Random(3), clock, lease_ttl=5.0)
    assert r.mount("a", "a1", "host-a", 0x1000, MiB, remount=True)[0] == ErrorCode.OK  # memory from before
    assert r.mount("b", "b1", "host-b", 0x1000, MiB)[0] == ErrorCode.OK  # a fresh setup: new memory
    assert {x.segment.id for _ in range(20) for x in r.allocate(1024, 1)} == {"b1"}
    assert r.allocate(1024, 1, preferred=("host-a",))[0].segment.id == "b1"
    assert r.allocate_on("host-a", 1024) is None
    clock.t += REMOUNT_HOLD_SEC
    assert r.allocate(1024, 1, preferred=("host-a",))[0].segment.id == "a1"
    # Long after the start a remount is a client this master expired or never knew: not held for that.
    assert r.mount("c", "c1", "host-c", 0x1000, MiB, remount=True)[0] == ErrorCode.OK
    assert r.allocate(1024, 1, preferred=("host-c",))[0].segment.id == "c1"


def test_segment_back_after_unmount_waits_for_the_old_leases():
    clock = _Clock()
    r = SegmentRegistry("random", random.Random(3), clock, lease_ttl=5.0)
    clock.t += 60  # well past the start hold
    r.mount("a", "a1", "host-a", 0x1000, MiB)
    r.allocate(1024, 1)
    r.unmount("a1")  # e.g. its client expired: readers may hold leases on what was there
    clock.t += 1
    assert r.mount("a", "a1", "host-a", 0x1000, MiB, remount=True)[0] == ErrorCode.OK
    assert r.allocate(1024, 1) == []
    clock.t += 4
    assert r.allocate(1024, 1)[0].segment.id == "a1"
    r.unmount("a1")
    clock.t += 5  # the leases ran out meanwhile
    r.mount("a", "a1", "host-a", 0x1000, MiB, remount=True)
    assert r.allocate(1024, 1)[0].segment.id == "a1"


def test_same_name_other_client_is_another_instance():
    r = _registry()
    assert r.mount("old", "s1", "h:1", 0x1000, MiB)[0] == ErrorCode.OK
    assert r.mount("old", "s2", "h:1", 0x1000 + MiB, MiB)[0] == ErrorCode.OK
    assert r.mount("other", "o1", "h:2", 0x1000, MiB)[0] == ErrorCode.OK
    # A restarted process under the old name: its own address space, so an overlapping range is fine.
    code, new = r.mount("new", "n1", "h:1", 0x1000, MiB)
    assert code == ErrorCode.OK
    assert sorted(s.id for s in r.superseded_by(new)) == ["s1", "s2"]
    assert r.superseded_by(r.get("o1")) == []
    assert r.mount("new", "n2", "h:1", 0x1000 + MiB // 2, MiB)[0] == ErrorCode.INVALID_PARAMS  # same process


def test_master_drops_a_dead_instance_when_its_name_is_mounted_again():
    from mooncake.store.master.service import MasterService, SegmentSpec
    svc = MasterService()
    assert svc.mount_segment("old", SegmentSpec("s-old", "h:1", 0x100000, MiB)) == ErrorCode.OK
    assert svc.put_start("w", "k", 4096)[0] == ErrorCode.OK and svc.put_end("w", "k") == ErrorCode.OK
    assert svc.put_start("w", "pending", 4096)[0] == ErrorCode.OK
    assert svc.mount_segment("new", SegmentSpec("s-new", "h:1", 0x100000, MiB)) == ErrorCode.OK
    assert [s.id for s in svc.segments.all()] == ["s-new"]
    assert svc.get_replica_list("k")[0] == ErrorCode.OBJECT_NOT_FOUND  # its bytes died with the old process
    assert svc.put_end("w", "pending") != ErrorCode.OK
    code, reps = svc.put_start("w", "k2", 4096)
    assert code == ErrorCode.OK and [r.segment.id for r in reps] == ["s-new"]
