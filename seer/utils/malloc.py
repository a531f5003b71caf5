"""Keep freed heap memory in the engine process (glibc), so the big tensors of every step stop page-faulting.

Why: a decode step at batch 256 allocates ~100 MB of short-lived tensors (the logits in bf16 and in float32,
the sampler's passes over them). glibc serves each allocation above its mmap threshold (32 MB at most) with a
fresh mmap and unmaps it on free, so every step faults those pages in anew. Serving every allocation from the
heap and never trimming it lets the next step reuse the pages (vLLM preloads tcmalloc into its CPU workers for
the same reason); the cost is that the process keeps its peak heap. The CPU engine applies it in every dtype
(benchmarks/README.md, "Keeping freed heap memory"). Process-wide, hence applied once; ``SEER_MALLOC_TUNE=0``
leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Turn off glibc's mmap for large allocations and heap trimming, once per process. True when in effect;
    False on other C libraries or with ``SEER_MALLOC_TUNE=0``."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("SEER_MALLOC_TUNE", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        _applied = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError) as e:
        log.info("glibc mallopt unavailable, allocator left as it is: %s", e)
    return _applied


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim) where ``keep_freed_memory`` is in
    effect: a process that closed its engines would otherwise keep their memory, and the next rollout's capacity
    check in it (a benchmark's next sample), or any other process, would find that memory taken."""
    if not _applied:
        return
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError) as e:
        log.info("glibc malloc_trim unavailable: %s", e)
