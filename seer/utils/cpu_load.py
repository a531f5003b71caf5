"""What else used this machine's CPUs while a benchmark ran, so a report says whether its timings were taken alone.

Why: on a machine of a few cores every step time depends on what runs beside it. A second benchmark on the other
core shares the memory bandwidth and the last-level cache, and nothing makes it slow every policy alike. A report
cannot show that from its own figures, so each policy's row records the CPUs that processes outside the benchmark
kept busy while it ran (``others_cpus``: their CPU seconds over the wall seconds), and the bench warns when that is
not near zero. On a virtual machine the hypervisor's steal time (other guests running on these cores) is recorded
beside it: it slows every step and no process here can see it otherwise.

The benchmark is this process and its descendants (the local and Ray backends' instance processes), so their
time is never counted as another's. Linux only (``/proc``); elsewhere ``sample`` and ``LoadMeter.load`` are None.
Torch-free.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")
OTHERS_WARN_CPUS = 0.1  # mean CPUs others kept busy above which a policy's timings are flagged


@dataclass(frozen=True)
class CpuTimes:
    """Counters at one moment, in seconds: the machine's busy and steal time summed over its CPUs, and the CPU
    time of this process tree."""

    wall: float
    busy: float
    steal: float
    tree: float


@dataclass(frozen=True)
class MachineLoad:
    """Between two ``CpuTimes``: the mean CPUs other processes kept busy, and those the hypervisor stole."""

    others_cpus: float
    steal_cpus: float
    cpus: int
    wall_s: float

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def warning(self, what: str) -> str | None:
        """A line for the user where others took enough CPU to skew ``what``'s timings, else None."""
        if self.others_cpus < OTHERS_WARN_CPUS:
            return None
        return (f"warning: other processes kept {self.others_cpus:.2f} of {self.cpus} CPUs busy while {what} ran; "
                f"its timings are not comparable with a run alone (run benchmarks with nothing else on the machine)")


def parse_stat(text: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy, steal) seconds from ``/proc/stat``'s aggregate ``cpu`` line: user, nice, system, irq and softirq are
    busy (guest time is inside user); idle and iowait are not."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [float(v) for v in fields[1:]] + [0.0] * 8
            user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
            return (user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


def _stat_fields(pid: str) -> list[str] | None:
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:  # the process ended while the table was read
        return None
    return text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces and parentheses


def tree_cpu_s(root: int, ticks_per_s: float) -> float:
    """CPU seconds of ``root`` and every descendant (user and system, their reaped children's included)."""
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])  # fields from state on: state, ppid, ..., utime at 11 .. cstime at 14
        spent[pid] = sum(float(v) for v in fields[11:15]) / ticks_per_s
    inside = {root}
    for pid in parent:
        chain, p = [], pid
        while p in parent and p not in inside and p > 1:
            chain.append(p)
            p = parent[p]
        if p in inside:
            inside.update(chain)
    return sum(spent.get(pid, 0.0) for pid in inside)


def sample() -> CpuTimes | None:
    """The counters now; None where ``/proc`` does not exist."""
    if not (PROC / "stat").is_file():
        return None
    ticks = float(os.sysconf("SC_CLK_TCK"))
    busy, steal = parse_stat((PROC / "stat").read_text(), ticks)
    return CpuTimes(time.monotonic(), busy, steal, tree_cpu_s(os.getpid(), ticks))


def load_between(start: CpuTimes, end: CpuTimes, cpus: int) -> MachineLoad:
    """The load of the interval from ``start`` to ``end`` (never negative: counters tick coarsely)."""
    wall = max(end.wall - start.wall, 1e-9)
    others = (end.busy - start.busy) - (end.tree - start.tree)
    return MachineLoad(max(others, 0.0) / wall, max(end.steal - start.steal, 0.0) / wall, cpus, wall)


class LoadMeter:
    """``with LoadMeter() as m: ...`` then ``m.load``: the machine's load over the block (None off Linux)."""

    def __init__(self) -> None:
        self.load: MachineLoad | None = None
        self._start: CpuTimes | None = None

    def __enter__(self) -> LoadMeter:
        self._start = sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = sample()
        if self._start is not None and end is not None:
            self.load = load_between(self._start, end, os.cpu_count() or 1)
