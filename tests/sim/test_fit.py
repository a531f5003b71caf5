"""The baseline fit: analytic re-timing of a zero-overhead veRL run equals a real rerun; bisection."""

from __future__ import annotations

import pytest

from seer.sim.cost_model import CostConstants
from seer.sim.fit import BaselineProbe, pattern_search
from seer.sim.simulate import SimConfig, run_policy
from tests.sim.helpers import small_workload


def test_overhead_retiming_is_exact() -> None:
    w = small_workload(kv_tokens=3000)
    cfg = SimConfig(quantum=4, record=False)
    probe = BaselineProbe.from_run(run_policy(w, "verl", constants=CostConstants(step_overhead_s=0.0), config=cfg), 4)
    rerun = run_policy(w, "verl", constants=CostConstants(step_overhead_s=0.02), config=cfg).result.metrics
    total, tail = probe.total_tail(0.02)
    assert total == pytest.approx(rerun.makespan_s) and tail == pytest.approx(rerun.tail_s)
    o = probe.overhead_for_total(rerun.makespan_s)
    assert o == pytest.approx(0.02, rel=1e-6)
    assert probe.preemptions == rerun.preemptions


def test_pattern_search_finds_the_minimum() -> None:
    calls = []

    def bowl(x: tuple[float, ...]) -> float:
        calls.append(x)
        return (x[0] - 0.3) ** 2 + 4 * (x[1] + 0.2) ** 2

    grid = [(a, b) for a in (-1.0, 0.0, 1.0) for b in (-1.0, 0.0, 1.0)]
    best = pattern_search(bowl, grid, [(-1.0, 1.0), (-1.0, 1.0)], [0.5, 0.5], evals=40)
    assert best == pytest.approx((0.3, -0.2), abs=0.05)
    assert len(calls) <= 9 + 40
    inf = pattern_search(lambda x: float("inf") if x[0] > 0 else -x[0], [(-1.0,), (1.0,)], [(-1.0, 1.0)], [0.5], 10)
    assert inf[0] <= 0
