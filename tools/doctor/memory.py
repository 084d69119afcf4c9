"""Memory: the locked-memory limit against the bytes to register, and huge pages.

RDMA (and EFA) registration pins pages: ``RLIMIT_MEMLOCK`` must cover every segment and buffer a process
registers, or registration fails with ENOMEM. TCP and same-host copies pin nothing.
"""

from __future__ import annotations

from .report import FAIL, INFO, OK, WARN, Config, Finding, Host

PINNING_PROTOCOLS = ("rdma", "efa")


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def memlock_limit(host: Host) -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes (-1: unlimited) from /proc/self/limits; None when unreadable."""
    text = host.read("/proc/self/limits") or ""
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            return -1 if soft == "unlimited" else int(soft)
    return None


def check(host: Host, cfg: Config) -> list[Finding]:
    findings = []
    limit = memlock_limit(host)
    pins = cfg.protocol in PINNING_PROTOCOLS
    need = cfg.segment_size
    if limit is None:
        findings.append(Finding("memory", "memlock", WARN if pins else INFO, "RLIMIT_MEMLOCK unreadable "
                                "(/proc/self/limits)", "check `ulimit -l`" if pins else ""))
    elif limit == -1:
        findings.append(Finding("memory", "memlock", OK, "unlimited", data={"limit": -1, "needed": need}))
    elif limit >= need or not pins:
        findings.append(Finding("memory", "memlock", OK if limit >= need else INFO,
                                f"{human(limit)} (segment {human(need)}"
                                + ("" if pins else f"; --protocol {cfg.protocol} pins nothing") + ")",
                                data={"limit": limit, "needed": need}))
    else:
        findings.append(Finding("memory", "memlock", FAIL, f"{human(limit)} < segment {human(need)}: "
                                "registration will fail with ENOMEM",
                                "raise it: `ulimit -l unlimited` (limits.conf memlock, systemd LimitMEMLOCK=, "
                                "docker --ulimit memlock=-1)", data={"limit": limit, "needed": need}))
    total = host.read("/proc/sys/vm/nr_hugepages")
    meminfo = {}
    for line in (host.read("/proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        meminfo[key.strip()] = value.strip()
    size = meminfo.get("Hugepagesize", "?")
    free = meminfo.get("HugePages_Free", "?")
    thp = host.read("/sys/kernel/mm/transparent_hugepage/enabled") or "?"
    thp_mode = thp[thp.find("[") + 1:thp.find("]")] if "[" in thp else thp
    findings.append(Finding("memory", "huge pages", INFO,
                            f"{total or 0} reserved of {size} ({free} free), transparent huge pages: {thp_mode}",
                            data={"nr_hugepages": int(total) if total and total.isdigit() else None,
                                  "size": size, "free": free, "thp": thp_mode}))
    return findings
