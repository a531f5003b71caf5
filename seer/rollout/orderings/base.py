"""The ordering of the request buffer: which waiting request gets the next chunk, and its knobs.

An ordering is a priority structure over the buffered requests, and the request buffer is its only caller:
``push`` when a request enters the buffer (new, or back from a chunk), ``pop`` the next to dispatch, ``requeue``
to undo a pop within a dispatch round (same position: nothing a key depends on changes within a round, and the
arrival number is kept), ``remove`` for a manual dispatch, and ``on_group_update`` when a sibling finished. Every
push stamps the request with a fresh ``ticket``; entries in the ordering's heaps whose ticket no longer matches
are stale (``heap.py``). Torch-free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from seer.rollout.types import Group, RolloutRequest

CONTEXT_RANKS = ("remaining", "group", "attained")


@dataclass(frozen=True)
class OrderingConfig:
    """Knobs of the orderings; only `context` uses them."""

    guard_every: int = 64  # every K-th dispatch serves the longest-waiting request (0: never)
    max_wait: int | None = None  # serve any request that has waited more than W dispatches (None: never)
    rank: str = "remaining"  # non-probes by "remaining" length, "group" (the paper) or "attained" (context.py)
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

    def on_population(self, median: float | None) -> None:
        """The median length of all the rollout's responses (the unfinished ones censored) was refitted: the
        only yardstick for a group none of whose members has finished."""

    @property
    def hint_inputs(self) -> Hashable:
        """What every ``remaining_hint`` depends on beyond the request's progress and its group's finished
        members: when it changes, every hint may have (cached estimates are dropped)."""
        return None

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
