"""Key patterns (RE2): classic ReDoS patterns cost linear time, refused patterns say why, and the master's
regex calls match outside its lock (other calls go on meanwhile)."""

import random
import threading
import time

import pytest

from mooncake.store.master.config import MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.master.key_pattern import MAX_PATTERN_BYTES, KeyPattern
from mooncake.store.master.service import MasterService, SegmentSpec

# Patterns that backtrack exponentially in a backtracking engine on a run of "a" (or words) without a match.
REDOS = ["(a+)+$", "(a|aa)+$", "(a|a?)+$", "(a*)*b", "(.*a){12}$", "^(([a-z])+.)+[A-Z]([a-z])+$",
         "(\\w+\\s?)+$", "(x+x+)+y", "^(a+)+$", "(a|b|ab)*c"]


def test_redos_patterns_cost_linear_time():
    keys = ["a" * n + "!" for n in (30, 1000, 60_000)] + ["aaaa aaaa " * 6000 + "!"]
    t0 = time.monotonic()
    for p in REDOS:
        rx = KeyPattern(p)
        for k in keys:
            rx.search(k)
    assert time.monotonic() - t0 < 5.0  # a backtracking engine needs ~2**30 steps for the first key alone


@pytest.mark.parametrize("pattern,why", [
    ("(a)\\1", "invalid escape"),
    ("(?=a)b", "invalid perl operator"),
    ("(?<!a)b", "invalid perl operator"),
    ("a{1001}", "repetition"),
    ("((a{100}){100}){100}", "repetition"),
    ("(", "missing \\)"),
    ("x" * (MAX_PATTERN_BYTES + 1), f"at most {MAX_PATTERN_BYTES}"),
    ("é" * (MAX_PATTERN_BYTES // 2 + 1), "bytes"),
    ("\ud800", "Unicode"),
    (b"^a", "must be a str"),
    (None, "must be a str"),
])
def test_refused_patterns_say_why(pattern, why):
    with pytest.raises(ValueError, match=why):
        KeyPattern(pattern)


def test_search_semantics():
    assert KeyPattern("b/").search("a/b/c") and not KeyPattern("^b/").search("a/b/c")
    assert KeyPattern("^k[0-9]+$").search("k12") and not KeyPattern("^k[0-9]+$").search("k12x")
    assert KeyPattern("").search("anything") and KeyPattern("é$").search("café")
    assert KeyPattern("(?i)ABC").search("xabcx") and KeyPattern("x" * MAX_PATTERN_BYTES).search("x" * 5000)
    assert KeyPattern("^.$").search("é")  # a character, not a byte
    assert not KeyPattern("a.b").search("a\nb")  # as Python's re without DOTALL


def _service(keys):
    svc = MasterService(MasterConfig(client_ttl_sec=1e6), rng=random.Random(1))
    assert svc.mount_segment("c", SegmentSpec("s", "seg", 0x100000, 1 << 40)) == E.OK
    for i in range(0, len(keys), 4096):
        batch = keys[i:i + 4096]
        assert all(code == E.OK for code, _ in svc.batch_put_start("w", batch, [64] * len(batch)))
        assert all(code == E.OK for code in svc.batch_put_end("w", batch))
    return svc


def _within(seconds, fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"{fn.__name__}{args} still running after {seconds} s"
    return out[0]


def test_service_regex_calls_survive_redos_patterns():
    svc = _service(["a" * 40 + "!", "aaa", "b" * 100])
    for p in REDOS:
        code, found = _within(5, svc.get_replica_list_by_regex, p)
        assert code == E.OK, p
    assert sorted(_within(5, svc.get_replica_list_by_regex, "^(a+)+$")[1]) == ["aaa"]
    assert _within(5, svc.remove_by_regex, "(a+)+$", True) == (E.OK, 1)
    assert svc.exist("aaa") == (E.OK, False) and svc.exist("a" * 40 + "!") == (E.OK, True)
    assert svc.get_replica_list_by_regex("(a)\\1") == (E.INVALID_PARAMS, {})
    assert svc.remove_by_regex("x" * (MAX_PATTERN_BYTES + 1)) == (E.INVALID_PARAMS, 0)


def test_regex_scan_lets_other_calls_through():
    """The key list is matched outside the service lock: calls of other clients during a scan of 100k keys
    wait for a chunk at most (the whole scan took the lock for ~0.3 s before)."""
    keys = [f"scan/{i:07d}/" + "x" * 40 for i in range(100_000)]
    svc = _service(keys)
    done = threading.Event()
    scans = []

    def scan():
        try:
            while not done.is_set():
                t0 = time.monotonic()
                code, found = svc.get_replica_list_by_regex("^scan/[0-9]+/x+$")
                scans.append((code, len(found), time.monotonic() - t0))
                n = svc.remove_by_regex("^nothing-matches-(a+)+$")
                assert n == (E.OK, 0)
        finally:
            done.set()

    t = threading.Thread(target=scan, daemon=True)
    t.start()
    worst = 0.0
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not done.is_set():
        t0 = time.monotonic()
        assert svc.exist(keys[7]) == (E.OK, True)
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.001)
    done.set()
    t.join(30)
    assert scans and all(code == E.OK and n == len(keys) for code, n, _ in scans)
    slowest_scan = max(s for _, _, s in scans)
    # Relative to the scan, not absolute: on a loaded 2-core machine a 1 ms call can wait 100 ms for the GIL.
    assert worst < slowest_scan / 3, (worst, slowest_scan)
