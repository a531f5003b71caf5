"""Keep freed heap memory in the engine process (glibc), so the big tensors of every step stop page-faulting.

Why: a decode step at batch 256 allocates ~100 MB of short-lived tensors (the logits in bf16 and in float32,
the sampler's passes over them). glibc serves each allocation above its mmap threshold (32 MB at most) with a
fresh mmap and unmaps it on free, so every step touches those pages anew: ~24,000 page faults a step in bf16 at
batch 252 on a 2-core AMD EPYC. Serving every allocation from the heap and never trimming it lets the next step
reuse the pages (vLLM preloads tcmalloc into its CPU workers for the same reason); the cost is that the process
keeps its peak heap, which was the same peak here. Measured back to back on the engine benchmark's workload
(benchmarks/README.md): bf16 fixed 1,135.6 -> 1,469.4 tok/s, bf16 sampled 977.1 -> 1,068.5, but fp32 fixed
650.3 -> 621.3 with 7,298 -> 77 faults a step, for a reason not found; so the engine applies it in bf16 only.
Process-wide, hence applied once; ``SEER_MALLOC_TUNE=0`` leaves the allocator alone.
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
