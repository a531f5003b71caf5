"""Grouped speculative decoding inside an engine instance: drafts before each step, feedback after it.

Before scheduling, every running request that is ready to decode asks the adaptive policy for a draft length
(zero when speculation does not pay at this batch size and acceptance) and the draft server for a draft from
its group's sibling responses; the draft goes into ``spec_token_ids`` (tree drafts also set ``spec_parents``)
and the model runner verifies it losslessly. After the step, the accepted tokens are fed back to the draft
server (only committed tokens: a request never drafts from its own future) and the outcome to the policy's
acceptance tracker. Torch-free: the simulator drives the same class with replayed tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Hashable

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.spec.draft_server import DraftRequest, DraftServer
from seer.spec.policy import PolicyConfig, PolicyRequest, SpecPolicy, VerifyCostModel, critical_weights


@dataclass(frozen=True)
class SpecConfig:
    k_branches: int = 1        # 1: single-path drafts; k > 1: tree drafts keeping the top-k branches
    gamma_max: int = 8
    adaptive: bool = True      # False: always draft gamma_max tokens (for measurements)
    tree_tokens: int = 16      # token budget of a tree draft (k > 1)
    context_tokens: int = 64   # suffix of the context sent to the draft server

    def __post_init__(self) -> None:
        if not 1 <= self.gamma_max <= 32:
            raise ValueError(f"gamma_max must be in [1, 32], got {self.gamma_max}")
        if self.k_branches < 1 or self.tree_tokens < 1:
            raise ValueError("k_branches and tree_tokens must be >= 1")


class Speculator:
    def __init__(self, server: DraftServer, policy: SpecPolicy | None, config: SpecConfig | None = None) -> None:
        self.server = server
        self.policy = policy
        self.config = config or SpecConfig()
        if self.config.adaptive and policy is None:
            raise ValueError("adaptive speculation needs a SpecPolicy (a profiled verify cost model)")
        self._fed: dict[str, int] = {}
        self._drafted: dict[str, tuple[int, bool]] = {}  # request -> (draft size, is a tree)
        # virtual time: committed tokens wait here until the step that made them has ended (``publish``)
        self.hold = False
        self._held: list[tuple[str, str, list[int]]] = []
        self.draft_s = 0.0
        self.steps = 0

    @classmethod
    def build(cls, config: SpecConfig, cost: VerifyCostModel | None = None,
              server: DraftServer | None = None) -> Speculator:
        """The speculator ``config`` describes: adaptive ones decide draft lengths from ``cost`` (the engine's
        verify profile; an adaptive config without one is an error, never a silent switch to gamma_max drafts),
        drafting from ``server`` (a new one by default: instances of one process share theirs)."""
        policy = None
        if config.adaptive:
            if cost is None:
                raise ValueError("adaptive speculation needs the engine's verify-cost profile")
            policy = SpecPolicy(cost, PolicyConfig(gamma_max=config.gamma_max))
        return cls(server if server is not None else DraftServer(), policy, config)

    # ------------------------------------------------------------------ groups
    def group_of(self, req: Request) -> str:
        return req.group_id if req.group_id is not None else f"solo:{req.request_id}"

    def ensure_group(self, req: Request) -> None:
        gid = self.group_of(req)
        if not self.server.has_group(gid):
            self.server.register_group(gid, req.prompt_token_ids)
        if req.request_id not in self._fed:
            self._fed[req.request_id] = 0

    def track(self, req: Request) -> None:
        """A request arrives here; tokens it already has were fed by whoever generated them."""
        self.ensure_group(req)
        self._fed[req.request_id] = req.num_output_tokens

    def finish_group(self, group_id: str) -> None:
        if self.server.has_group(group_id):
            self.server.finish_group(group_id)

    # ------------------------------------------------------------------ per step
    @staticmethod
    def _room(req: Request) -> int:
        """KV slots a draft may occupy: those the request's chunk (or budget) has reserved beyond its committed
        tokens, less the bonus token's. Every verified token, a tree's every node, takes a slot, so a draft that
        stays inside them needs no KV beyond what admission reserved for the chunk."""
        left = req.max_output_tokens - req.num_output_tokens - 1
        if req.chunk_end is not None:
            left = min(left, req.chunk_end - req.num_output_tokens - 1)
        return max(0, left)

    def before_schedule(self, scheduler: Scheduler) -> int:
        """Attach drafts to the running requests that decode next step; returns how many asked for one."""
        t0 = time.perf_counter()
        ready = [r for r in scheduler.running if r.num_computed_tokens == r.num_tokens - 1]
        for r in ready:
            self.ensure_group(r)
        if not ready:
            return 0
        room = {r.request_id: self._room(r) for r in ready}
        caps: dict[Hashable, int] = {rid: min(self.config.gamma_max, n) for rid, n in room.items()}
        if self.config.adaptive:
            assert self.policy is not None
            batch = len(scheduler.running) + len(scheduler.waiting)
            weights = critical_weights([r.remaining_hint for r in ready])
            plan = self.policy.plan([PolicyRequest(r.request_id, self.group_of(r), r.probe, caps[r.request_id], w,
                                                   r.num_tokens, r.critical)
                                     for r, w in zip(ready, weights)]) if batch else {}
        else:
            plan = caps
        asks = [(r, plan.get(r.request_id, 0)) for r in ready]
        asks = [(r, g) for r, g in asks if g > 0]
        if asks:
            k = self.config.k_branches
            reqs = [DraftRequest(self.group_of(r), r.request_id, r.all_token_ids()[-self.config.context_tokens:],
                                 g if k == 1 else max(g, min(self.config.tree_tokens, g * k, room[r.request_id])), k,
                                 None if k == 1 else g)
                    for r, g in asks]
            for (r, _), d in zip(asks, self.server.propose(reqs)):
                if len(d):
                    r.spec_token_ids = list(d.token_ids)
                    r.spec_parents = None if d.is_linear else list(d.parents)
                    r.spec_source = d.source
                    self._drafted[r.request_id] = (len(d), not d.is_linear)
        self.draft_s += time.perf_counter() - t0
        self.steps += 1
        return len(asks)

    def after_update(self, out: SchedulerOutput, results: dict[str, StepResult], reqs: dict[str, Request]) -> None:
        """Feed committed tokens to the draft server and verification outcomes to the policy."""
        t0 = time.perf_counter()
        for c in out.chunks:
            req = reqs.get(c.request_id)
            res = results.get(c.request_id)
            if req is None or res is None or not res.token_ids:
                continue
            self.ensure_group(req)
            gid = self.group_of(req)
            _, tree = self._drafted.pop(c.request_id, (0, False))
            if c.num_spec_tokens:
                self.server.record_verification(gid, c.num_spec_tokens, res.num_accepted_spec, 1, c.request_id)
                if self.policy is not None:
                    depth = min(c.num_spec_tokens, self.config.gamma_max) if tree else c.num_spec_tokens
                    self.policy.observe(c.request_id, gid, max(depth, res.num_accepted_spec, 1),
                                        res.num_accepted_spec)
            else:
                self.server.record_verification(gid, 0, 0, 1, c.request_id)
            self._feed(req)
        self.draft_s += time.perf_counter() - t0

    def _feed(self, req: Request) -> None:
        fed = self._fed.get(req.request_id, 0)
        if len(req.output_token_ids) > fed:
            item = (self.group_of(req), req.request_id, req.output_token_ids[fed:])
            if self.hold:
                self._held.append(item)
            else:
                self.server.feed([item])
            self._fed[req.request_id] = len(req.output_token_ids)
        if req.is_finished:
            self._fed.pop(req.request_id, None)

    def publish(self) -> None:
        """Feed the held tokens to the draft server (the step that committed them has ended)."""
        if self._held:
            held, self._held = self._held, []
            self.server.feed(held)

    def forget(self, request_id: str) -> None:
        """A request left this instance (moved elsewhere): its stream stays, our bookkeeping goes."""
        self._fed.pop(request_id, None)
        self._drafted.pop(request_id, None)
