"""The policy update of one iteration: epochs x minibatches of PPO-clip steps over the rollout's samples.

One optimizer step per minibatch, gradients accumulated over micro-batches of ``micro_batch_size`` sequences
(token weights are fixed per minibatch, see ``loss``). Gradient-norm clipping, AdamW, linear warmup. A step
whose gradient is not finite is skipped and counted instead of poisoning the weights.

``logprob_diff`` is an on-policy check at no extra cost: the mean absolute difference between the trainer's
logprobs before any step (the recomputed old logprobs, or the first minibatch's forward) and the engine's. It
is ~0 up to the engine's dtype; a large value means trainer and engine disagree on the weights or on the
sampling distribution.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seer.rl.batch import Sample, flat, micro_batches, minibatches, with_logprobs
from seer.rl.config import AlgoConfig, OptimConfig
from seer.rl.logprobs import response_logprobs, response_logprobs_batched
from seer.rl.loss import policy_loss, token_weights

log = logging.getLogger("seer.rl.updater")


@dataclass(frozen=True)
class UpdateStats:
    pg_loss: float
    kl: float
    entropy: float
    clip_frac: float
    ratio_mean: float
    grad_norm: float
    lr: float
    optimizer_steps: int
    skipped_steps: int
    logprob_diff: float
    samples: int
    tokens: int


class PolicyUpdater:
    def __init__(self, model: torch.nn.Module, algo: AlgoConfig, optim: OptimConfig, temperature: float,
                 ref_model: torch.nn.Module | None = None) -> None:
        if algo.kl_coef > 0 and ref_model is None:
            raise ValueError("algo.kl_coef > 0 needs a reference model")
        self.model, self.ref_model = model, ref_model
        self.algo, self.optim, self.temperature = algo, optim, temperature
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy model has no trainable parameters (load it with requires_grad=True)")
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        warmup = optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)

    def prepare(self, samples: list[Sample]) -> tuple[list[Sample], float | None]:
        """Attach recomputed old logprobs and reference logprobs when the config asks for them; with
        recomputed old logprobs also return their mean absolute difference to the engine's."""
        prompts = [s.prompt for s in samples]
        responses = [s.response for s in samples]
        mbs = self.optim.micro_batch_size
        old = ref = None
        diff = None
        if self.algo.old_logprobs == "recompute":
            old = response_logprobs_batched(self.model, prompts, responses, self.temperature, mbs)
            total = sum(float((o - s.old_logprobs).abs().sum()) for o, s in zip(old, samples))
            diff = total / max(1, sum(s.num_tokens for s in samples))
        if self.algo.kl_coef > 0 and self.ref_model is not None:
            ref = response_logprobs_batched(self.ref_model, prompts, responses, self.temperature, mbs)
        return with_logprobs(samples, old, ref), diff

    def update(self, samples: list[Sample], seed: int) -> UpdateStats:
        """Train on ``samples`` (already ``prepare``d); ``seed`` fixes the minibatch order."""
        samples, recomputed_diff = self.prepare(samples)
        self.model.train()
        sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0, "grad_norm": 0.0}
        steps = skipped = 0
        diff = math.nan if recomputed_diff is None else recomputed_diff
        for epoch in range(self.optim.epochs):
            for mb in minibatches(len(samples), self.optim.minibatches, seed * 1_000_003 + epoch):
                first = recomputed_diff is None and steps + skipped == 0
                stats, first_diff = self._step([samples[i] for i in mb], want_diff=first)
                if first_diff is not None:
                    diff = first_diff
                if stats is None:
                    skipped += 1
                    continue
                steps += 1
                for k in sums:
                    sums[k] += stats[k]
        n = max(steps, 1)
        return UpdateStats(**{k: v / n for k, v in sums.items()}, lr=self.scheduler.get_last_lr()[0],
                           optimizer_steps=steps, skipped_steps=skipped, logprob_diff=diff, samples=len(samples),
                           tokens=sum(s.num_tokens for s in samples))

    def _step(self, batch: Sequence[Sample], want_diff: bool) -> tuple[dict[str, float] | None, float | None]:
        """One optimizer step on one minibatch; (None, diff) when the gradient was not finite."""
        mb_tokens = sum(s.num_tokens for s in batch)
        self.optimizer.zero_grad(set_to_none=True)
        stats = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0}
        diff_sum = 0.0
        by_length = sorted(range(len(batch)), key=lambda i: len(batch[i].prompt) + batch[i].num_tokens)
        for idx in micro_batches(by_length, self.optim.micro_batch_size):  # similar lengths: little padding
            micro = [batch[i] for i in idx]
            out = response_logprobs(self.model, [s.prompt for s in micro], [s.response for s in micro],
                                    self.temperature, with_entropy=True)
            device = out.logprobs.device
            weights = token_weights([s.num_tokens for s in micro], self.algo.loss_agg, mb_tokens, len(batch))
            ref = flat(micro, "ref_logprobs").to(device) if self.algo.kl_coef > 0 else None
            terms = policy_loss(out.logprobs, flat(micro, "old_logprobs").to(device),
                                flat(micro, "advantage").to(device), weights.to(device),
                                clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
                                dual_clip_c=self.algo.dual_clip_c, ref_logp=ref, kl_coef=self.algo.kl_coef,
                                entropy=out.entropy, entropy_coef=self.algo.entropy_coef)
            terms.loss.backward()
            for k in stats:
                stats[k] += getattr(terms, k)
            if want_diff:
                diff_sum += float((out.logprobs.detach() - flat(micro, "old_logprobs").to(device)).abs().sum())
        diff = diff_sum / mb_tokens if want_diff else None
        clip = self.optim.grad_clip if self.optim.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        if not math.isfinite(grad_norm):
            log.warning("non-finite gradient norm (%s): optimizer step skipped", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
            return None, diff
        self.optimizer.step()
        self.scheduler.step()
        return {**stats, "grad_norm": grad_norm}, diff
