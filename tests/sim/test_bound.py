"""The rollout bound is one: on randomised workloads no simulated policy, drafting or not, ends below it when the
bound is priced by the same step cost and credited the best acceptance any policy of the run reached (the longest
response's own tokens per step for its term)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from seer.bench.rollout_bench import longest_acceptance
from seer.engine.config import EngineConfig
from seer.rollout.bound import fitted_bound
from seer.rollout.config import RolloutConfig
from seer.rollout.policies import get_policy
from seer.rollout.step_cost import LinearStepCost
from seer.sim.backend import SimBackend
from seer.sim.engine_prices import EnginePrices, FittedCost
from seer.sim.replay import profile_from_fit
from tests.sim.test_engine_parity import trace

POLICIES = ("verl", "seer", "seer-paper", "seer-nodraft", "oracle+critical")


def with_runaway(groups: list, length: int, repeat: bool) -> list:
    """Group 0's first response made ``length`` tokens long: its own text repeated (drafts from its own history
    accept well, better than its group's mean) or its siblings' text (drafts accept as the group's do)."""
    g = groups[0]
    forced = list(g.forced)
    source = forced[0] if repeat else [t for f in forced[1:] for t in f]
    forced[0] = tuple((source * (length // len(source) + 1))[:length])
    params = replace(g.params, max_tokens=length)
    return [replace(g, forced=tuple(forced), true_lengths=tuple(len(f) for f in forced), params=params),
            *[replace(h, params=params) for h in groups[1:]]]


@pytest.mark.parametrize("seed", range(6))
def test_no_simulated_policy_beats_the_bound(seed: int) -> None:
    fit = LinearStepCost(2e-3 * (1 + seed), 3e-4, 1e-4 * (1 + seed % 2), 2e-7)
    instances, blocks = 2 + seed % 2, 40 if seed < 2 else 200
    engine = EngineConfig(dtype="float32", block_size=4, num_kv_blocks=blocks, max_num_seqs=8,
                          max_num_batched_tokens=64)
    config = RolloutConfig(instances=instances, chunk_tokens=8 * (1 + seed % 3), engine=engine)
    groups = trace(groups=5 + seed, seed=seed)
    if seed >= 2:  # a runaway response: the longest response's term of the bound decides
        groups = with_runaway(groups, 400, repeat=seed % 2 == 1)
    cost = FittedCost(EnginePrices(fit, 100, kv_s_per_byte=1e-9, draft_s_per_request=1e-4))
    results = {}
    for name in POLICIES:
        backend = SimBackend(config, cost, profile_from_fit(fit), max_model_len=512, check=True)
        results[name] = backend.run(get_policy(name), groups, config.chunk_tokens, False, None)
    responses = results["verl"].responses
    longest = max(responses, key=lambda r: len(r.token_ids))
    specs = [r.stats["spec"] for r in results.values() if "spec" in r.stats]
    tau = max(s["tau"] for s in specs)
    longest_tau = longest_acceptance(results, longest)  # its own tokens per step, not its group's tau
    shapes = [(len(groups[r.group_id].prompt_token_ids), len(r.token_ids)) for r in responses]
    bound = fitted_bound(shapes, instances, fit, tau=tau, longest_tau=longest_tau,
                         max_tokens_per_seq=1 + config.spec.gamma_max, kv_tokens=blocks * 4,
                         max_seqs=engine.max_num_seqs)
    assert tau > 1.2  # siblings alike: drafting pays, so the bound's credit matters
    for name, result in results.items():
        assert result.metrics.makespan_s >= bound.bound_s, (name, result.metrics.makespan_s, bound)
