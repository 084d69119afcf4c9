"""The chaos soak: engines and store clients on two hosts doing verified transfers, puts and gets while a
seeded chaos loop SIGKILLs store clients, restarts the master, SIGSTOPs processes and flaps and slows the link;
invariants are checked every second and once more at the end.

Invariants (each breach is one violation in the report; a correct system has none):
  bad bytes     a read returned bytes other than were written (store checksum or transfer compare)
  hang          a call took longer than its bound (HANG_S; time its own process was stopped excused), or a
                process that is not stopped printed nothing for HANG_S
  died          a process the chaos did not kill exited
  stuck keys    puts still in progress at the master PUT_DISCARD_S + 10 s after the load stopped
  memory        a process's private memory (RssAnon) grew past 2x its first sample + MEMORY_SLACK
  not serving   a surviving process could not do one more verified round trip at the end, or the master
                does not answer
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time

from .cluster import Hosts, Master, Proc, child_env

HANG_S = 30.0  # the bound of any one call (RPC timeouts are 5 s, transfers MC_TRANSFER_TIMEOUT=5 s + retries)
PUT_DISCARD_S = 5
MEMORY_SLACK = 256 << 20
WORKER_ENV = {"MC_TRANSFER_TIMEOUT": "5", "MC_RPC_TIMEOUT_MS": "5000", "MC_RPC_CONNECT_TIMEOUT_MS": "3000",
              "MC_TCP_STALL_TIMEOUT_MS": "1000", "MC_TCP_PROBE_INTERVAL_MS": "200", "MC_LOG_LEVEL": "ERROR"}
MASTER_FLAGS = ["--log_level=ERROR", "--client_ttl=3", "--default_kv_lease_ttl=1000",
                f"--put_start_discard_timeout_sec={PUT_DISCARD_S}"]
FAULTS = ("kill_client", "restart_master", "pause", "flap_link", "slow_link")


@dataclasses.dataclass
class Report:
    seconds: float
    namespaces: bool
    why_no_namespaces: str = ""
    ops: dict = dataclasses.field(default_factory=dict)  # op -> [ok, failed]
    bytes: dict = dataclasses.field(default_factory=dict)  # put / get / transfer -> bytes
    faults: dict = dataclasses.field(default_factory=dict)  # kind -> count
    violations: list = dataclasses.field(default_factory=list)  # (kind, detail)
    memory: dict = dataclasses.field(default_factory=dict)  # role -> [peak VmRSS, peak RssAnon] bytes
    processes: int = 0

    def table(self) -> str:
        from mooncake.tools.common import format_table, human_bytes

        where = "two network-namespace hosts" if self.namespaces else \
            f"loopback only ({self.why_no_namespaces}; no link faults)"
        parts = [f"mooncake soak: {self.seconds:.0f} s on {where}, {self.processes} processes", "",
                 format_table(("OPERATION", "OK", "FAILED"), [(op, f"{ok:,}", f"{bad:,}") for op, (ok, bad)
                                                                in sorted(self.ops.items())]), "",
                 format_table(("BYTES", "TOTAL"), [(k, human_bytes(v)) for k, v in sorted(self.bytes.items())]), "",
                 format_table(("FAULT", "INJECTED"), [(k, self.faults.get(k, 0)) for k in FAULTS]), "",
                 format_table(("PROCESS", "PEAK RSS", "PEAK PRIVATE"),
                              [(k, human_bytes(r), human_bytes(a)) for k, (r, a) in sorted(self.memory.items())]),
                 "", f"VIOLATIONS: {len(self.violations)}"]
        parts += [f"  {kind}: {detail}" for kind, detail in self.violations[:50]]
        return "\n".join(parts) + "\n"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Soak:
    def __init__(self, seconds: float, seed: int, use_netns: bool = True, log=None) -> None:
        self.seconds, self.rng = seconds, random.Random(seed)
        self.seed = seed
        self.log = log or (lambda msg: None)
        self.hosts = Hosts(use_netns)
        self.report = Report(seconds, self.hosts.namespaces, self.hosts.why_not or "")
        self.procs: list[Proc] = []  # every instance ever started
        self.gone: dict = {}  # cumulative ops/bytes of instances that were killed
        self.n = 0
        self.master: Master | None = None

    # -- processes --------------------------------------------------------------------------------------------
    def _worker(self, name: str, role: str, host: int, *flags: str) -> Proc:
        self.n += 1
        cmd = self.hosts.prefix(host) + [sys.executable, "-m", "mooncake.tools.soak.worker", "--mode", role,
                                         "--hostname", self.hosts.ip(host), "--seed", str(self.seed * 1000 + self.n),
                                         "--hang_s", str(HANG_S), *flags]
        p = Proc(name, role, cmd, child_env(WORKER_ENV))
        self.procs.append(p)
        return p

    def _store(self, name: str, host: int, segment: str) -> Proc:
        return self._worker(name, "store", host, "--master", self.master.address, "--prefix",
                            f"{name.replace('#', '-')}.{self.seed}", "--segment", segment)

    def live(self, role: str | None = None) -> list[Proc]:
        return [p for p in self.procs if not p.killed and (role is None or p.role == role)]

    def violation(self, kind: str, detail: str) -> None:
        self.log(f"VIOLATION {kind}: {detail}")
        self.report.violations.append((kind, detail))

    # -- invariants -------------------------------------------------------------------------------------------
    def check(self) -> None:
        now = time.monotonic()
        for p in self.procs:
            with p.lock:
                bad, slow, p.new_bad, p.new_slow = p.new_bad, p.new_slow, [], []
                silent = now - p.last_line
            for key in bad:
                self.violation("bad bytes", f"{p.name}: {key}")
            for call in slow:
                excused = p.paused_during(call["start"], call["end"])
                if call["seconds"] - excused > HANG_S:
                    self.violation("hang", f"{p.name}: {call['op']} took {call['seconds']} s "
                                   f"({excused:.1f} s of it stopped)")
            if p.killed or p.finished:
                continue
            if not p.alive():
                p.killed = True  # report once
                self.violation("died", f"{p.name} exited with {p.proc.returncode}: {p.stderr_tail()[-500:]}")
                continue
            if not p.paused and silent > HANG_S:
                self.violation("hang", f"{p.name} silent for {silent:.0f} s")
                with p.lock:
                    p.last_line = now
            self._memory(p.name, p.pid, p)
        if self.master is not None and self.master.proc.poll() is None:
            self._memory("master", self.master.pid, self.master)

    def _memory(self, name: str, pid: int, holder) -> None:
        """Peak VmRSS and RssAnon per role; a violation when private memory (RssAnon) grew past 2x its first
        sample + MEMORY_SLACK (shared segments are not growth: their size is fixed)."""
        from .worker import memory

        rss, anon = memory(pid)
        if not rss:
            return
        if not holder.rss_first:
            holder.rss_first = anon
        key = name.split("#")[0]
        peak = self.report.memory.setdefault(key, [0, 0])
        peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
        if anon > 2 * holder.rss_first + MEMORY_SLACK:
            self.violation("memory", f"{name}: private memory {anon >> 20} MiB, first {holder.rss_first >> 20} MiB")
            holder.rss_first = anon  # one report per doubling

    # -- chaos ------------------------------------------------------------------------------------------------
    def fault(self) -> None:
        kinds = [k for k in FAULTS if self.hosts.namespaces or k not in ("flap_link", "slow_link")]
        kind = self.rng.choice(kinds)
        self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        if kind == "kill_client":
            victims = [p for p in self.live("store") if p.name.startswith("pool")]
            p = self.rng.choice(victims)
            self.log(f"fault: SIGKILL {p.name}")
            p.kill()
            base, host, segment = p.name.split("#")[0], 0 if "h0" in p.name else 1, "32MB"
            time.sleep(self.rng.uniform(0.2, 1.0))
            self._store(f"{base}#{self.n + 1}", host, segment).wait_ready(90)
        elif kind == "restart_master":
            self.log("fault: SIGKILL the master, start it again")
            self.master.kill()
            time.sleep(self.rng.uniform(0.2, 1.0))
            self.master.start()
        elif kind == "pause":
            targets = self.live()
            p = self.rng.choice(targets)
            pause = self.rng.uniform(0.5, 4.0)
            self.log(f"fault: SIGSTOP {p.name} for {pause:.1f} s")
            p.pause()
            time.sleep(pause)
            p.resume()
        elif kind == "flap_link":
            down = self.rng.uniform(0.5, 3.0)
            self.log(f"fault: link down for {down:.1f} s")
            self.hosts.set_link(False)
            time.sleep(down)
            self.hosts.set_link(True)
        else:
            rate, how_long = self.rng.choice((2, 8, 20)), self.rng.uniform(2.0, 5.0)
            self.log(f"fault: link at {rate} Mbit/s for {how_long:.1f} s")
            self.hosts.slow_link(rate)
            time.sleep(how_long)
            self.hosts.slow_link(None)

    # -- the run ----------------------------------------------------------------------------------------------
    def run(self) -> Report:
        try:
            self.master = Master(self.hosts, MASTER_FLAGS)
            engines = [self._worker(f"engine-h{i}", "engine", i) for i in (0, 1)]
            stores = [self._store(f"pool-h{i}#{self.n + 1}", i, "32MB") for i in (0, 1)]
            stores.append(self._store(f"app-h1#{self.n + 1}", 1, "8MB"))
            readies = [p.wait_ready(90) for p in engines]
            for p, peer in zip(engines, reversed(readies)):
                p.send({"cmd": "peer", "segment": peer["segment"], "buffer": peer["buffer"]})
            for p in stores:
                p.wait_ready(90)
            self.report.processes = 1 + len(self.procs)
            end = time.monotonic() + self.seconds
            chaos_end = end - 10  # the last 10 s without faults: everything recovers before the final checks
            next_fault = time.monotonic() + self.rng.uniform(3, 6)
            while time.monotonic() < end:
                self.check()
                if time.monotonic() >= next_fault and time.monotonic() < chaos_end:
                    self.fault()
                    next_fault = time.monotonic() + self.rng.uniform(2, 5)
                time.sleep(0.5)
            self.finish()
            self.report.processes = 1 + len(self.procs)
            return self.report
        finally:
            for p in self.procs:
                p.close()
            if self.master is not None:
                self.master.close()
            self.hosts.close()

    def finish(self) -> None:
        survivors = self.live()
        for p in survivors:
            p.send({"cmd": "final"})
        for p in survivors:
            if not p.final_event.wait(60):
                self.violation("not serving", f"{p.name}: no final answer ({p.stderr_tail()[-300:]})")
            elif not p.final["ok"]:
                self.violation("not serving", f"{p.name}: {p.final['detail']}")
        self.check()
        for p in survivors:
            p.finished = True  # from now on an exit is expected
            p.send({"cmd": "exit"})
        for p in survivors:
            try:
                p.proc.wait(30)
            except Exception:  # noqa: BLE001  (a process that does not exit is killed by close())
                self.violation("hang", f"{p.name} did not exit within 30 s of 'exit'")
        for p in self.procs:
            for op, (ok, bad) in p.latest.get("ops", {}).items():
                c = self.report.ops.setdefault(op, [0, 0])
                c[0] += ok
                c[1] += bad
            for kind, n in p.latest.get("bytes", {}).items():
                self.report.bytes[kind] = self.report.bytes.get(kind, 0) + n
        deadline = time.monotonic() + PUT_DISCARD_S + 10
        pending, status = None, None
        while time.monotonic() < deadline:
            try:
                status = self.master.status()
            except (OSError, ValueError) as e:
                status, pending = None, f"master does not answer: {e}"
                time.sleep(1)
                continue
            pending = status["pending_puts"]
            if pending == 0:
                break
            time.sleep(1)
        if status is None:
            self.violation("not serving", str(pending))
        elif pending:
            self.violation("stuck keys", f"{pending} puts still in progress {PUT_DISCARD_S + 10} s after the load")


def run_soak(seconds: float, seed: int = 1, use_netns: bool = True, log=None) -> Report:
    return Soak(seconds, seed, use_netns, log).run()
