"""The chaos matrix (``seer bench faults``) on the tiny model: an instance killed mid-step, mid-eviction,
mid-import, during a weight update or between rollouts loses and duplicates nothing, and tokens equal a
fault-free greedy run. The local-process cells spawn workers (a few seconds each); Ray's are slow."""

import pytest

from seer.bench.faults_bench import POINTS, Cell, matrix_config, run_matrix

CONFIG = matrix_config()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return str(tiny_model_dir("qwen2", 3))


def _assert_all_ok(cells: list[Cell]) -> None:
    bad = [f"{c.backend}/{c.point}: {c.problems}" for c in cells if not c.ok]
    assert not bad, "\n".join(bad)


def test_in_process_cells(tiny):
    cells = run_matrix(tiny, ["inprocess"], list(POINTS), CONFIG)
    _assert_all_ok(cells)
    fired = {c.point: c.failed_instances for c in cells}
    assert fired["step"] == fired["evict"] == fired["import"] == 1
    assert [bool(c.skipped) for c in cells] == [False, False, False, True, True]  # no process to kill


def test_local_process_cells(tiny):
    _assert_all_ok(run_matrix(tiny, ["local"], list(POINTS), CONFIG))


@pytest.mark.slow
def test_ray_cells(tiny, local_ray):
    _assert_all_ok(run_matrix(tiny, ["ray"], list(POINTS), CONFIG))
