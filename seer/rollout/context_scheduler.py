"""Orderings of the request buffer: which waiting request gets the next chunk (Seer technique 2).

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
finished sibling; then everything else least generated first. A runaway among the siblings of a short group
reveals itself only by running past them, and `remaining` starts it last, after the long groups; where one
response alone takes longer than the rest of the work (few groups per instance, slow batch-1 steps) that sets
the makespan. A
starvation guard serves the longest-waiting request every `guard_every` dispatches, or whenever it has waited
more than `max_wait` dispatches.

Orderings: `context` (the above), `fifo` (divided rollout without context), `oracle` (longest true remaining
length first: an upper reference that needs replayed lengths) and `group-oracle` (`context` told each group's
true median length: the bound for any estimate learned from siblings). All are heaps with lazy deletion: each push
stamps the request with a fresh `ticket`; entries whose ticket no longer matches are stale and skipped, so push,
pop and estimate updates cost O(log n) (a sibling's finish re-keys its group's waiting members, O(G log n)).
`requeue` undoes a pop within a dispatch round and restores the request's exact position (nothing that a key
depends on changes within a round, and `arrival_seq` is kept).
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from seer.rollout.length_model import (
    censored_median,
    censored_spread,
    group_logs,
    mean_remaining,
    quantile_remaining,
    runaway_posterior,
)
from seer.rollout.types import Group, RolloutRequest

CONTEXT_RANKS = ("remaining", "group", "attained")
_Entry = tuple[Any, ...]  # (key..., ticket, request): tickets are unique, so comparison never reaches the request


@dataclass(frozen=True)
class OrderingConfig:
    """Knobs of the orderings; only `context` uses them."""

    guard_every: int = 64  # every K-th dispatch serves the longest-waiting request (0: never)
    max_wait: int | None = None  # serve any request that has waited more than W dispatches (None: never)
    rank: str = "remaining"  # "remaining" (hedged remaining length, see above) or "group" (paper-literal L_g order)
    spread_prior: float = 0.30  # within-group sd of log length until the rollout has measured its own
    hedge: float = 0.99  # quantile of a request's remaining length that ranks it
    runaway_prior: float = 0.0025  # share of responses that degenerate and run to max_tokens (math_cot: 1/400)

    def __post_init__(self) -> None:
        if self.rank not in CONTEXT_RANKS:
            raise ValueError(f"unknown context rank {self.rank!r}; known: {', '.join(CONTEXT_RANKS)}")
        if self.spread_prior <= 0 or not 0.5 <= self.hedge < 1:
            raise ValueError("spread_prior must be > 0 and hedge in [0.5, 1)")
        if not 0 <= self.runaway_prior < 1 - self.hedge:
            raise ValueError(f"runaway_prior must be in [0, 1 - hedge) = [0, {1 - self.hedge:g}): a request's "
                             "runaway odds never fall below the prior, so a larger one ranks every request as a "
                             "runaway")


class Ordering(ABC):
    """A priority structure over the buffered requests; the request buffer is its only caller."""

    name: ClassVar[str]

    def __init__(self, config: OrderingConfig | None = None) -> None:
        self.config = config or OrderingConfig()
        self._live = 0
        self._next_ticket = 0
        self._next_seq = 0
        self.served = 0  # pops not undone by requeue: the dispatch clock of the starvation guard

    def __len__(self) -> int:
        return self._live

    def push(self, req: RolloutRequest, group: Group) -> None:
        """A request entered the buffer (new, or back from a chunk): it goes behind earlier arrivals."""
        req.arrival_seq = self._next_seq
        req.arrival_served = self.served
        self._next_seq += 1
        self._insert(req, group)

    def requeue(self, req: RolloutRequest, group: Group) -> None:
        """Undo a `pop` of this round: same position, same waiting time."""
        self.served -= 1
        self._insert(req, group)

    def pop(self) -> RolloutRequest | None:
        """Remove and return the next request to dispatch, or None when empty."""
        if self._live == 0:
            return None
        req = self._pop_live()
        req.ticket = -1
        self._live -= 1
        self.served += 1
        return req

    def remove(self, req: RolloutRequest) -> None:
        """Take a specific buffered request out (manual dispatch); its heap entries become stale."""
        if req.ticket < 0:
            raise KeyError(f"request {req.request_id} is not in the ordering")
        req.ticket = -1
        self._live -= 1

    def on_group_update(self, group: Group) -> None:
        """A sibling finished, so the group's length estimate may have changed."""

    def remaining_hint(self, req: RolloutRequest, group: Group) -> float | None:
        """What this ordering believes `req` still has to generate (None: no belief). Instances use it to give
        draft tokens to the requests that bound the makespan."""
        return None


    def _insert(self, req: RolloutRequest, group: Group) -> None:
        req.ticket = self._next_ticket
        self._next_ticket += 1
        self._live += 1
        self._store(req, group)

    @abstractmethod
    def _store(self, req: RolloutRequest, group: Group) -> None: ...

    @abstractmethod
    def _pop_live(self) -> RolloutRequest:
        """Pop the best entry whose ticket is live (one exists: `_live > 0`)."""

    @abstractmethod
    def _live_tickets(self) -> list[int]:
        """Tickets of every non-stale entry, for `check_integrity`."""

    def check_integrity(self, buffered: Iterable[RolloutRequest]) -> None:
        """Every buffered request has exactly one live entry, and nothing else is live."""
        reqs = list(buffered)
        tickets = {r.ticket for r in reqs}
        assert len(reqs) == self._live, f"{self.name}: {self._live} live entries, {len(reqs)} buffered"
        assert all(t >= 0 for t in tickets) and len(tickets) == len(reqs), f"{self.name}: bad tickets"
        live = self._live_tickets()
        assert len(live) == len(set(live)) and set(live) == tickets, f"{self.name}: entries and buffer differ"


def _pop_valid(heap: list[_Entry]) -> RolloutRequest | None:
    while heap:
        entry = heapq.heappop(heap)
        req: RolloutRequest = entry[-1]
        if req.ticket == entry[-2]:
            return req
    return None


def _clean_top(heap: list[_Entry]) -> _Entry | None:
    while heap and heap[0][-1].ticket != heap[0][-2]:
        heapq.heappop(heap)
    return heap[0] if heap else None


def _tickets(heap: list[_Entry]) -> list[int]:
    return [e[-2] for e in heap if e[-1].ticket == e[-2]]


class _KeyedOrdering(Ordering):
    """One heap keyed by `_key(req)`; ties go to the earlier arrival."""

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(config)
        self._heap: list[_Entry] = []

    def _key(self, req: RolloutRequest) -> int:
        return 0

    def _store(self, req: RolloutRequest, group: Group) -> None:
        heapq.heappush(self._heap, (self._key(req), req.arrival_seq, req.ticket, req))

    def _pop_live(self) -> RolloutRequest:
        req = _pop_valid(self._heap)
        assert req is not None
        return req

    def _live_tickets(self) -> list[int]:
        return _tickets(self._heap)


class FifoOrdering(_KeyedOrdering):
    """Plain divided rollout: first come, first served."""

    name = "fifo"


class OracleOrdering(_KeyedOrdering):
    """Longest true remaining length first (needs `true_length`, i.e. a replayed trace)."""

    name = "oracle"

    def _key(self, req: RolloutRequest) -> int:
        if req.true_length is None:
            raise ValueError(f"oracle ordering needs true lengths; request {req.request_id} has none")
        return -(req.true_length - req.generated)

    def remaining_hint(self, req: RolloutRequest, group: Group) -> float | None:
        return float(req.true_length - req.generated) if req.true_length is not None else None


class ContextOrdering(Ordering):
    """Probes shortest-generated-first, then longest estimated remaining length first, with a starvation guard."""

    name = "context"
    MIN_SPREAD_DOF = 16  # within-group degrees of freedom before the rollout's own spread replaces the prior
    REFIT_GROWTH = 1.05  # refit the spread each time the finished count has grown by 5% (O(log n) refits)

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(config)
        self._probes: list[_Entry] = []  # (generated, arrival_seq, ticket, req)
        self._others: list[_Entry] = []  # ((class, value) key, arrival_seq, ticket, req): see _key
        self._waiting: list[_Entry] = []  # (arrival_seq, ticket, req): every live request, for the guard
        self._legacy = _GroupMajor() if self.config.rank == "group" else None
        self._groups: dict[int, Group] = {}
        self._centers: dict[int, float] = {}  # group -> censored-MLE median length (cache, dropped on finish)
        self._ss = 0.0  # pooled within-group sum of squares of log length over completed groups
        self._dof = 0
        self._finishes = 0
        self._next_refit = 1  # refit the spread when this many siblings have finished (geometric schedule)
        self._estimate = self.config.spread_prior  # the EM's state, carried across refits
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
        heapq.heappush(self._waiting, (req.arrival_seq, req.ticket, req))
        if req.is_probe:
            heapq.heappush(self._probes, (req.generated, req.arrival_seq, req.ticket, req))
        elif self._legacy is not None:
            self._legacy.store(req, group)
        else:
            heapq.heappush(self._others, (self._key(req, group), req.arrival_seq, req.ticket, req))

    def _key(self, req: RolloutRequest, group: Group) -> tuple[int, float]:
        """Heap key of a non-probe: (class, value), smallest first. ``remaining``: one class, longest hedged
        remaining first. ``attained``: requests whose hedged remaining is their whole budget (a runaway, or a group
        whose length may reach max_tokens) longest first, then requests that have outgrown every finished
        sibling, then the rest, each of the two least generated first."""
        est = self.estimated_remaining(req, group)
        if self.config.rank != "attained":
            return 0, -est
        if group.finished_lengths and est >= req.max_tokens - req.generated:
            return 0, -est
        if group.finished_lengths and req.generated >= max(group.finished_lengths):
            return 1, float(req.generated)
        return 2, float(req.generated)

    def _rekey(self, req: RolloutRequest, group: Group) -> None:
        """A buffered request gets a fresh entry under the current estimate (its old entries go stale)."""
        req.ticket = self._next_ticket
        self._next_ticket += 1
        self._store(req, group)

    def remaining_hint(self, req: RolloutRequest, group: Group) -> float | None:
        """The expected remaining length (runaway share included); None before any sibling has finished."""
        if not group.finished_lengths:
            return None
        center, sigma = self._length_model(group)
        post = runaway_posterior(center, req.generated, sigma, self.config.runaway_prior)
        typical = mean_remaining(center, req.generated, sigma, req.max_tokens)
        return post * (req.max_tokens - req.generated) + (1.0 - post) * typical

    def on_group_update(self, group: Group) -> None:
        self._centers.pop(group.group_id, None)
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
        if self._legacy is not None:
            self._legacy.update(group)
            return
        if respread:
            for e in list(self._others):
                if e[-1].ticket == e[-2]:
                    self._rekey(e[-1], self._groups[e[-1].group_id])
            self._others = [e for e in self._others if e[-1].ticket == e[-2]]
            heapq.heapify(self._others)
            return
        for req in group.requests:
            if req.ticket >= 0 and not req.is_probe:  # buffered
                self._rekey(req, group)

    # ---- dispatch ----------------------------------------------------------------------------------------
    def _guard_due(self) -> bool:
        every, max_wait = self.config.guard_every, self.config.max_wait
        if every and (self.served + 1) % every == 0:
            return True
        if max_wait is not None:
            top = _clean_top(self._waiting)
            return top is not None and self.served - top[-1].arrival_served > max_wait
        return False

    def _pop_live(self) -> RolloutRequest:
        if self._guard_due():
            req = _pop_valid(self._waiting)
        elif self._legacy is not None:
            req = _pop_valid(self._probes) or self._legacy.pop()
        else:
            req = _pop_valid(self._probes) or _pop_valid(self._others)
        assert req is not None
        return req

    def _live_tickets(self) -> list[int]:
        others = self._legacy.tickets() if self._legacy is not None else _tickets(self._others)
        main = _tickets(self._probes) + others
        assert sorted(main) == sorted(_tickets(self._waiting)), "context: guard heap out of sync"
        assert self.spread > 0 and self._estimate > 0 and self._dof >= 0 and self._ss >= 0, "context: spread corrupt"
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


class _GroupMajor:
    """The paper-literal order of non-probes: the group with the longest L_g first, its members by arrival."""

    def __init__(self) -> None:
        self._members: dict[int, list[_Entry]] = {}  # group -> (arrival_seq, ticket, req) of its non-probes
        self._groups: list[tuple[int, int, int, int]] = []  # (-L_g, group_id, version, group_id)
        self._version: dict[int, int] = {}  # version of a group's newest entry; older entries are stale
        self._listed: set[int] = set()  # groups with a live entry in `_groups`

    def store(self, req: RolloutRequest, group: Group) -> None:
        heapq.heappush(self._members.setdefault(group.group_id, []), (req.arrival_seq, req.ticket, req))
        if group.group_id not in self._listed:
            self._list(group)

    def update(self, group: Group) -> None:
        if group.group_id in self._listed:
            self._list(group)

    def _list(self, group: Group) -> None:
        version = self._version.get(group.group_id, -1) + 1
        self._version[group.group_id] = version
        self._listed.add(group.group_id)
        heapq.heappush(self._groups, (-group.length_estimate, group.group_id, version, group.group_id))

    def pop(self) -> RolloutRequest | None:
        while self._groups:
            _, gid, version, _ = self._groups[0]
            if gid not in self._listed or self._version[gid] != version:
                heapq.heappop(self._groups)
                continue
            members = self._members[gid]
            if _clean_top(members) is None:
                heapq.heappop(self._groups)
                self._listed.discard(gid)
                continue
            req: RolloutRequest = heapq.heappop(members)[-1]
            return req
        return None

    def tickets(self) -> list[int]:
        for gid, heap in self._members.items():
            if _tickets(heap):
                assert gid in self._listed, f"context: group {gid} has waiting requests but is not listed"
        return [t for heap in self._members.values() for t in _tickets(heap)]


ORDERINGS: dict[str, type[Ordering]] = {
    cls.name: cls for cls in (FifoOrdering, ContextOrdering, GroupOracleOrdering, OracleOrdering)
}


def make_ordering(name: str, config: OrderingConfig | None = None) -> Ordering:
    """Build an ordering by registry name (`fifo`, `context`, `group-oracle`, `oracle`)."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; known: {', '.join(sorted(ORDERINGS))}")
    return ORDERINGS[name](config)
