"""The rollout bound: its two terms, and that no schedule of the profiled steps beats it."""

import pytest

from seer.rollout.bound import credited, fitted_bound, rollout_bound
from seer.rollout.step_cost import LinearStepCost
from seer.spec.policy import VerifyCostModel

# batch 1: 10 ms a plain step, 25 ms verifying 2 drafts; batch 8: 40 ms per token each sequence computes
COST = VerifyCostModel([1, 8], [1, 3], [[0.010, 0.025], [0.040, 0.120]])


def test_credit_is_capped_by_tokens_computed_and_by_tau():
    assert credited(2.5, 1) == 1.0 and credited(2.5, 3) == 2.5 and credited(2.5, 2) == 2.0
    assert credited(0.0, 3) == 1.0  # no drafting measured: a step still emits one token


def test_longest_response_term_binds_a_long_tail():
    b = rollout_bound([100, 10, 10], instances=4, cost=COST)
    assert b.longest_s == pytest.approx(100 * 0.010) and b.bound_s == b.longest_s
    drafted = rollout_bound([100, 10, 10], instances=4, cost=COST, tau=2.0, longest_tau=3.0)
    assert drafted.longest_s == pytest.approx(100 * 0.025 / 3.0)  # 3 tokens per 25 ms verification


def test_work_term_binds_many_responses():
    lengths = [50] * 64
    b = rollout_bound(lengths, instances=2, cost=COST)
    assert b.peak_tok_s == pytest.approx(2 * 8 / 0.040) and b.work_s == pytest.approx(3200 / 400)
    assert b.bound_s == b.work_s > b.longest_s
    # drafting cannot raise the compute-bound peak: batch 8 verifying 3 tokens costs 3x a plain step
    assert rollout_bound(lengths, instances=2, cost=COST, tau=3.0).peak_tok_s == pytest.approx(b.peak_tok_s)


def test_bad_input_is_an_error():
    with pytest.raises(ValueError):
        rollout_bound([], instances=2, cost=COST)
    with pytest.raises(ValueError):
        rollout_bound([5], instances=0, cost=COST)


# a step: 10 ms fixed, 1 ms per sequence, 2 ms per token, 10 us per (token, context position) pair
LINEAR = LinearStepCost(0.010, 0.001, 0.002, 1e-5)


def test_fitted_longest_term_prices_every_token_at_its_context():
    b = fitted_bound([(100, 50), (10, 5)], instances=1, cost=LINEAR, max_tokens_per_seq=1)
    expected = sum(0.010 + 0.001 + 0.002 + (c + 1) * 1e-5 for c in range(100, 150))
    assert b.longest_s == pytest.approx(expected) and b.model == "fitted"
    # the same response with a short prompt is cheaper: context is what the profile bound misses
    short = fitted_bound([(0, 50)], instances=1, cost=LINEAR, max_tokens_per_seq=1)
    assert short.longest_s < b.longest_s


def test_the_longest_term_takes_the_cost_of_steps_of_one_and_the_work_term_does_not():
    lone = LinearStepCost(0.040, 0.0, 0.002, 1e-5)  # steps of one sequence: dearer than the line under all
    plain = fitted_bound([(100, 50), (10, 5)], instances=1, cost=LINEAR, max_tokens_per_seq=1)
    b = fitted_bound([(100, 50), (10, 5)], instances=1, cost=LINEAR, max_tokens_per_seq=1, alone=lone)
    assert b.longest_s == pytest.approx(sum(0.040 + 0.002 + (c + 1) * 1e-5 for c in range(100, 150)))
    assert b.work_s == plain.work_s and b.longest_s > plain.longest_s


def test_fitted_work_term_amortises_the_fixed_cost_and_splits_over_instances():
    responses = [(20, 30)] * 40
    one = fitted_bound(responses, instances=1, cost=LINEAR, max_tokens_per_seq=1)
    per_token = [0.001 + 0.002 + (c + 1) * 1e-5 for c in range(20, 50)]
    assert one.work_s == pytest.approx(40 * sum(per_token))
    assert fitted_bound(responses, instances=4, cost=LINEAR, max_tokens_per_seq=1).work_s == \
        pytest.approx(one.work_s / 4)


def test_fitted_bound_credits_drafts_up_to_tau():
    plain = fitted_bound([(0, 200)], instances=1, cost=LINEAR, max_tokens_per_seq=1)
    drafted = fitted_bound([(0, 200)], instances=1, cost=LINEAR, tau=3.0, max_tokens_per_seq=4)
    assert drafted.longest_s < plain.longest_s  # the fixed cost is shared by the tokens a verification emits
    with pytest.raises(ValueError):
        fitted_bound([], instances=1, cost=LINEAR)


def test_fitted_work_pays_the_fixed_cost_for_the_steps_the_kv_budget_forces():
    responses = [(100, 100)] * 8
    free = fitted_bound(responses, instances=2, cost=LINEAR, max_tokens_per_seq=1)
    tight = fitted_bound(responses, instances=2, cost=LINEAR, max_tokens_per_seq=1, kv_tokens=300)
    contexts = 8 * sum(range(100, 200))
    assert tight.work_s == pytest.approx(free.work_s + 0.010 * (contexts / 300) / 2)
    # a sequence limit forces steps too: 800 tokens, at most 4 sequences a step
    capped = fitted_bound(responses, instances=2, cost=LINEAR, max_tokens_per_seq=1, max_seqs=4)
    assert capped.work_s == pytest.approx(free.work_s + 0.010 * (800 / 4) / 2)
