"""Adaptive draft length on synthetic cost tables: flat cost speculates long, linear cost at large B turns off."""

from __future__ import annotations

import pytest

from seer.engine.profiler import context_costs
from seer.spec.policy import AcceptanceTracker, PolicyConfig, PolicyRequest, SpecPolicy, VerifyCostModel, t_sd

BATCHES = [1, 4, 16, 64, 256]
TOKENS = [1, 2, 4, 8, 9, 16]


def flat() -> VerifyCostModel:
    return VerifyCostModel(BATCHES, TOKENS, [[0.02] * len(TOKENS) for _ in BATCHES])


def memory_then_compute() -> VerifyCostModel:
    """Memory bound (flat) at small B, compute bound (linear in all tokens) at large B."""
    return VerifyCostModel(BATCHES, TOKENS, [[max(0.02, 1e-4 * b * n) for n in TOKENS] for b in BATCHES])


def test_interpolation_and_profile_round_trip() -> None:
    cost = VerifyCostModel([1, 3], [1, 5], [[1.0, 2.0], [3.0, 6.0]], draft_s_per_request=1e-4)
    assert cost.step_time(1, 1) == 1.0 and cost.step_time(2, 3) == pytest.approx(3.0)
    assert cost.step_time(5, 1) == pytest.approx(5.0)  # linear extrapolation
    assert cost.draft_time(10) == pytest.approx(1e-3)
    again = VerifyCostModel.from_profile(cost.to_profile())
    assert again.step_time(2.5, 4) == pytest.approx(cost.step_time(2.5, 4))


def test_context_costs_split_the_read_from_the_pairs() -> None:
    """A plain step pays one read and one pair per extra context token, a 9-token verify one read and nine."""
    read, pair = context_costs([1.0, 1.1, 1.3], [1.3, 1.5, 2.1], 100, 600)
    assert pair == pytest.approx((0.8 - 0.3) / 8 / 500) and read == pytest.approx(0.3 / 500 - pair)
    assert context_costs([1.0, 1.1, 1.3], [1.0, 1.1, 1.2], 100, 600) == (0.0, 0.0)  # noise never makes it cheaper
    assert context_costs([1.0, 1.1, 1.3], [1.5, 1.6, 1.8], 100, 600) == (pytest.approx(0.001), 0.0)


def test_drafts_are_priced_at_the_batch_contexts() -> None:
    """A draft token at context 2,000 attends to 15x what the table's 128 tokens cost: speculation that pays at
    the table's context does not pay there."""
    table = [[0.050, 0.060], [0.080, 0.140]]
    short = VerifyCostModel([1, 4], [1, 9], table, context=128)
    long = VerifyCostModel([1, 4], [1, 9], table, pair_s=2e-5, context=128)
    assert VerifyCostModel.from_profile(long.to_profile()).pair_s == 2e-5

    def trained(cost: VerifyCostModel) -> SpecPolicy:
        policy = SpecPolicy(cost)
        for _ in range(20):
            policy.observe(0, "g", 4, 2)  # acceptance ~0.6
        return policy

    far = [PolicyRequest(0, "g", context=2128)]
    assert trained(short).plan(far)[0] > 0
    assert trained(long).plan(far)[0] < trained(short).plan(far)[0]
    assert trained(long).plan([PolicyRequest(0, "g", context=128)])[0] > 0  # at the table's context it pays


def test_a_long_read_makes_drafting_pay() -> None:
    """The read of a long context is paid once per sequence and step, however many tokens it computes: the
    dearer it makes a plain step, the more a draft token (which shares it) is worth. Charged per pair instead,
    the same context makes drafting look dear."""
    table = [[0.050, 0.060], [0.080, 0.140]]

    def gamma(cost: VerifyCostModel) -> int:
        policy = SpecPolicy(cost)
        for k in range(40):
            policy.observe(0, "g", 4, k % 2)  # acceptance ~1/3
        assert 0.25 < policy.tracker.accept(0, "g") < 0.4
        return policy.plan([PolicyRequest(j, "g", context=2128) for j in range(4)])[0]

    as_pairs = VerifyCostModel([1, 4], [1, 9], table, pair_s=5e-6, context=128)
    as_reads = VerifyCostModel([1, 4], [1, 9], table, pair_s=0.5e-6, context=128, read_s=4.5e-6)
    assert VerifyCostModel.from_profile(as_reads.to_profile()).read_s == 4.5e-6
    assert gamma(as_pairs) == 0 and gamma(as_reads) > 0


def test_t_sd_matches_design_formula() -> None:
    cost = VerifyCostModel([1, 2], [1, 4], [[1.0, 1.3], [2.0, 2.6]], draft_s_per_request=0.05)
    a, g, b = 0.7, 3, 1
    assert t_sd(cost, a, b, g) == pytest.approx((1 - a) * (0.05 + 1.3) / (1 - a ** (g + 1)))
    assert t_sd(cost, a, b, 0) == 1.0 and t_sd(cost, 1.0, b, 3) == pytest.approx(1.35 / 4)


def test_flat_cost_speculates_long() -> None:
    policy = SpecPolicy(flat())
    assert policy.best_uniform_gamma(0.6, 64) == 8
    plan = policy.plan([PolicyRequest(i, "g") for i in range(16)])
    assert set(plan.values()) == {8}


def test_linear_cost_at_large_batch_turns_off() -> None:
    policy = SpecPolicy(memory_then_compute())
    assert policy.best_uniform_gamma(0.9, 256) == 0
    assert set(policy.plan([PolicyRequest(i, "g") for i in range(256)]).values()) == {0}
    assert policy.best_uniform_gamma(0.6, 1) > 0
    assert max(policy.plan([PolicyRequest(0, "g")]).values()) > 0


def test_low_acceptance_drafts_less() -> None:
    cost = VerifyCostModel([1, 64], [1, 9], [[0.02, 0.03], [0.03, 0.09]])
    policy = SpecPolicy(cost)
    for _ in range(30):
        policy.observe("good", "G", 8, 8)
        policy.observe("bad", "B", 8, 0)
    assert policy.tracker.accept("good", "G") > 0.9 > 0.2 > policy.tracker.accept("bad", "B")
    plan = policy.plan([PolicyRequest("good", "G"), PolicyRequest("bad", "B")])
    assert plan["good"] > plan["bad"]
    assert policy.tracker.accept("new", "G") > 0.8  # a new request starts from its group's estimate
    policy.check_integrity()


def test_budget_goes_to_probes_first() -> None:
    cost = VerifyCostModel([1, 8], [1, 2, 9], [[0.02, 0.02, 0.05], [0.02, 0.02, 0.2]])
    policy = SpecPolicy(cost, PolicyConfig(max_batch_tokens=4))
    plan = policy.plan([PolicyRequest("a", "g"), PolicyRequest("probe", "h", is_probe=True),
                        PolicyRequest("c", "g", max_gamma=0)])
    assert plan["probe"] >= plan["a"] and plan["c"] == 0 and sum(plan.values()) <= 4


def test_tracker_geometric_estimate() -> None:
    tracker = AcceptanceTracker(PolicyConfig(prior_weight=1e-9, decay=1.0))
    tracker.observe("r", "g", 8, 3)  # 3 successes, 1 failure
    tracker.observe("r", "g", 2, 2)  # 2 successes, no failure observed
    assert tracker.accept("r", "g") == pytest.approx(5 / 6)
    tracker.forget("r", "g")
    assert tracker.accept("r", "g") == pytest.approx(5 / 6, abs=1e-3)  # a new group starts from the estimate over all


def test_new_groups_start_from_the_rollouts_own_acceptance() -> None:
    tracker = AcceptanceTracker(PolicyConfig())
    assert tracker.accept("x", "new") == pytest.approx(0.5)  # nothing observed yet: the configured prior
    for k in range(200):
        tracker.observe(f"r{k % 8}", f"g{k % 20}", 4, 3)  # 3 of 4 accepted then a rejection: a = 0.75
    assert tracker.global_accept() == pytest.approx(0.75, abs=0.01)
    assert tracker.accept("x", "new") == pytest.approx(0.75, abs=0.01)
    tracker.check_integrity()


def test_errors() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        VerifyCostModel([1], [2], [[1.0]])
    with pytest.raises(ValueError, match="increasing"):
        VerifyCostModel([4, 1], [1], [[1.0], [1.0]])
    with pytest.raises(ValueError, match="table"):
        VerifyCostModel([1, 2], [1], [[1.0]])
    with pytest.raises(ValueError, match="> 0"):
        VerifyCostModel([1], [1], [[0.0]])
    with pytest.raises(ValueError, match="lacks 'times_s'"):
        VerifyCostModel.from_profile({"batch_sizes": [1], "tokens_per_seq": [1]})
    with pytest.raises(ValueError, match="acceptance"):
        t_sd(flat(), 1.5, 1, 2)
    with pytest.raises(ValueError):
        PolicyConfig(gamma_max=0)
    with pytest.raises(ValueError, match="path_len"):
        SpecPolicy(flat()).observe("r", "g", 2, 3)


def test_weights_send_drafts_to_the_straggler() -> None:
    """In a busy batch where drafting does not pay for throughput, a request with much more left to generate
    (the makespan's critical path) still gets drafts, and only it."""
    policy = SpecPolicy(memory_then_compute())
    batch = [PolicyRequest(i, "g") for i in range(256)]
    assert set(policy.plan(batch).values()) == {0}
    weighted = [PolicyRequest(i, "g", weight=0.5) for i in range(255)] + [PolicyRequest(255, "g", weight=128.0)]
    plan = policy.plan(weighted)
    assert plan[255] > 0 and all(plan[i] == 0 for i in range(255))
    with pytest.raises(ValueError, match="weight"):
        PolicyRequest(0, "g", weight=0.0)


def test_a_critical_request_drafts_first_and_its_companions_within_the_slack() -> None:
    """Four companions whose drafts would raise the batch's throughput slow the critical request's step; flagged
    critical, its own plan comes first and theirs may slow that step by 5% at most."""
    cost = VerifyCostModel([1, 8], [1, 2, 9], [[0.02, 0.02, 0.021], [0.02, 0.026, 0.08]])

    def plan(critical: bool) -> tuple[dict, float]:
        policy = SpecPolicy(cost)
        batch = [PolicyRequest(0, "runaway", weight=2.0, critical=critical)] + [
            PolicyRequest(i, "g") for i in range(1, 5)]
        for _ in range(20):
            policy.observe(0, "runaway", 2, 1)  # the critical request drafts poorly,
            for i in range(1, 5):
                policy.observe(i, "g", 8, 8)  # its companions from siblings well
        out = policy.plan(batch)
        return out, cost.step_time(5, 1 + sum(out.values()) / 5)

    flagged, step = plan(True)
    own = cost.step_time(5, 1 + flagged[0] / 5)
    assert flagged[0] > 0 and step <= 1.05 * own + 1e-12
    unflagged, busy = plan(False)
    assert sum(unflagged.values()) > sum(flagged.values()) and busy > 1.05 * own
