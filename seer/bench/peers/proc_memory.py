"""Peak memory of a process tree, sampled from /proc (stdlib only).

Why a sampler and not getrusage: vLLM runs its engine core and worker in child processes, so the memory of "the
vLLM peer" is the sum over a process tree, and getrusage(RUSAGE_CHILDREN) only reports the largest single
descendant. We poll the tree and keep two peaks:
- rss: the sum of RSS over the tree (what `ps` shows; counts pages shared between the processes once per process,
  so it overstates a multi-process engine),
- pss: the sum of PSS (each shared page split among its sharers; the fairest single figure for a tree).
For a single process (Seer, the HF peer) the two differ only by pages shared with other processes.

The sampler must not perturb what it measures on a 2-core box: RSS comes from /proc/PID/statm (microseconds),
the tree is re-scanned every couple of seconds, and PSS, which needs /proc/PID/smaps_rollup (tens of ms for a
multi-GB process: the kernel walks its page tables), is read only every `pss_interval_s` and at window edges.
Measured: polling smaps_rollup of a vLLM tree five times a second took ~60% of a core.

This file imports only the standard library: the vLLM peer script, which runs in another venv, imports it by
file name from its own directory.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass
class MemoryPeak:
    """Peaks in MiB seen since the last reset."""

    rss_mb: float = 0.0
    pss_mb: float = 0.0
    samples: int = 0

    def as_dict(self) -> dict[str, float]:
        return {"peak_rss_mb": round(self.rss_mb, 1), "peak_pss_mb": round(self.pss_mb, 1), "samples": self.samples}


def _children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/*/stat (works without CONFIG_PROC_CHILDREN)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may contain spaces and parentheses: the ppid is the 2nd field after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree_pids(root: int) -> list[int]:
    """`root` and all its live descendants."""
    children = _children_map()
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, ()))
    return pids


def rss_kb(pid: int) -> int:
    """Resident set size of one process in KiB (cheap: /proc/PID/statm); 0 if it is gone."""
    try:
        return int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def pss_kb(pid: int) -> int:
    """Proportional set size of one process in KiB (costly: smaps_rollup); 0 if it is gone or unreadable."""
    try:
        for line in (_PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


class TreeMemorySampler:
    """Background thread that polls the memory of the tree under `root_pid` and keeps the peaks.

    Use as a context manager; `reset()` starts a new peak window (e.g. per benchmark case) and returns the
    peaks of the window it closes.
    """

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.5, pss_interval_s: float = 10.0,
                 rescan_interval_s: float = 2.0) -> None:
        if min(interval_s, pss_interval_s, rescan_interval_s) <= 0:
            raise ValueError("sampling intervals must be positive")
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.interval_s = interval_s
        self.pss_interval_s = pss_interval_s
        self.rescan_interval_s = rescan_interval_s
        self._pids: list[int] = []
        self._last_scan = self._last_pss = float("-inf")
        self._peak = MemoryPeak()
        self._overall = MemoryPeak()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, with_pss: bool | None = None) -> None:
        """Take one sample now (PSS too when due, or when `with_pss`) and fold it into the peaks."""
        now = time.monotonic()
        if now - self._last_scan >= self.rescan_interval_s or with_pss:
            self._pids, self._last_scan = tree_pids(self.root_pid), now
        rss = sum(rss_kb(p) for p in self._pids) / 1024.0
        pss = None
        if with_pss or (with_pss is None and now - self._last_pss >= self.pss_interval_s):
            pss, self._last_pss = sum(pss_kb(p) for p in self._pids) / 1024.0, now
        with self._lock:
            for peak in (self._peak, self._overall):
                peak.rss_mb = max(peak.rss_mb, rss)
                peak.pss_mb = max(peak.pss_mb, pss) if pss is not None else peak.pss_mb
                peak.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> "TreeMemorySampler":
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.sample(with_pss=True)
        self._thread = threading.Thread(target=self._run, name="tree-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> MemoryPeak:
        """Stop polling (after one last sample) and return the overall peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample(with_pss=True)
        return self.overall

    def reset(self) -> MemoryPeak:
        """Close the current window (with a last full sample): return its peaks and start a new one."""
        self.sample(with_pss=True)
        with self._lock:
            closed, self._peak = self._peak, MemoryPeak()
        return closed

    @property
    def window(self) -> MemoryPeak:
        with self._lock:
            return MemoryPeak(self._peak.rss_mb, self._peak.pss_mb, self._peak.samples)

    @property
    def overall(self) -> MemoryPeak:
        with self._lock:
            return MemoryPeak(self._overall.rss_mb, self._overall.pss_mb, self._overall.samples)

    def __enter__(self) -> "TreeMemorySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
