"""Orderings of the request buffer: which waiting request gets the next chunk (Seer technique 2).

Why: in synchronous RL the rollout ends when the longest response ends, so the tail is set by when long
responses *start*. Siblings are alike in length, so one probe per group is run first (shortest-generated-first,
so every group's probe advances evenly and short groups reveal themselves early); a group's length estimate
L_g is its longest finished response (max_tokens before any finishes); all other requests run
longest-estimate-first, so long groups start early. A starvation guard serves the longest-waiting request every
`guard_every` dispatches, or whenever it has waited more than `max_wait` dispatches.

Orderings: `context` (the above), `fifo` (divided rollout without context) and `oracle` (longest true remaining
length first: an upper reference that needs replayed lengths). All are heaps with lazy deletion: each push
stamps the request with a fresh `ticket`; entries whose ticket no longer matches are stale and skipped, so push,
pop and estimate updates cost O(log n). `requeue` undoes a pop within a dispatch round and restores the
request's exact position (keys depend only on `arrival_seq`, which requeue keeps).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from seer.rollout.types import Group, RolloutRequest

_Entry = tuple[Any, ...]  # (key..., ticket, request): tickets are unique, so comparison never reaches the request


@dataclass(frozen=True)
class OrderingConfig:
    """Knobs of the orderings; only `context` uses the starvation guard."""

    guard_every: int = 64  # every K-th dispatch serves the longest-waiting request (0: never)
    max_wait: int | None = None  # serve any request that has waited more than W dispatches (None: never)


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


class ContextOrdering(Ordering):
    """Probes shortest-generated-first, then groups longest-estimate-first, with a starvation guard."""

    name = "context"

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(config)
        self._probes: list[_Entry] = []  # (generated, arrival_seq, ticket, req)
        self._waiting: list[_Entry] = []  # (arrival_seq, ticket, req): every live request, for the guard
        self._members: dict[int, list[_Entry]] = {}  # group -> (arrival_seq, ticket, req) of its non-probes
        self._groups: list[tuple[int, int, int, int]] = []  # (-L_g, group_id, version, group_id)
        self._version: dict[int, int] = {}  # version of a group's newest entry; older entries are stale
        self._listed: set[int] = set()  # groups with a live entry in `_groups`

    def _store(self, req: RolloutRequest, group: Group) -> None:
        heapq.heappush(self._waiting, (req.arrival_seq, req.ticket, req))
        if req.is_probe:
            heapq.heappush(self._probes, (req.generated, req.arrival_seq, req.ticket, req))
            return
        heapq.heappush(self._members.setdefault(group.group_id, []), (req.arrival_seq, req.ticket, req))
        if group.group_id not in self._listed:
            self._list_group(group)

    def on_group_update(self, group: Group) -> None:
        if group.group_id in self._listed:
            self._list_group(group)

    def _list_group(self, group: Group) -> None:
        version = self._version.get(group.group_id, -1) + 1
        self._version[group.group_id] = version
        self._listed.add(group.group_id)
        heapq.heappush(self._groups, (-group.length_estimate, group.group_id, version, group.group_id))

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
        else:
            req = _pop_valid(self._probes) or self._pop_longest_group()
        assert req is not None
        return req

    def _pop_longest_group(self) -> RolloutRequest | None:
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

    def _live_tickets(self) -> list[int]:
        main = _tickets(self._probes) + [t for heap in self._members.values() for t in _tickets(heap)]
        assert sorted(main) == sorted(_tickets(self._waiting)), "context: guard heap out of sync"
        for gid, heap in self._members.items():
            if _tickets(heap):
                assert gid in self._listed, f"context: group {gid} has waiting requests but is not listed"
        return main


ORDERINGS: dict[str, type[Ordering]] = {cls.name: cls for cls in (FifoOrdering, ContextOrdering, OracleOrdering)}


def make_ordering(name: str, config: OrderingConfig | None = None) -> Ordering:
    """Build an ordering by registry name (`fifo`, `context`, `oracle`)."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; known: {', '.join(sorted(ORDERINGS))}")
    return ORDERINGS[name](config)
