import random

from mooncake.store.master.errors import ErrorCode
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
