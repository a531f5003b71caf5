"""keep_freed_memory: a step's big temporaries stop page-faulting once it is applied (checked in fresh processes,
since the setting is process-wide)."""

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
from seer.utils.malloc import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "tune" else False
x = torch.randn(256, 49152)  # batch-256 logits: 50 MB, above glibc's largest mmap threshold

def step():
    return float((x * 2.0).exp()[0, 0])  # two more 50 MB temporaries, freed at once

for _ in range(30):  # the heap settles into the step's pattern
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


def faults_per_step(mode: str, **env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True,
                         timeout=120, env={**os.environ, **env}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_memory_is_reused_without_page_faults():
    applied, faults = faults_per_step("plain")
    assert applied == "False" and faults > 10_000  # every 4 KB page of both temporaries, every step
    applied, faults = faults_per_step("tune")
    assert applied == "True" and faults < 500


def test_opt_out_leaves_the_allocator_alone():
    applied, faults = faults_per_step("tune", SEER_MALLOC_TUNE="0")
    assert applied == "False"


TRIM = """
import torch
from seer.utils.malloc import keep_freed_memory, release_freed_memory
keep_freed_memory()

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

x = [torch.ones(2**18) for _ in range(300)]  # 300 MB in 1 MB pieces
del x
kept = rss_mb()
release_freed_memory()
print(kept, rss_mb())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_released_memory_goes_back_to_the_system():
    """Closed engines' memory must not stay with the process (a benchmark's next sample checks what is free)."""
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True, timeout=120)
    kept, after = (int(v) for v in out.stdout.split())
    assert kept - after > 250
