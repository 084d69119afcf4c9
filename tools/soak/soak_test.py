"""The chaos soak for 3 minutes (runner.py): no violation, and the chaos really happened. The report table is
kept as a test artifact (TEST_UNDECLARED_OUTPUTS_DIR). Longer: `mooncake soak --seconds 3600` (README.md)."""

import os

from mooncake.testing import netns
from mooncake.tools.soak.runner import FAULTS, run_soak


def test_three_minutes_of_chaos_break_no_invariant():
    lines = []
    report = run_soak(float(os.environ.get("MC_SOAK_SECONDS", 180)), seed=3, log=lines.append)
    table = report.table()
    out = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if out:
        with open(os.path.join(out, "soak_report.txt"), "w") as f:
            f.write(table + "\n" + "\n".join(lines) + "\n")
    print(table)
    assert report.violations == [], table
    assert report.namespaces == (netns.available() is None)
    kinds = [k for k in FAULTS if report.namespaces or k not in ("flap_link", "slow_link")]
    assert sum(report.faults.values()) >= 20, table
    assert all(report.faults.get(k, 0) >= 1 for k in kinds), table  # every kind of fault was injected
    for op in ("put", "get", "transfer_write", "transfer_read"):
        assert report.ops[op][0] > 100, table  # the load kept going through the chaos
    assert report.bytes["transfer"] > 100 << 20 and report.bytes["put"] > 10 << 20, table


def test_a_stopped_process_is_not_a_hang():
    """The runner excuses the time a process was SIGSTOPped from its slow calls (cluster.Proc)."""
    from mooncake.tools.soak.cluster import Proc

    p = Proc.__new__(Proc)
    import threading

    p.lock = threading.Lock()
    p.pauses = [[100.0, 130.0], [200.0, float("inf")]]
    assert p.paused_during(90.0, 140.0) == 30.0
    assert p.paused_during(140.0, 190.0) == 0.0
    assert p.paused_during(195.0, 205.0) == 5.0
