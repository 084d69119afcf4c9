from mooncake.store.master.eviction import object_bytes, select_victims
from mooncake.store.master.objects import ObjectTable
from mooncake.store.master.segments import Replica, Segment

SEG = Segment("s", "h", 0x1000, 1 << 20, "", "tcp", "c")


def table(n, size=1000):
    t = ObjectTable()
    for i in range(n):
        t.objects[f"k{i}"] = Replica(SEG, i * 1024, size)
    return t


def test_lru_order_and_target():
    t = table(5)
    t.touch("k0")
    victims, freed = select_victims(t, now=0.0, target=2048, allow_soft_pinned=True)
    assert victims == ["k1", "k2"] and freed == 2048  # 1000 B rounds to 1024 B
    assert select_victims(t, 0.0, 0, True) == ([], 0)


def test_skips_leased_hard_pinned_busy_and_takes_soft_pinned_last():
    t = table(6)
    t.leases["k0"] = 10.0  # live
    t.leases["k1"] = 1.0  # expired at now=5
    t.hard_pins.add("k2")
    t.busy["k3"] = object()
    t.soft_pins["k4"] = 10.0
    victims, _ = select_victims(t, now=5.0, target=10 << 20, allow_soft_pinned=True)
    assert victims == ["k1", "k5", "k4"]
    victims, _ = select_victims(t, now=5.0, target=10 << 20, allow_soft_pinned=False)
    assert victims == ["k1", "k5"]
    t.soft_pins["k4"] = 4.0  # expired pin: an ordinary candidate again, in LRU order
    assert select_victims(t, now=5.0, target=10 << 20, allow_soft_pinned=False)[0] == ["k1", "k4", "k5"]


def test_object_bytes_counts_every_replica():
    assert object_bytes((Replica(SEG, 0, 100), Replica(SEG, 128, 100))) == 256
