"""The record of what else used the CPUs while a benchmark ran: /proc/stat parsing, the interval arithmetic, the
warning, and that the benchmark's own child processes count as its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seer.utils.cpu_load import OTHERS_WARN_CPUS, CpuTimes, LoadMeter, load_between, parse_stat, tree_cpu_s

LINUX = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc")


def test_parse_stat_counts_busy_and_steal_apart() -> None:
    text = "cpu  100 50 30 1000 20 5 5 7 3 0\ncpu0 1 1 1 1 1 1 1 1 0 0\nintr 1\n"
    busy, steal = parse_stat(text, ticks_per_s=100.0)
    assert busy == pytest.approx((100 + 50 + 30 + 5 + 5) / 100) and steal == pytest.approx(0.07)
    with pytest.raises(ValueError, match="aggregate 'cpu' line"):
        parse_stat("cpu0 1 2 3\n", 100.0)


def test_others_are_the_machine_busy_time_less_the_benchmarks_own() -> None:
    start, end = CpuTimes(10.0, 100.0, 1.0, 5.0), CpuTimes(12.0, 103.5, 1.5, 6.0)
    load = load_between(start, end, cpus=2)
    assert load.others_cpus == pytest.approx((3.5 - 1.0) / 2) and load.steal_cpus == pytest.approx(0.25)
    assert load.wall_s == pytest.approx(2.0)
    warning = load.warning("verl")
    assert warning is not None and "1.25 of 2 CPUs" in warning and "verl" in warning
    quiet = load_between(start, CpuTimes(12.0, 100.1, 1.0, 6.0), cpus=2)  # coarse ticks: never negative
    assert quiet.others_cpus == 0.0 and quiet.others_cpus < OTHERS_WARN_CPUS and quiet.warning("verl") is None
    assert set(quiet.to_dict()) == {"others_cpus", "steal_cpus", "cpus", "wall_s"}


@LINUX
def test_a_child_process_counts_as_the_benchmarks_own() -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    before = tree_cpu_s(os.getpid(), float(os.sysconf("SC_CLK_TCK")))
    with LoadMeter() as meter:
        subprocess.run([sys.executable, "-c", spin], check=True)
    after = tree_cpu_s(os.getpid(), float(os.sysconf("SC_CLK_TCK")))
    assert after - before >= 0.25  # the reaped child's CPU time is in its parent's
    assert meter.load is not None and meter.load.cpus == os.cpu_count() and meter.load.wall_s >= 0.3
