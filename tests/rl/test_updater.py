"""The policy update on a tiny model: KL to the reference, entropy, recomputed old logprobs, token-weighted
minibatches, and a non-finite gradient that is skipped instead of corrupting the weights."""

import math

import pytest
import torch

from seer.models.loader import load_model
from seer.rl.batch import Sample, minibatches
from seer.rl.config import AlgoConfig, OptimConfig
from seer.rl.logprobs import response_logprobs_batched
from seer.rl.updater import PolicyUpdater


def samples(model, advantages, temperature=1.0):
    prompts = [(5, 6, 7, 8), (9, 10, 11), (12, 13), (14, 15, 16, 17, 18)]
    responses = [(20, 21, 22), (30, 31, 32, 33, 34), (40,), (50, 51)]
    old = response_logprobs_batched(model, prompts, responses, temperature, 8)
    return [Sample(p, r, lp, a, g) for g, (p, r, lp, a) in enumerate(zip(prompts, responses, old, advantages))]


def test_update_with_kl_entropy_and_recomputed_old_logprobs(tiny):
    model, _ = load_model(tiny, torch.float32, requires_grad=True)
    ref, _ = load_model(tiny, torch.float32)
    algo = AlgoConfig(kl_coef=0.5, entropy_coef=0.01, old_logprobs="recompute", clip_high=0.28)
    updater = PolicyUpdater(model, algo, OptimConfig(lr=1e-2, minibatches=2, micro_batch_size=1), 0.8, ref)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = samples(model, [1.0, -1.0, 0.5, -0.5], temperature=0.8)
    # the old logprobs were computed at T=0.8 on purpose: recompute must land on the same values
    stats = updater.update(data, seed=3)
    assert stats.optimizer_steps == 2 and stats.skipped_steps == 0 and stats.samples == 4 and stats.tokens == 11
    assert stats.logprob_diff == pytest.approx(0.0, abs=1e-5)
    assert stats.kl > 0 and stats.entropy > 0 and math.isfinite(stats.grad_norm)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())


def test_kl_needs_a_reference_and_params(tiny):
    model, _ = load_model(tiny, torch.float32, requires_grad=True)
    with pytest.raises(ValueError, match="reference model"):
        PolicyUpdater(model, AlgoConfig(kl_coef=0.1), OptimConfig(), 1.0)
    frozen, _ = load_model(tiny, torch.float32)
    with pytest.raises(ValueError, match="no trainable parameters"):
        PolicyUpdater(frozen, AlgoConfig(), OptimConfig(), 1.0)


def test_non_finite_gradient_is_skipped(tiny):
    model, _ = load_model(tiny, torch.float32, requires_grad=True)
    updater = PolicyUpdater(model, AlgoConfig(), OptimConfig(lr=1e-2), 1.0)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    stats = updater.update(samples(model, [math.nan, 1.0, -1.0, 0.0]), seed=0)
    assert stats.optimizer_steps == 0 and stats.skipped_steps == 1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_minibatches_partition_and_are_seeded():
    parts = minibatches(10, 3, seed=1)
    assert sorted(i for p in parts for i in p) == list(range(10)) and [len(p) for p in parts] == [3, 4, 3]
    assert parts == minibatches(10, 3, seed=1) and parts != minibatches(10, 3, seed=2)
    assert sorted(len(p) for p in minibatches(2, 5, seed=0)) == [1, 1]  # never an empty minibatch
    assert minibatches(0, 2, seed=0) == []
