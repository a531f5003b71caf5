"""The makespan no rollout policy can beat on this hardware, so a result shows how much room is left.

Two things bound any schedule of a rollout over ``I`` instances, with ``T(B, n)`` the profiled step time of
``B`` sequences computing ``n`` tokens each and ``tau`` a measured mean acceptance length (tokens a verification
emits, bonus included; 1 without drafting). A step computing ``n`` tokens of a sequence emits at most ``n`` of
them, and on average no more than ``tau``, so it is credited ``min(n, tau)``:
- the longest response must be generated token after token; alone on an instance (batch 1, nothing else slowing
  its steps) that takes ``L * min over n of T(1, n) / min(n, tau_g)``, with ``tau_g`` the tokens per step that
  response reached (where the run counted them per request; else its group's tau). Its own, because a runaway
  of noise accepts no draft however well its siblings' drafts accept;
- all generated tokens must be produced at no more than the best aggregate rate,
  ``I * max over (B, n) of B * min(n, tau) / T(B, n)`` with ``tau`` the rollout's.
``bound_s`` is the larger of the two. Both terms are optimistic (prefill, scheduling, drafting and KV movement
are free; the profile's short context makes steps cheap), so a policy's ``makespan / bound_s`` overstates the
room left, never understates it. The profile must be measured on a quiet machine, or the bound is loose.
``fitted_bound`` prices the same two terms with a step cost fitted to the rollout's own measured steps
(``step_cost.py``), at every token's real context: the profile's short context makes its steps cheap, so its
bound is loose where responses are long (and invalid where the KV budget kept the profile from large batches
the rollout did run). Each token is credited the same way, and the fixed per-step cost is shared by as many
sequences as an instance's KV and sequence limit allow; it stays optimistic, up to the fit's error.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from seer.rollout.step_cost import LinearStepCost
from seer.spec.policy import VerifyCostModel


def credited(tau: float, tokens_per_seq: float) -> float:
    """Tokens a step computing ``tokens_per_seq`` tokens of a sequence is credited with: no more than it
    computes, no more than the measured mean ``tau``, at least the one a plain decode step emits."""
    return max(1.0, min(tokens_per_seq, tau))


@dataclass(frozen=True)
class RolloutBound:
    bound_s: float
    longest_s: float          # the longest response alone
    work_s: float             # all tokens at the best aggregate rate
    longest_tokens: int
    total_tokens: int
    peak_tok_s: float         # the best aggregate rate over all instances
    tau: float                # mean acceptance length the work term assumes
    longest_tau: float        # ... and the longest response's term (its own tokens per step, or its group's tau)
    model: str = "profile"    # what priced the steps: the verify profile, or a fit to the measured steps

    def to_dict(self) -> dict:
        return asdict(self)


def rollout_bound(lengths: Sequence[int], instances: int, cost: VerifyCostModel, *, tau: float = 1.0,
                  longest_tau: float | None = None) -> RolloutBound:
    """The bound for responses of ``lengths`` tokens on ``instances`` instances whose steps ``cost`` prices."""
    if not lengths or instances < 1:
        raise ValueError("a bound needs at least one response and one instance")
    tau_long = tau if longest_tau is None else longest_tau
    longest, total = max(lengths), sum(lengths)
    longest_s = longest * min(cost.step_time(1, n) / credited(tau_long, n) for n in cost.tokens_per_seq)
    peak = instances * max(b * credited(tau, n) / cost.step_time(b, n)
                           for b in cost.batch_sizes for n in cost.tokens_per_seq)
    work_s = total / peak
    return RolloutBound(max(longest_s, work_s), longest_s, work_s, longest, total, peak, tau, tau_long)


def _per_token_s(cost: LinearStepCost, contexts: np.ndarray, tau: float, max_tokens_per_seq: int,
                 fixed_s: float) -> np.ndarray:
    """Cheapest seconds per emitted token at each context: a step computing ``n`` tokens of a sequence from
    ``c`` costs ``fixed_s + per_seq + n per_token + n (c + (n + 1) / 2) per_pair + (c + n) per_read`` and is credited
    ``credited(tau, n)`` tokens; the best ``n`` is taken per context."""
    best = np.full(contexts.shape, np.inf)
    for n in range(1, max_tokens_per_seq + 1):
        step = (fixed_s + cost.per_seq_s + n * cost.per_token_s
                + n * (contexts + (n + 1) / 2) * cost.per_pair_s + (contexts + n) * cost.per_read_s)
        best = np.minimum(best, step / credited(tau, n))
    return best


def fitted_bound(responses: Sequence[tuple[int, int]], instances: int, cost: LinearStepCost, *,
                 tau: float = 1.0, longest_tau: float | None = None, max_tokens_per_seq: int = 9,
                 kv_tokens: int | None = None, max_seqs: int | None = None,
                 alone: LinearStepCost | None = None) -> RolloutBound:
    """The bound for ``(prompt tokens, generated tokens)`` responses on ``instances`` instances, each token
    priced at its context by ``cost`` (the longest response's by ``alone``, the cost of a step of one sequence,
    where given); a step computes at most ``max_tokens_per_seq`` tokens of a sequence (1 + the longest draft).

    The fixed cost of a step is shared by its sequences, but not by more than an instance holds: a step's
    sequences fit its ``kv_tokens`` (their contexts sum to no more) and number at most ``max_seqs``, and each
    emits at most ``tau`` tokens, so the steps all instances run number at least ``sum of contexts / (tau *
    kv_tokens)`` and ``tokens / (tau * max_seqs)``; the work term pays the fixed cost for that many."""
    if not responses or instances < 1:
        raise ValueError("a bound needs at least one response and one instance")
    tau_long = tau if longest_tau is None else longest_tau
    prompt, longest = max(responses, key=lambda r: (r[1], r[0]))
    lone = alone or cost
    alone_s = _per_token_s(lone, np.arange(prompt, prompt + longest, dtype=float), tau_long,
                           max_tokens_per_seq, lone.fixed_s)
    contexts = np.concatenate([np.arange(p, p + n, dtype=float) for p, n in responses])
    per_step = credited(tau, max_tokens_per_seq)
    steps = max(float(contexts.sum()) / (per_step * kv_tokens) if kv_tokens else 0.0,
                len(contexts) / (per_step * max_seqs) if max_seqs else 0.0)
    tokens_s = float(_per_token_s(cost, contexts, tau, max_tokens_per_seq, 0.0).sum())
    work_s = (tokens_s + cost.fixed_s * steps) / instances
    longest_s = float(alone_s.sum())
    total = len(contexts)
    return RolloutBound(max(longest_s, work_s), longest_s, work_s, longest, total,
                        total / work_s if work_s > 0 else float("inf"), tau, tau_long, model="fitted")
