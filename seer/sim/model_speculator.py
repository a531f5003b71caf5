"""The draft server when only response lengths are known: acceptance from a fitted model of sibling references.

Why: a length-only trace (or a preset) has no token streams to build suffix trees from, but the effect that
makes grouped speculation work is still there: a request drafts well from siblings that have already written
past its position. So this speculator tracks every request's progress per group, counts the references ahead of a
request (``n`` = siblings whose generated length exceeds its own), and accepts drafts per token with the fitted
probability ``alpha(n)`` (``acceptance.py``). Draft lengths come from the engine's draft budget
(``seer.spec.budget``) priced by the roofline (``speculation.py``).
At token quantum 1 acceptance is sampled draft token by draft token; at a coarse quantum one simulated step
stands for many real verification steps, so the accepted count is the expected acceptance length, randomly
rounded (unbiased). Seeded, so runs are reproducible. Draft tokens are valued as the engine's speculator values
them: each request's gains are weighted by its estimated remaining length over the batch mean
(``critical_weights``), in bins of a quarter octave so a class still holds many requests.

It plugs into ``ScheduledInstance`` through the same hooks as the engine's speculator (``track``,
``before_schedule``, ``after_update``, ``forget``); ``SimInstance.execute`` asks ``accepted`` how many drafts the
"target" accepts, since no model verifies them.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import defaultdict

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.sim.acceptance import AcceptanceModel, expected_accept_len
from seer.sim.cost_model import CostModel
from seer.sim.speculation import SimSpecConfig, apply_drafts, draft_limit, roofline_price
from seer.spec.budget import DraftClass, plan_budget
from seer.spec.policy import PolicyConfig, critical_weights


class ModelSpeculator:
    def __init__(self, config: SimSpecConfig, model: AcceptanceModel, cost: CostModel, quantum: int = 1) -> None:
        self.config = config
        self.rule = PolicyConfig(gamma_max=config.gamma_max)  # the engine's probe boost and token cap
        self.model = model
        self.cost = cost
        self.quantum = quantum
        self.rng = random.Random(config.seed)
        self.progress: dict[str, int] = {}
        self.group_progress: dict[str, list[int]] = defaultdict(list)   # sorted progress of observed members
        self._alpha_at: dict[str, float] = {}
        self._alpha_cache = [model.alpha(n) for n in range(256)]
        self.drafted = 0
        self.accepted_total = 0
        self.draft_s = 0.0     # simulated drafting costs no host time worth reporting

    # ------------------------------------------------------------------ engine speculator hooks
    def track(self, req: Request) -> None:
        """A request starts a chunk on some instance (its progress so far is already known)."""

    def forget(self, request_id: str) -> None:
        self._alpha_at.pop(request_id, None)

    def before_schedule(self, scheduler: Scheduler) -> int:
        """Give the decoding requests of this instance their drafts for the next step; returns how many may
        draft."""
        gamma = self.config.gamma_max
        ready: list[Request] = []
        for req in scheduler.running:
            if req.spec_token_ids:
                req.spec_token_ids = []
            if req.num_computed_tokens == req.num_tokens - 1:  # not still prefilling
                ready.append(req)
        if not ready:
            return 0
        weights = [_binned(w) for w in critical_weights([r.remaining_hint for r in ready])]
        ctx = sum(req.num_computed_tokens + 0.5 for req in ready)
        cands = [(req, draft_limit(req, gamma), w) for req, w in zip(ready, weights)]
        cands = [c for c in cands if c[1] > 0]
        if cands:
            classes = self.classes(cands)
            price = roofline_price(self.cost, self.quantum, len(ready), ctx, self.config.draft_cost_s)
            plan_budget(classes, price, sum(weights), self.rule.probe_boost, self.rule.max_batch_tokens)
            apply_drafts(classes)
        return len(cands)

    def after_update(self, out: SchedulerOutput, results: dict[str, StepResult], reqs: dict[str, Request]) -> None:
        """Record each emitting request's new progress (the scheduler has appended its tokens)."""
        for rid, res in results.items():
            if res.token_ids:
                self._set_progress(reqs[rid])

    # ------------------------------------------------------------------ acceptance
    def refs_ahead(self, req: Request) -> int:
        lst = self.group_progress.get(req.group_id or "")
        if not lst:
            return 0
        return len(lst) - bisect.bisect_right(lst, req.num_output_tokens)

    def _alpha(self, n: int) -> float:
        return self._alpha_cache[n] if n < len(self._alpha_cache) else self.model.alpha(n)

    def classes(self, cands: list[tuple[Request, int, float]]) -> list[DraftClass]:
        """Candidates (request, draft limit, weight) grouped by (references ahead, probe, critical, limit, weight):
        equal gains ``weight * alpha(n)^j``."""
        by: dict[tuple[int, bool, bool, int, float], DraftClass] = {}
        for req, limit, weight in cands:
            n = self.refs_ahead(req)
            key = (n, req.probe, req.critical, limit, weight)
            c = by.get(key)
            if c is None:
                a = self._alpha(n)
                c = by[key] = DraftClass([weight * a ** j for j in range(1, limit + 1)], probe=req.probe,
                                         critical=req.critical, weight=weight)
            c.members.append(req)
            c.context += req.num_computed_tokens + 0.5
            self._alpha_at[req.request_id] = self._alpha(n)
        return list(by.values())

    def accepted(self, req: Request, num_spec: int) -> int:
        """Drafts of ``req`` the target accepts this step (called by ``SimInstance.execute``)."""
        alpha = self._alpha_at.get(req.request_id, 0.0)
        num_spec = min(num_spec, draft_limit(req, num_spec))
        if num_spec <= 0:
            return 0
        self.drafted += num_spec
        if self.quantum == 1:
            a = 0
            while a < num_spec and self.rng.random() < alpha:
                a += 1
        else:
            mean = expected_accept_len(alpha, num_spec)
            whole = math.floor(mean)
            a = min(num_spec, whole - 1 + (1 if self.rng.random() < mean - whole else 0))
        self.accepted_total += a
        return a

    def _set_progress(self, req: Request) -> None:
        rid = req.request_id
        new = req.num_output_tokens
        lst = self.group_progress[req.group_id or ""]
        old = self.progress.get(rid)
        if old is not None:
            del lst[bisect.bisect_left(lst, old)]
        bisect.insort(lst, new)
        self.progress[rid] = new

    def check_integrity(self) -> None:
        assert 0 <= self.accepted_total <= self.drafted, "accepted more draft tokens than were drafted"
        total = sum(len(v) for v in self.group_progress.values())
        assert total == len(self.progress), "group progress lists and the progress table differ"
        for lst in self.group_progress.values():
            assert lst == sorted(lst), "group progress list out of order"


def _binned(weight: float) -> float:
    """A weight rounded to a quarter octave (1 stays 1)."""
    return 2.0 ** (round(4.0 * math.log2(weight)) / 4.0)
