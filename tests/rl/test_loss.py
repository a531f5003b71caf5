"""PPO-clip (clip-higher, dual clip), k3 KL, entropy bonus and token-level averaging against hand values."""

import math

import pytest
import torch

from seer.rl.loss import kl_k3, policy_loss, ppo_clip, token_weights


def _logps(ratios):
    old = torch.log(torch.tensor([0.5] * len(ratios)))
    return old + torch.log(torch.tensor(ratios)), old


def test_ppo_clip_higher_by_hand():
    logp, old = _logps([1.5, 0.5, 1.1, 0.7])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, active, ratio = ppo_clip(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # 1.5, A=+1: max(-1.5, -1.28) = -1.28 (clipped at 1 + clip_high)
    # 0.5, A=+1: max(-0.5, -0.8)  = -0.5  (no clip: ratio below 1 - eps only clips negative advantages)
    # 1.1, A=-1: max(1.1, 1.1)    = 1.1
    # 0.7, A=-1: max(0.7, 0.8)    = 0.8   (clipped at 1 - clip_low)
    assert loss.tolist() == pytest.approx([-1.28, -0.5, 1.1, 0.8], abs=1e-6)
    assert active.tolist() == [True, False, False, True]
    assert ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], abs=1e-6)


def test_dual_clip_caps_negative_advantages():
    logp, old = _logps([5.0, 5.0])
    adv = torch.tensor([-1.0, 2.0])
    loss, active, _ = ppo_clip(logp, old, adv, 0.2, 0.2, dual_clip_c=3.0)
    # A=-1, ratio 5: max(5, 1.2) = 5, capped at -A * c = 3; A=2: max(-10, -2.4) = -2.4
    assert loss.tolist() == pytest.approx([3.0, -2.4], abs=1e-5)
    assert active.tolist() == [True, True]


def test_k3_kl_by_hand():
    logp = torch.log(torch.tensor([0.5, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.3]))
    # log r = log(0.25/0.5) = -0.693147: exp(-0.693147) + 0.693147 - 1 = 0.193147; equal probs -> 0
    assert kl_k3(logp, ref).tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0], abs=1e-6)


def test_token_weights():
    assert token_weights([2, 3], "token-mean", 5, 2).tolist() == pytest.approx([0.2] * 5)
    assert token_weights([2, 3], "seq-mean-token-mean", 5, 2).tolist() == pytest.approx([0.25, 0.25] + [1 / 6] * 3)
    # a micro-batch's share of a bigger minibatch
    assert token_weights([2], "token-mean", 10, 4).tolist() == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        token_weights([1], "sum", 1, 1)


def test_policy_loss_total_and_gradient_by_hand():
    logp, old = _logps([1.5, 0.5, 1.1, 0.7])
    logp.requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    w = token_weights([1, 3], "token-mean", 4, 2)
    ent = torch.tensor([1.0, 2.0, 3.0, 4.0])
    ref = old.clone()
    terms = policy_loss(logp, old, adv, w, clip_low=0.2, clip_high=0.28, ref_logp=ref, kl_coef=0.1,
                        entropy=ent, entropy_coef=0.01)
    pg = (-1.28 - 0.5 + 1.1 + 0.8) / 4
    kl = sum(r - math.log(r) - 1 for r in (1 / 1.5, 1 / 0.5, 1 / 1.1, 1 / 0.7)) / 4
    assert terms.pg_loss == pytest.approx(pg, abs=1e-6)
    assert terms.kl == pytest.approx(kl, abs=1e-6)
    assert terms.entropy == pytest.approx(2.5)
    assert terms.clip_frac == pytest.approx(0.5)
    assert float(terms.loss.detach()) == pytest.approx(pg + 0.1 * kl - 0.01 * 2.5, abs=1e-6)
    terms.loss.backward()
    # d/dlogp of -A * ratio is -A * ratio on unclipped tokens, 0 on clipped ones; k3: 1 - ref/p = 1 - 1/ratio
    expect = [0.0 + 0.1 * (1 - 1 / 1.5), -0.5 + 0.1 * (1 - 2), 1.1 + 0.1 * (1 - 1 / 1.1), 0.0 + 0.1 * (1 - 1 / 0.7)]
    assert (logp.grad * 4).tolist() == pytest.approx(expect, abs=1e-5)


def test_micro_batches_sum_to_the_minibatch_loss():
    torch.manual_seed(0)
    lengths = [3, 5, 2, 4]
    n = sum(lengths)
    logp, old, adv = -torch.rand(n), -torch.rand(n), torch.randn(n)
    for agg in ("token-mean", "seq-mean-token-mean"):
        whole = policy_loss(logp, old, adv, token_weights(lengths, agg, n, 4)).loss
        a, b = sum(lengths[:2]), n
        parts = (policy_loss(logp[:a], old[:a], adv[:a], token_weights(lengths[:2], agg, n, 4)).loss
                 + policy_loss(logp[a:b], old[a:b], adv[a:b], token_weights(lengths[2:], agg, n, 4)).loss)
        assert float(whole) == pytest.approx(float(parts), abs=1e-6)


def test_bad_shapes_and_missing_reference():
    logp = torch.zeros(3)
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_loss(logp, logp, torch.zeros(2), torch.ones(3) / 3)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logp, logp, logp, torch.ones(3) / 3, kl_coef=0.1)
