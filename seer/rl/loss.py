"""The PPO-clip policy loss of GRPO/DAPO over packed response tokens, with optional KL and entropy terms.

Every tensor here is flat over the valid response tokens of some sequences ([T]); there is no padding and no
mask. Averaging is expressed as per-token ``weights`` that sum to 1 over one optimizer step's minibatch:

- ``token-mean`` (DAPO, verl's default): every token of the minibatch weighs 1/T_minibatch, so long responses
  are not down-weighted per token;
- ``seq-mean-token-mean`` (the original GRPO): token t of sequence s weighs 1/(S_minibatch * len_s).

Because the weights are fixed per minibatch, a micro-batch's loss is its share of the minibatch loss: summing
the micro-batch losses (gradient accumulation) gives exactly the minibatch objective, and the same holds for
the statistics in ``LossTerms`` (weighted sums, not means).

PPO-clip with clip-higher: ``ratio = exp(logp - old_logp)``, per-token loss
``max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``; with ``dual_clip_c`` the loss of a token
with A < 0 is also capped at ``-A * c``. KL to the reference policy uses the k3 estimator
``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0). The entropy bonus subtracts
``entropy_coef * H``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: a ratio beyond this is a bug, not a policy change; keep it finite


@dataclass(frozen=True)
class LossTerms:
    """The loss to back-propagate and weighted statistics (sum them over micro-batches of a minibatch)."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    entropy: float
    clip_frac: float
    ratio_mean: float


def token_weights(lengths: Sequence[int], agg: str, minibatch_tokens: int, minibatch_seqs: int) -> torch.Tensor:
    """Per-token weights [sum(lengths)] for sequences of one minibatch (see the module docstring)."""
    if minibatch_tokens < 1 or minibatch_seqs < 1:
        raise ValueError("a minibatch needs at least one sequence and one token")
    if agg == "token-mean":
        return torch.full((sum(lengths),), 1.0 / minibatch_tokens, dtype=torch.float32)
    if agg == "seq-mean-token-mean":
        parts = [torch.full((n,), 1.0 / (minibatch_seqs * n), dtype=torch.float32) for n in lengths if n > 0]
        return torch.cat(parts) if parts else torch.zeros(0)
    raise ValueError(f"unknown loss aggregation {agg!r}; use token-mean or seq-mean-token-mean")


def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float,
             clip_high: float, dual_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss [T], mask [T] of tokens where clipping is active, and the ratio [T]."""
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip_c is not None:
        cap = -advantages * dual_clip_c
        negative = advantages < 0
        active = active | (negative & (loss > cap))
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, active, ratio


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) from sampled tokens' logprobs."""
    log_ratio = (ref_logp - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return log_ratio.exp() - log_ratio - 1.0


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float = 0.2, dual_clip_c: float | None = None,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, entropy: torch.Tensor | None = None,
                entropy_coef: float = 0.0) -> LossTerms:
    """The weighted GRPO objective of some tokens: PPO-clip + kl_coef * k3 - entropy_coef * entropy."""
    n = logp.shape[0]
    for name, t in (("old_logp", old_logp), ("advantages", advantages), ("weights", weights)):
        if t.shape != (n,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({n},) like logp")
    weights = weights.to(logp.device, torch.float32)
    pg, active, ratio = ppo_clip(logp, old_logp.to(logp), advantages.to(logp), clip_low, clip_high, dual_clip_c)
    total = (weights * pg).sum()
    kl_value = 0.0
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference model's logprobs")
        kl = kl_k3(logp, ref_logp.to(logp))
        total = total + kl_coef * (weights * kl).sum()
        kl_value = float((weights * kl).sum().detach())
    ent_value = 0.0
    if entropy is not None:
        ent_value = float((weights * entropy).sum().detach())
        if entropy_coef > 0:
            total = total - entropy_coef * (weights * entropy).sum()
    return LossTerms(loss=total, pg_loss=float((weights * pg).sum().detach()), kl=kl_value, entropy=ent_value,
                     clip_frac=float((weights * active.float()).sum()),
                     ratio_mean=float((weights * ratio).sum().detach()))
