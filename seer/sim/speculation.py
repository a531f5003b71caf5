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
  the sibling references ahead of a request.

In both, draft lengths come from the engine's own rule, ``seer.spec.budget.plan_budget`` (the one
``SpecPolicy.plan`` runs). For length-only workloads ``roofline_price`` below prices a step by the roofline at the
batch's current contexts (a draft token costs nothing while the step is memory-bound, the compute slope once it
is compute-bound, plus the drafter's ``draft_cost_s``), and requests with equal values share a class, so a step
with a thousand running requests prices a few hundred prefixes, not thousands.
"""

from __future__ import annotations

from dataclasses import dataclass

from seer.engine.request import Request
from seer.sim.cost_model import CostModel
from seer.spec.budget import DraftClass, StepPrice


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


def draft_limit(req: Request, gamma_max: int) -> int:
    """Drafts that stay inside the current chunk and the budget (no headroom beyond the chunk); never bounded by
    the recorded response's end, which a real engine cannot see coming."""
    pos = req.num_output_tokens
    end = req.params.max_tokens
    if req.chunk_end is not None:
        end = min(end, req.chunk_end)
    return max(0, min(gamma_max, end - pos - 1))


def roofline_price(cost: CostModel, quantum: int, base_seqs: int, base_context: float,
                   draft_cost_s: float = 0.0) -> StepPrice:
    """The step price of ``plan_budget`` for a decode step of ``base_seqs`` requests over ``base_context``
    simulated context tokens (one simulated token stands for ``quantum`` real ones)."""
    ctx_real = base_context * quantum
    step_time = cost.decode_time

    def price(tokens: int, context: float, drafting: int) -> float:
        return step_time(base_seqs, float(base_seqs + tokens), ctx_real, ctx_real + context * quantum) \
            + draft_cost_s * tokens

    return price


def apply_drafts(classes: list[DraftClass]) -> None:
    """Write the granted drafts into the requests (the scheduler then allocates and verifies them; the simulated
    target decides acceptance, so the draft tokens' ids do not matter)."""
    for c in classes:
        for j, req in enumerate(c.members):
            g = c.gamma(j)
            if g > 0:
                req.spec_token_ids = [0] * g
