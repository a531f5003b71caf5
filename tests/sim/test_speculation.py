"""Grouped speculation in the simulator: adaptive budget, replayed suffix trees (lossless), fitted acceptance."""

from __future__ import annotations

import pytest

from seer.engine.request import Request
from seer.sampling_params import SamplingParams
from seer.sim.acceptance import AcceptanceModel, alpha_from_tau, expected_accept_len, paper_model
from seer.sim.cost_model import CostModel
from seer.sim.hardware import InstanceSpec, get_accelerator, get_model
from seer.sim.simulate import SimConfig, run_policy
from seer.sim.speculation import roofline_price
from seer.sim.workloads import trace_workload
from seer.spec.budget import DraftClass, plan_budget
from tests.sim.helpers import small_cluster, small_workload

COST = CostModel(InstanceSpec(get_accelerator("h800"), get_model("qwen2-vl-72b"), 8))


def reqs(n: int, ctx: int) -> list[Request]:
    out = []
    for i in range(n):
        r = Request(str(i), [1] * ctx, SamplingParams(max_tokens=100))
        r.num_computed_tokens = ctx - 1
        out.append(r)
    return out


def granted(n: int, ctx: int, alpha: float = 0.6) -> int:
    members = reqs(n, ctx)
    c = DraftClass([alpha ** j for j in range(1, 9)], members, float(n * ctx))
    return plan_budget([c], roofline_price(COST, 1, n, float(n * ctx)), float(n))


def test_tail_drafts_long_busy_batch_drafts_little() -> None:
    assert granted(2, 20000) == 2 * 8                      # memory-bound tail: full drafts
    busy = granted(1000, 200)
    assert busy < 1000                                      # compute-bound: speculation mostly off
    assert granted(4, 2000, alpha=0.0) == 0                 # never accepted: never drafted


def test_acceptance_model_inversion() -> None:
    a = alpha_from_tau(2.5, 8)
    assert expected_accept_len(a, 8) == pytest.approx(2.5)
    m = paper_model()
    assert m.alpha(0) < m.alpha(1) < m.alpha(5) < m.alpha(15) == m.alpha(100)
    with pytest.raises(ValueError):
        alpha_from_tau(10.0, 8)
    with pytest.raises(ValueError):
        AcceptanceModel("x", (1, 0), (0.1, 0.2))


def test_scaled_acceptance_scales_the_tokens_gained_per_verification() -> None:
    m = paper_model()
    assert m.scaled(1.0) is m
    half = m.scaled(0.5)
    for a, b in zip(m.alphas, half.alphas):
        assert expected_accept_len(b, 8) - 1 == pytest.approx(0.5 * (expected_accept_len(a, 8) - 1))
    with pytest.raises(ValueError, match="above the 9 possible"):
        m.scaled(10.0)
    with pytest.raises(ValueError, match="must be > 0"):
        m.scaled(0.0)


def test_accept_scale_moves_the_simulated_acceptance() -> None:
    cfg = SimConfig(quantum=16, chunk_tokens=128, acceptance="paper")
    full = run_policy(small_workload(), "seer", config=cfg).spec
    low = run_policy(small_workload(), "seer", config=SimConfig(quantum=16, chunk_tokens=128, acceptance="paper",
                                                                accept_scale=0.3)).spec
    assert 1.0 < low["tau"] < full["tau"]
    with pytest.raises(ValueError, match="accept_scale must be > 0"):
        SimConfig(accept_scale=-1.0)
    w = trace_workload("data/math_cot_groups.jsonl", small_cluster(kv_tokens=20000), limit=2, max_tokens=64)
    with pytest.raises(ValueError, match="replayed suffix trees"):
        run_policy(w, "seer", config=SimConfig(quantum=1, accept_scale=0.5))


def test_replayed_speculation_is_lossless_and_accepts() -> None:
    w = trace_workload("data/math_cot_groups.jsonl", small_cluster(kv_tokens=20000), limit=3, max_tokens=320)
    cfg = SimConfig(quantum=1, chunk_tokens=128)  # integrity checked at the end of each run
    base = run_policy(w, "context", config=cfg)
    spec = run_policy(w, "seer", config=cfg)
    assert [r.token_ids for r in spec.result.responses] == [r.token_ids for r in base.result.responses]
    assert spec.spec["tau"] > 1.5 and 0 < spec.spec["accept_rate"] <= 1
    assert spec.result.metrics.makespan_s < base.result.metrics.makespan_s


@pytest.mark.parametrize("quantum", [1, 16])
def test_model_speculation_counts(quantum: int) -> None:
    run = run_policy(small_workload(), "seer", config=SimConfig(quantum=quantum, chunk_tokens=128, check=True,
                                                               acceptance="paper"))
    s = run.spec
    assert s["drafted"] > 0 and 0 <= s["accepted"] <= s["drafted"] and 1.0 < s["tau"] < 9


def test_weighted_gains_send_drafts_to_the_critical_request() -> None:
    """A busy compute-bound batch: equal weights draft little; a straggler weighted up gets its drafts."""
    n, ctx, alpha = 1000, 200, 0.6
    gains = [alpha ** j for j in range(1, 9)]
    plain = DraftClass(list(gains), reqs(n, ctx), float(n * ctx))
    plan_budget([plain], roofline_price(COST, 1, n, float(n * ctx)), float(n))
    crowd = DraftClass(list(gains), reqs(n - 1, ctx), float((n - 1) * ctx))
    straggler = DraftClass([50.0 * g for g in gains], reqs(1, ctx), float(ctx))
    plan_budget([crowd, straggler], roofline_price(COST, 1, n, float(n * ctx)), (n - 1) + 50.0)
    assert straggler.granted >= 6 > plain.granted  # its tokens are worth 50x: it drafts long
    assert crowd.granted <= plain.granted


def test_model_speculator_weights_follow_remaining_hints() -> None:
    from seer.engine.block_manager import BlockManager
    from seer.engine.scheduler import Scheduler, SchedulerConfig
    from seer.sim.model_speculator import ModelSpeculator
    from seer.sim.speculation import SimSpecConfig

    spec = ModelSpeculator(SimSpecConfig(), paper_model(), COST)
    sched = Scheduler(SchedulerConfig(), BlockManager(100_000, 16))
    batch = reqs(1000, 200)
    for i, r in enumerate(batch):
        r.group_id = f"g{i % 125}"
        r.remaining_hint = 5000.0 if i == 0 else 100.0
        sched.running.append(r)
    spec.before_schedule(sched)
    assert len(batch[0].spec_token_ids) > max(len(r.spec_token_ids) for r in batch[1:])
