"""The step cost fitted to measured steps: it recovers known constants, reads the driver's records, and rejects
too little data."""

import random

import pytest

from seer.rollout.step_cost import (
    LinearStepCost,
    OnlineStepCost,
    StepShape,
    lone_envelope,
    lower_envelope,
    measured_steps,
)

TRUE = LinearStepCost(0.004, 0.001, 0.0005, 2e-7)


def _steps(n: int, noise: float = 0.0) -> list[StepShape]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        seqs = rng.randint(1, 16)
        per = rng.choice([1, 1, 3, 32])
        ctx = rng.randint(16, 1500)
        pairs = seqs * per * (ctx + (per + 1) / 2)
        t = TRUE.step_time(seqs, seqs * per, pairs) * (1 + rng.uniform(-noise, noise))
        out.append(StepShape(seqs, seqs * per, pairs, t))
    return out


def test_fit_recovers_the_constants_of_noise_free_steps():
    fit = LinearStepCost.fit(_steps(200))
    for name in ("fixed_s", "per_seq_s", "per_token_s", "per_pair_s"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert fit.mape < 1e-9 and fit.steps == 200


def test_fit_on_noisy_steps_is_close_and_never_negative():
    fit = LinearStepCost.fit(_steps(400, noise=0.2))
    assert min(fit.fixed_s, fit.per_seq_s, fit.per_token_s, fit.per_pair_s) >= 0
    assert fit.per_pair_s == pytest.approx(TRUE.per_pair_s, rel=0.15) and fit.mape < 0.15


def test_no_step_is_below_the_lower_envelope_and_it_follows_the_fastest_steps():
    """Noise only slows a step down (interference, never a faster machine): the envelope recovers the true
    cost from below, where a central fit sits in the middle of the noise."""
    rng = random.Random(1)
    slowed = [StepShape(s.seqs, s.tokens, s.pairs, s.seconds * (1 + rng.expovariate(1 / 0.15)))
              for s in _steps(400)]
    env, central = lower_envelope(slowed), LinearStepCost.fit(slowed)
    assert all(s.seconds >= env.step_time(s.seqs, s.tokens, s.pairs) * (1 - 1e-9) for s in slowed)
    truth = [TRUE.step_time(s.seqs, s.tokens, s.pairs) for s in slowed]
    under = [env.step_time(s.seqs, s.tokens, s.pairs) / t for s, t in zip(slowed, truth)]
    assert 0.97 < min(under) and max(under) < 1.01                  # the truth, up to the least-slowed steps
    assert any(s.seconds < central.step_time(s.seqs, s.tokens, s.pairs) for s in slowed)  # a central fit is beaten
    assert env.steps == 400 and env.mape > 0.05


def _flat_then_rising(n: int) -> list[StepShape]:
    """A CPU's decode steps: reading the weights sets the time up to four sequences (44 ms), compute after."""
    rng = random.Random(2)
    out = []
    for _ in range(n):
        seqs, ctx = rng.choice([1, 1, 2, 4, 8, 16, 32, 64]), rng.randint(50, 1500)
        pairs = seqs * (ctx + 1)
        t = max(0.044, 0.02 + 0.004 * seqs) + 2e-6 * pairs
        out.append(StepShape(seqs, seqs, pairs, t * (1 + rng.expovariate(1 / 0.1))))
    return out


def test_the_lone_envelope_prices_steps_of_one_where_the_envelope_of_all_is_far_below():
    steps = _flat_then_rising(600)
    lone, env = lone_envelope(steps), lower_envelope(steps)
    assert lone is not None and lone.steps == sum(s.seqs == 1 for s in steps)
    ones = [s for s in steps if s.seqs == 1]
    assert all(s.seconds >= lone.step_time(1, s.tokens, s.pairs) * (1 - 1e-9) for s in ones)
    assert all(s.seconds >= lone.step_time(1, s.tokens / s.seqs, s.pairs / s.seqs) * (1 - 1e-9) for s in steps)
    at = (1, 1, 801)  # one sequence at context 800
    assert 0.97 < lone.step_time(*at) / (0.044 + 2e-6 * 801) <= 1.0   # the truth, from below
    assert env.step_time(*at) < 0.9 * lone.step_time(*at)              # one line under all batches: below


def test_the_lone_envelope_needs_steps_of_one():
    assert lone_envelope([s for s in _flat_then_rising(200) if s.seqs > 1]) is None


def test_a_chunk_attends_to_its_context_and_itself():
    shape = StepShape.from_trace([(1, 10, 1, 0), (2, 0, 4, 0)], 0.1)
    # one token after 10 cached sees 11 positions; a 4-token prefill sees 1 + 2 + 3 + 4
    assert (shape.seqs, shape.tokens, shape.pairs) == (2, 5, 11 + 10)


def test_fit_prices_shared_pairs_apart_from_private_ones():
    truth = LinearStepCost(0.004, 0.001, 0.0005, 2e-7, per_shared_pair_s=0.5e-7)
    rng = random.Random(1)
    steps = []
    for _ in range(200):
        seqs, ctx = rng.randint(1, 32), rng.randint(50, 1500)
        pairs = seqs * ctx
        shared = rng.choice([0.0, 0.5, 0.8]) * pairs * (seqs - 1) / seqs  # the first sibling reads its own
        steps.append(StepShape(seqs, seqs, pairs, truth.step_time(seqs, seqs, pairs, shared), shared))
    fit = LinearStepCost.fit(steps)
    assert fit.per_pair_s == pytest.approx(2e-7, rel=1e-6)
    assert fit.per_shared_pair_s == pytest.approx(0.5e-7, rel=1e-6)
    assert lower_envelope(steps).per_shared_pair_s == pytest.approx(0.5e-7, rel=1e-3)
    # without sharing data the shared price is the pair price (reports recorded before the split)
    assert LinearStepCost.fit(_steps(50)).per_shared_pair_s is None
    assert TRUE.step_time(4, 4, 4000, 3000) == TRUE.step_time(4, 4, 4000)


def test_a_trace_with_shared_tokens_counts_shared_pairs_and_reads():
    shape = StepShape.from_trace([(1, 20, 1, 0, 0), (2, 20, 3, 2, 16)], 0.1)
    assert shape.shared_pairs == 3 * 16 and shape.pairs == 21 + 3 * 22
    assert shape.reads == 21 + 23 and shape.shared_reads == 16  # each sequence reads its KV once


def _read_steps(truth: LinearStepCost, n: int) -> list[StepShape]:
    """Decode and verify steps of siblings, traced as the engine traces them."""
    rng = random.Random(2)
    steps = []
    for _ in range(n):
        seqs, ctx, per = rng.randint(1, 16), rng.randint(50, 1500), rng.choice([1, 1, 3, 9])
        shared = rng.choice([0, ctx // 2])
        trace = [(i, ctx, per, per - 1, shared if i else 0) for i in range(seqs)]
        steps.append(StepShape.from_trace(trace, truth.of(StepShape.from_trace(trace, 1.0))))
    return steps


def test_fit_prices_reads_apart_from_pairs():
    """A sequence reads its context once per step however many tokens it computes: the fit tells the read from
    the pairs by the verify steps, so a draft token is not charged the read (decode alone cannot tell them)."""
    truth = LinearStepCost(0.004, 0.001, 0.0005, 0.6e-6, per_read_s=4e-6, per_shared_read_s=1e-6)
    fit = LinearStepCost.fit(_read_steps(truth, 300))
    assert fit.per_read_s == pytest.approx(4e-6, rel=1e-4) and fit.per_pair_s == pytest.approx(0.6e-6, rel=1e-4)
    assert fit.per_shared_read_s == pytest.approx(1e-6, rel=1e-4) and fit.per_shared_pair_s is None
    assert fit.decode_time(2, 1000) == pytest.approx(truth.step_time(2, 2, 1000, reads=1000))
    assert lower_envelope(_read_steps(truth, 300)).per_read_s == pytest.approx(4e-6, rel=1e-3)
    assert truth.scaled(2.0, 1, 0.0).per_shared_read_s == pytest.approx(2e-6)


def test_measured_steps_take_drafting_and_kv_out_and_skip_empty_steps():
    decisions = {0: [[(1, 5, 1, 0)], [], [(1, 6, 3, 2)]]}
    busy = {0: [(0.0, 1.0), (1.0, 1.5), (2.0, 2.5)]}
    costs = {0: [(0.25, 0.25), (0.0, 0.5), (0.1, 0.0)]}
    shapes = measured_steps(decisions, busy, costs)
    assert [s.seconds for s in shapes] == [pytest.approx(0.5), pytest.approx(0.4)]
    assert [s.tokens for s in shapes] == [1, 3]


def test_too_few_steps_is_an_error():
    with pytest.raises(ValueError, match="at least"):
        LinearStepCost.fit(_steps(3))


def test_the_online_fit_follows_the_steps_run_so_far():
    online = OnlineStepCost(window=64, every=16, min_steps=32)
    online.add((), 0.01)          # nothing computed: not a step
    online.add(((0, 0, 1, 0),), 0.0)
    rng = random.Random(1)
    for _ in range(31):
        seqs, ctx = rng.randint(1, 16), rng.randint(16, 1500)
        online.add(tuple((r, ctx, 1, 0, 0) for r in range(seqs)), TRUE.step_time(seqs, seqs, seqs * (ctx + 1)))
    assert online.fit is None and online.seen == 31  # too few to fit
    online.add(((0, 40, 1, 0, 0),), TRUE.step_time(1, 1, 41))
    assert online.fit is not None and online.fit.per_seq_s + online.fit.per_token_s == pytest.approx(0.0015)
    first = online.fit
    for _ in range(15):
        online.add(((0, 40, 1, 0, 0),), 0.1)
    assert online.fit is first  # refitted only every 16 steps
    online.add(((0, 40, 1, 0, 0),), 0.1)
    assert online.fit is not first and len(online.steps) == 48
    online.check_integrity()
    with pytest.raises(ValueError):
        OnlineStepCost(window=8)
