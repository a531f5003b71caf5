"""How much CPU other processes took while a benchmark ran (stdlib only, from /proc).

Why: on a shared 2-core machine another job running at the same time can halve a throughput figure, and
OpenMP barriers make oversubscription far worse than proportional. Each measured window therefore records the
average number of cores used by the measured process tree and by everything else, so a contaminated figure is
visible in the JSON instead of silently wrong; `wait_for_quiet` lets a runner start only when the box is idle.

Like proc_memory.py, this file imports only the standard library (the vLLM peer imports it by file name).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from .proc_memory import tree_pids
except ImportError:  # loaded by file name from the vLLM peer script, outside the seer package
    from proc_memory import tree_pids  # type: ignore[import-not-found,no-redef]

_PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def system_busy_s() -> float:
    """CPU seconds spent busy (not idle/iowait), summed over all cores, since boot."""
    fields = [int(x) for x in (_PROC / "stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest time is already included in user/nice.
    return (sum(fields[:8]) - idle) * _TICK_S


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of `pid` and of its children it has waited for; 0 if gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) * _TICK_S


def tree_cpu_s(root: int) -> float:
    """CPU seconds of the live tree under `root` (plus children those processes reaped)."""
    return sum(process_cpu_s(pid) for pid in tree_pids(root))


@dataclass
class CpuWindow:
    """CPU use over a wall-clock window: the measured tree vs everything else, in average cores."""

    root_pid: int
    _t0: float = 0.0
    _busy0: float = 0.0
    _own0: float = 0.0

    def start(self) -> "CpuWindow":
        self._t0, self._busy0, self._own0 = time.perf_counter(), system_busy_s(), tree_cpu_s(self.root_pid)
        return self

    def stop(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        busy = system_busy_s() - self._busy0
        own = tree_cpu_s(self.root_pid) - self._own0
        return {
            "own_cpu_cores": round(own / wall, 2),
            "other_cpu_cores": round(max(busy - own, 0.0) / wall, 2),
        }


def other_cores_now(root_pid: int, window_s: float = 2.0) -> float:
    """Average cores used by processes outside `root_pid`'s tree over the next `window_s` seconds."""
    window = CpuWindow(root_pid).start()
    time.sleep(window_s)
    return window.stop()["other_cpu_cores"]


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.25, window_s: float = 2.0) -> dict[str, float]:
    """Wait (up to `max_wait_s`) until other processes use under `threshold_cores`; report what was seen."""
    start = time.perf_counter()
    other = other_cores_now(os.getpid(), window_s)
    while other >= threshold_cores and time.perf_counter() - start < max_wait_s:
        other = other_cores_now(os.getpid(), window_s)
    return {"waited_s": round(time.perf_counter() - start, 1), "other_cpu_cores_at_start": other}
