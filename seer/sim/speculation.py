"""Grouped speculative decoding in the simulator: the draft server's interface and the adaptive draft budget.

Why here: the scheduler verifies whatever draft tokens a request carries (``Request.spec_token_ids``), so all
the simulator adds is (1) who drafts how many tokens this step and (2) how many of them the target accepts.
One speculator object per run is shared by every instance (like the draft server) and plugs into
``ScheduledInstance`` through the engine's speculator hooks (``track``, ``before_schedule``, ``after_update``,
``forget``). Two kinds exist:

* token-id traces at quantum 1: the engine's own ``seer.engine.speculator.Speculator`` (``DraftServer`` suffix
  trees over the real sibling streams, ``SpecPolicy`` draft lengths from online acceptance and a verify-cost row
  that ``SimInstance`` prices with the roofline at the batch's current contexts); acceptance is exact, the
  recorded tokens decide (forced-token replay, greedy verification).
* length-only workloads at any quantum: ``model_speculator.py``, acceptance from a fitted model ``alpha(n)`` of
  the sibling references ahead of a request and draft lengths from ``allocate`` below.

``allocate`` is the draft-length rule (docs/design.md) at cluster scale: speculate only where it pays, spend the
token budget where the marginal gain is largest, probes first. A draft token's marginal gain is the probability that
it is accepted (``alpha^j``); its marginal cost is what one more token adds to this step's roofline price (nothing
while the step is memory-bound, the compute slope once it is compute-bound, plus the drafter's ``draft_cost_s``).
Tokens are granted greedily, best gain first, while the step's expected tokens per second still rises, so a large
busy batch speculates little or not at all and the tail drafts long. It is ``SpecPolicy.plan``'s rule with the
roofline's context-dependent cost, vectorised over classes of requests with equal gains, so a step with a thousand
running requests costs a few dozen roofline evaluations instead of thousands of candidate tokens.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from seer.engine.request import Request
from seer.sim.cost_model import CostModel, StepSummary


@dataclass(frozen=True)
class SimSpecConfig:
    """Speculation settings of a simulated run (the engine's ``SpecConfig`` drives replayed speculation)."""

    gamma_max: int = 8
    draft_cost_s: float = 0.0     # drafter time per draft token added to the step (suffix lookups: ~0, off-GPU)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.gamma_max <= 64:
            raise ValueError(f"gamma_max must be in [1, 64], got {self.gamma_max}")
        if self.draft_cost_s < 0:
            raise ValueError("draft_cost_s must be >= 0")


@dataclass
class DraftClass:
    """Requests that would draft with the same marginal gains; ``drafts[i]`` are member i's candidate tokens."""

    gains: list[float]
    members: list[Request]
    context: float                      # summed context of the members (simulated tokens)
    probe: bool = False
    drafts: list[list[int]] | None = None
    granted: int = 0
    partial: int = 0                    # members [:partial] get one more token than ``granted``


def draft_limit(req: Request, gamma_max: int) -> int:
    """Drafts that stay inside the current chunk and the recorded response (no headroom beyond the chunk)."""
    pos = req.num_output_tokens
    end = len(req.forced_token_ids) if req.forced_token_ids is not None else req.params.max_tokens
    end = min(end, req.params.max_tokens)
    if req.chunk_end is not None:
        end = min(end, req.chunk_end)
    return max(0, min(gamma_max, end - pos - 1))


def allocate(classes: list[DraftClass], cost: CostModel, quantum: int, base_seqs: int, base_context: float,
             draft_cost_s: float = 0.0, base_value: float | None = None) -> int:
    """Grant draft tokens greedily (best gain first, probes first on ties) while expected (weighted) tokens per
    second of the step rises; returns tokens granted. ``base_*`` describe the step without drafts (simulated
    tokens); ``base_value`` is the weighted value of its plain tokens (``base_seqs`` when gains are unweighted)."""
    if base_seqs <= 0:
        return 0
    ctx_real = base_context * quantum
    tokens, pairs = float(base_seqs), ctx_real
    summary = StepSummary(base_seqs, tokens, ctx_real, pairs)
    t_now = cost.step_time(summary)
    expect = float(base_seqs) if base_value is None else base_value
    heap = [(-c.gains[0], not c.probe, i) for i, c in enumerate(classes) if c.gains]
    heapq.heapify(heap)
    granted = 0
    while heap:
        neg_gain, _, i = heapq.heappop(heap)
        c = classes[i]
        gain, cnt = -neg_gain, len(c.members)
        add_ctx = c.context * quantum
        t_new = cost.step_time(StepSummary(base_seqs, tokens + cnt, ctx_real, pairs + add_ctx)) \
            + draft_cost_s * (granted + cnt)
        if (expect + gain * cnt) * t_now > expect * t_new:
            tokens, pairs, expect, t_now = tokens + cnt, pairs + add_ctx, expect + gain * cnt, t_new
            granted += cnt
            c.granted += 1
            if c.granted < len(c.gains):
                heapq.heappush(heap, (-c.gains[c.granted], not c.probe, i))
            continue
        k = _partial(cost, c, gain, base_seqs, tokens, ctx_real, pairs, expect, t_now, quantum, draft_cost_s, granted)
        c.partial = k
        granted += k
        break
    return granted


def _partial(cost: CostModel, c: DraftClass, gain: float, seqs: int, tokens: float, ctx: float, pairs: float,
             expect: float, t_now: float, quantum: int, draft_cost_s: float, granted: int) -> int:
    """Largest k < members such that granting the next token to k members still pays (bisection)."""
    per_ctx = c.context * quantum / max(len(c.members), 1)
    lo, hi = 0, len(c.members) - 1
    while lo < hi:
        k = (lo + hi + 1) // 2
        t_new = cost.step_time(StepSummary(seqs, tokens + k, ctx, pairs + k * per_ctx)) + draft_cost_s * (granted + k)
        if (expect + gain * k) * t_now > expect * t_new:
            lo = k
        else:
            hi = k - 1
    return lo


def apply_drafts(classes: list[DraftClass]) -> None:
    """Write the granted drafts into the requests (the scheduler then allocates and verifies them)."""
    for c in classes:
        for j, req in enumerate(c.members):
            g = c.granted + (1 if j < c.partial else 0)
            if g <= 0:
                continue
            req.spec_token_ids = c.drafts[j][:g] if c.drafts is not None else [0] * g
