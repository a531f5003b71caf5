"""Peak memory of a process tree, sampled from /proc (stdlib only).

Why a sampler and not getrusage: vLLM runs its engine core and worker in child processes, so the memory of "the
vLLM peer" is the sum over a process tree, and getrusage(RUSAGE_CHILDREN) only reports the largest single
descendant. We poll the tree and keep two peaks:
- rss: the sum of RSS over the tree (what `ps` shows; counts pages shared between the processes once per process,
  so it overstates a multi-process engine),
- pss: the sum of PSS (each shared page split among its sharers; the fairest single figure for a tree).
For a single process (Seer, the HF peer) the two differ only by pages shared with other processes.

This file imports only the standard library: the vLLM peer script, which runs in another venv, imports it by
file name from its own directory.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


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


def rss_pss_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB from smaps_rollup; (0, 0) if it is gone or unreadable."""
    rss = pss = 0
    try:
        for line in (_PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return rss, pss


def tree_memory_mb(root: int) -> tuple[float, float]:
    """Current (RSS sum, PSS sum) of the tree under `root`, in MiB."""
    rss = pss = 0
    for pid in tree_pids(root):
        r, p = rss_pss_kb(pid)
        rss += r
        pss += p
    return rss / 1024.0, pss / 1024.0


class TreeMemorySampler:
    """Background thread that polls the memory of the tree under `root_pid` and keeps the peaks.

    Use as a context manager; `reset()` starts a new peak window (e.g. per benchmark case) and returns the
    peaks of the window it closes.
    """

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.2) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.interval_s = interval_s
        self._peak = MemoryPeak()
        self._overall = MemoryPeak()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one sample now and fold it into the peaks."""
        rss, pss = tree_memory_mb(self.root_pid)
        with self._lock:
            for peak in (self._peak, self._overall):
                peak.rss_mb = max(peak.rss_mb, rss)
                peak.pss_mb = max(peak.pss_mb, pss)
                peak.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> "TreeMemorySampler":
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.sample()
        self._thread = threading.Thread(target=self._run, name="tree-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> MemoryPeak:
        """Stop polling (after one last sample) and return the overall peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.overall

    def reset(self) -> MemoryPeak:
        """Close the current window: return its peaks and start a new one."""
        self.sample()
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
