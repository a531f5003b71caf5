"""The context ordering: probes first, then longest estimated remaining length (Seer technique 2).

Why: in synchronous RL the rollout ends when the longest response ends, so the tail is set by when long
responses *start* and whether they keep running. Siblings are alike in length, so one probe per group is run
first (strict priority, shortest-generated-first, so every group's probe advances evenly and short groups reveal
themselves early). Everything else runs longest *estimated remaining* length first: the oracle's rule (longest
true remaining first, LRPT, which makes every response end together) applied to what the group has revealed.

The estimate (`ContextOrdering.estimated_remaining`, request r of group g, generated g_r):
- No sibling finished yet: the paper's L_g = max_tokens, so the remaining is max_tokens - g_r. Such groups go
  before every group with a finished sibling, and among them the least advanced request goes first.
- Some siblings finished: lengths within a group are modelled as log-normal around the group's median m_g with
  the within-group spread s (`seer/rollout/length_model.py`). m_g is the maximum-likelihood median given the
  finished siblings (observed) and the unfinished ones (right-censored at their generated length: they are known
  to be longer), so a group whose first finisher was its shortest member is not mistaken for a short group. The
  remaining is a high quantile of L_r - g_r given L_r > g_r, with the predictive spread s * sqrt(1 + 1/n_finished).
  A quantile, not the mean, because the makespan is a maximum: a request that has outgrown its finished siblings
  keeps a large remaining estimate instead of dropping to zero (the point estimate "L_g - g_r" starves exactly
  the longest sibling of a group whose probe was short, which is what made the tail). The quantile covers the
  longest of the group's k unfinished siblings with probability `hedge` (0.99): per request it is the
  hedge ** (1 / k) quantile. Siblings ranked alike are dispatched together, and it is the longest of them that
  can end the rollout late; as siblings finish, k falls and so does the estimate.
- Runaways: a small share of responses degenerate (repeat or emit noise) and run to max_tokens whatever their
  siblings did (math_cot has one of 400: 2,110 tokens of noise beside siblings of 164-282). Lengths are modelled
  as that share (`runaway_prior`) plus the log-normal; once a request has outgrown its group so far that the
  posterior probability of being a runaway exceeds 1 - hedge, its remaining is the runaway's, max_tokens - generated.
- s is learned online from every group with a finished sibling, the unfinished siblings censored
  (`censored_spread`, EM), refitted each time the number of finished responses grows by 5%; `spread_prior` (0.30,
  the CASTILLO traces' within-group value, see seer/sim/fitted.json) until 16 degrees of freedom exist. Completed
  groups alone would do (all members finished) were they not the narrow ones mid-rollout: on the qwen2vl-72b
  preset that estimate stayed biased low and cost 3 points of context / oracle. Keys are refreshed when a sibling
  finishes (the group's buffered requests) and when s moves by more than 10% (every buffered request).
No true length is used. This is the default (`rank="remaining"`). `rank="group"` is the paper-literal order:
groups by L_g (longest finished sibling, max_tokens before any finishes), members by arrival. In the simulator
`remaining` reaches 0.975 / 0.975 / 0.949 of oracle on the moonlight / qwen2vl-72b / kimi-k2 presets against
0.925 / 0.932 / 0.872 for `group`; on the real engine the two are within run-to-run noise (README).
`rank="attained"` keeps the estimate but trusts it less: requests whose hedged remaining is their whole budget
(runaways, groups that may run to max_tokens) go first, longest first; then requests that have outgrown every
finished sibling, and the siblings of a group without a finished member one of whose members has outgrown the
median of all the rollout's responses (the request buffer's censored population fit), least generated first;
then the other siblings of groups with a finished member, shortest expected remaining first (finishing a short
group is cheap and exposes a runaway hidden in it); then the siblings of the other groups whose probe still
runs, least generated first. A runaway among the siblings of a short group
reveals itself only by running past them, and `remaining` starts it last, after the long groups; where one
response alone takes longer than the rest of the work (few groups per instance, slow batch-1 steps) that sets
the makespan. A starvation
guard serves the longest-waiting request every `guard_every` dispatches, or whenever it has waited
more than `max_wait` dispatches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import replace

from seer.rollout.length_model import (
    censored_median,
    censored_spread,
    group_logs,
    mean_remaining,
    quantile_remaining,
    runaway_posterior,
)
from seer.rollout.orderings.base import Ordering, OrderingConfig
from seer.rollout.orderings.heap import LazyHeap
from seer.rollout.orderings.paper import GroupMajorQueue
from seer.rollout.types import Group, RolloutRequest


class EstimateQueue:
    """Non-probes by a key computed from the group's length estimate (``ContextOrdering._key``)."""

    def __init__(self, key: Callable[[RolloutRequest, Group], tuple[int, float]]) -> None:
        self._key = key
        self._heap = LazyHeap()

    def store(self, req: RolloutRequest, group: Group) -> None:
        self._heap.push((self._key(req, group), req.arrival_seq), req)

    def to_rekey(self, group: Group | None, respread: bool) -> list[RolloutRequest]:
        """The requests whose key may have moved: every waiting one when the spread moved, else the group's."""
        if respread or group is None:
            return self._heap.live_requests()
        return [r for r in group.requests if r.ticket >= 0 and not r.is_probe]  # buffered

    def compact(self) -> None:
        self._heap.compact()

    def pop(self) -> RolloutRequest | None:
        return self._heap.pop()

    def tickets(self) -> list[int]:
        return self._heap.tickets()


class ContextOrdering(Ordering):
    """Probes shortest-generated-first, then longest estimated remaining length first, with a starvation guard."""

    name = "context"
    MIN_SPREAD_DOF = 16  # within-group degrees of freedom before the rollout's own spread replaces the prior
    REFIT_GROWTH = 1.05  # refit the spread each time the finished count has grown by 5% (O(log n) refits)

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(config)
        self._probes = LazyHeap()  # by generated tokens
        self._waiting = LazyHeap()  # every waiting request by arrival, for the starvation guard
        self._others: EstimateQueue | GroupMajorQueue = (
            GroupMajorQueue() if self.config.rank == "group" else EstimateQueue(self._key))
        self._groups: dict[int, Group] = {}
        self._centers: dict[int, float] = {}  # group -> censored-MLE median length (cache, dropped on finish)
        # group -> request -> (generated, spread, remaining_hint): the hint changes only with these and the
        # group's center, and critical-path placement asks it of every unfinished request every dispatch round
        self._hints: dict[int, dict[int, tuple[int, float, float]]] = {}
        self._ss = 0.0  # pooled within-group sum of squares of log length over completed groups
        self._dof = 0
        self._finishes = 0
        self._next_refit = 1  # refit the spread when this many siblings have finished (geometric schedule)
        self._estimate = self.config.spread_prior  # the EM's state, carried across refits
        self.population_median: float | None = None  # all responses' median length (``on_population``)
        self._shown_long: set[int] = set()  # groups without a finished member, one of which outgrew that median
        self.spread = self.config.spread_prior  # the within-group spread the current keys were computed with

    # ---- the estimate ------------------------------------------------------------------------------------
    def _refit_spread(self) -> float:
        """The within-group spread from every group with a finished sibling, unfinished ones censored
        (``censored_spread``); the prior until MIN_SPREAD_DOF degrees of freedom exist."""
        partial = (group_logs(g) for g in self._groups.values() if g.finished_lengths and not g.done)
        self._estimate, dof = censored_spread(partial, self._estimate, self._ss, self._dof)
        return self._estimate if dof >= self.MIN_SPREAD_DOF else self.config.spread_prior

    def _length_model(self, group: Group) -> tuple[float, float]:
        """(median, predictive sd of log length) of a group with a finished sibling; the median is cached."""
        center = self._centers.get(group.group_id)
        if center is None:
            center = self._centers[group.group_id] = censored_median(group, self.spread)
        return center, self.spread * math.sqrt(1.0 + 1.0 / len(group.finished_lengths))

    def estimated_remaining(self, req: RolloutRequest, group: Group) -> float:
        """What `req` still has to generate, hedged: the quantile at which the longest of its group's k unfinished
        siblings stays below it with probability `hedge` (level hedge ** (1 / k)), from the finished siblings."""
        if not group.finished_lengths:
            return req.max_tokens - req.generated + 0.5  # L_g = max_tokens: above every known group
        center, sigma = self._length_model(group)
        if runaway_posterior(center, req.generated, sigma, self.config.runaway_prior) > 1.0 - self.config.hedge:
            return float(req.max_tokens - req.generated)  # the hedge quantile is the runaway's: max_tokens
        level = self.config.hedge ** (1.0 / max(1, group.size - len(group.finished_lengths) - group.aborted))
        return quantile_remaining(center, req.generated, sigma, level, req.max_tokens)

    # ---- heaps -------------------------------------------------------------------------------------------
    def _store(self, req: RolloutRequest, group: Group) -> None:
        self._groups[group.group_id] = group
        self._waiting.push(req.arrival_seq, req)
        if req.is_probe:
            self._probes.push((req.generated, req.arrival_seq), req)
        else:
            self._others.store(req, group)
        if group.group_id not in self._shown_long and self._shows_long(group):
            self._shown_long.add(group.group_id)  # its buffered siblings now rank as a long group's
            for sibling in self._others.to_rekey(group, False):
                if sibling is not req:
                    self._rekey(sibling, group)

    def _shows_long(self, group: Group) -> bool:
        """No member has finished, and one has outgrown the population median (set only under the attained
        rank, ``on_population``)."""
        median = self.population_median
        return (median is not None and not group.finished_lengths
                and max(r.generated for r in group.requests) >= median)

    def _key(self, req: RolloutRequest, group: Group) -> tuple[int, float]:
        """Heap key of a non-probe: (class, value), smallest first. ``remaining``: one class, longest hedged
        remaining first. ``attained``: (0) requests whose hedged remaining is their whole budget (a runaway, or a
        group whose length may reach max_tokens), longest first; (1) requests that have outgrown every finished
        sibling, and the siblings of a group shown long before any member finished (``on_population``), least
        generated first; (2) the other siblings of groups with a finished member, shortest expected remaining
        first, because finishing a short group costs little and is what exposes a runaway hidden in it; (3) the
        siblings of the other groups whose probe still runs, least generated first."""
        est = self.estimated_remaining(req, group)
        if self.config.rank != "attained":
            return 0, -est
        if not group.finished_lengths:
            return (1 if group.group_id in self._shown_long else 3), float(req.generated)
        if est >= req.max_tokens - req.generated:
            return 0, -est
        if req.generated >= max(group.finished_lengths):
            return 1, float(req.generated)
        center, sigma = self._length_model(group)
        return 2, mean_remaining(center, req.generated, sigma, req.max_tokens)

    def _rekey(self, req: RolloutRequest, group: Group) -> None:
        """A buffered request gets a fresh entry under the current estimate (its old entries go stale)."""
        req.ticket = self._next_ticket
        self._next_ticket += 1
        self._store(req, group)

    @property
    def hint_inputs(self) -> Hashable:
        return self.spread

    def remaining_hint(self, req: RolloutRequest, group: Group) -> float | None:
        """The expected remaining length (runaway share included); None before any sibling has finished."""
        if not group.finished_lengths:
            return None
        cache = self._hints.setdefault(group.group_id, {})
        hit = cache.get(req.request_id)
        if hit is not None and hit[0] == req.generated and hit[1] == self.spread:
            return hit[2]
        center, sigma = self._length_model(group)
        post = runaway_posterior(center, req.generated, sigma, self.config.runaway_prior)
        typical = mean_remaining(center, req.generated, sigma, req.max_tokens)
        hint = post * (req.max_tokens - req.generated) + (1.0 - post) * typical
        cache[req.request_id] = (req.generated, self.spread, hint)
        return hint

    POPULATION_MOVE = 0.1  # a population median that moved by less leaves the keys as they are

    def on_population(self, median: float | None) -> None:
        """The attained rank counts a group none of whose members has finished as shown long once one member
        has outgrown the rollout's median response, and ranks its siblings with the requests that outgrew their
        finished siblings: siblings are alike in length, and least generated first among the untested groups
        would start the lagging members of a long group last."""
        old = self.population_median
        if self.config.rank != "attained" or median == old or (
                median is not None and old is not None and abs(median - old) <= self.POPULATION_MOVE * old):
            return
        self.population_median = median
        self._shown_long = {gid for gid, g in self._groups.items() if self._shows_long(g)}
        assert isinstance(self._others, EstimateQueue)  # the attained rank keys by estimate
        for req in self._others.to_rekey(None, True):
            self._rekey(req, self._groups[req.group_id])
        self._others.compact()

    def on_group_update(self, group: Group) -> None:
        self._centers.pop(group.group_id, None)
        self._hints.pop(group.group_id, None)
        respread = False
        self._finishes += 1
        if group.done:  # complete groups enter the spread exactly, once
            logs = group_logs(group)[0]
            if len(logs) > 1:  # aborted members leave fewer lengths, maybe none
                mean = sum(logs) / len(logs)
                self._ss += sum((x - mean) ** 2 for x in logs)
                self._dof += len(logs) - 1
        if self._finishes >= self._next_refit:
            self._next_refit = max(self._finishes + 1, math.ceil(self._finishes * self.REFIT_GROWTH))
            measured = self._refit_spread()
            if measured > 0 and abs(measured - self.spread) > 0.1 * self.spread:
                self.spread, respread = measured, True
                self._centers.clear()
        for req in self._others.to_rekey(group, respread):
            self._rekey(req, self._groups[req.group_id])
        if respread:
            self._others.compact()

    # ---- dispatch ----------------------------------------------------------------------------------------
    def _guard_due(self) -> bool:
        every, max_wait = self.config.guard_every, self.config.max_wait
        if every and (self.served + 1) % every == 0:
            return True
        if max_wait is not None:
            top = self._waiting.top()
            return top is not None and self.served - top.arrival_served > max_wait
        return False

    def _pop_live(self) -> RolloutRequest:
        if self._guard_due():
            req = self._waiting.pop()
        else:
            req = self._probes.pop() or self._others.pop()
        assert req is not None
        return req

    def _live_tickets(self) -> list[int]:
        main = self._probes.tickets() + self._others.tickets()
        assert sorted(main) == sorted(self._waiting.tickets()), "context: guard heap out of sync"
        assert self.spread > 0 and self._estimate > 0 and self._dof >= 0 and self._ss >= 0, "context: spread corrupt"
        assert self._shown_long <= set(self._groups), "context: a group shown long that the ordering never saw"
        return main


class GroupOracleOrdering(ContextOrdering):
    """`context` told each group's true typical length: the most a sibling-based estimate could ever learn.

    Once a group has a finished sibling (when `context` starts estimating it), its median is the geometric mean
    of its true lengths, what infinitely many siblings would reveal; which sibling is the long one stays unknown
    and the spread is learned as in `context`. So the gap from here to `oracle` is within-group noise that no
    ordering learning from siblings can remove, and the gap from `context` to here is what a better estimator
    could still win. A reference that needs replayed lengths, like `oracle`. It always ranks by remaining length
    (the paper-literal `group` rank reads only the longest finished sibling, so true medians would change nothing).
    """

    name = "group-oracle"

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(replace(config or OrderingConfig(), rank="remaining"))

    def _store(self, req: RolloutRequest, group: Group) -> None:
        if group.true_lengths is None:
            raise ValueError(f"group-oracle ordering needs true lengths; group {group.group_id} has none")
        super()._store(req, group)

    def _length_model(self, group: Group) -> tuple[float, float]:
        assert group.true_lengths is not None  # checked when its requests arrive
        logs = [math.log(max(n, 1)) for n in group.true_lengths]
        return math.exp(sum(logs) / len(logs)), self.spread
