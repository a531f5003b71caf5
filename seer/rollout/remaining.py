"""The estimated remaining work of a rollout, kept current by the events that change it.

Why: critical-path placement (critical_path.py) weighs the longest believed remaining lengths against all the
rest of the work, every dispatch round. Estimating every unfinished request each round costs rounds x requests,
which grows with the square of the cluster (64 instances: most of a simulation's time). Yet a request's estimate
changes only when it generates tokens (its chunk returns), when a sibling finishes (its group's length model
moves), or when a rollout-wide input of the estimate moves (the population fit, the ordering's spread). So each
request's estimate is cached here, marked stale by those events and recomputed at the next ``refresh``; the total
is kept as a running sum and the beliefs sit in a lazy max-heap, so a round costs what changed plus the few
longest requests the rule looks at. Torch-free.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Hashable

from seer.rollout.types import RolloutRequest

Estimate = Callable[[RolloutRequest], tuple[float, bool]]


class RemainingWork:
    """Every unfinished request's (estimate, is-a-belief), their sum, and the beliefs longest first."""

    def __init__(self) -> None:
        self._unfinished: dict[int, RolloutRequest] = {}
        self._value: dict[int, tuple[float, bool]] = {}
        self._stale: dict[int, RolloutRequest] = {}
        self._version: dict[int, int] = {}  # request id -> version of its live heap entry
        self._heap: list[tuple[float, int, int]] = []  # (-estimate, request id, version) of beliefs
        self._inputs: Hashable = None  # the rollout-wide inputs the cached estimates were computed with
        self._context: dict[int, int] = {}  # request id -> its context length at its last refresh
        self.total = 0.0
        self.context_total = 0  # the unfinished requests' context lengths, summed (KV they hold or will)

    def __len__(self) -> int:
        return len(self._unfinished)

    @property
    def mean_context(self) -> float:
        """The unfinished requests' mean context length (prompt and generated tokens)."""
        return self.context_total / len(self._unfinished) if self._unfinished else 0.0

    def add(self, req: RolloutRequest) -> None:
        """A new unfinished request (estimated at the next refresh)."""
        self._unfinished[req.request_id] = req
        self._stale[req.request_id] = req

    def touch(self, req: RolloutRequest) -> None:
        """Its estimate may have changed (it generated tokens, or a sibling finished)."""
        if req.request_id in self._unfinished:
            self._stale[req.request_id] = req

    def remove(self, req: RolloutRequest) -> None:
        """It finished: its work leaves the total."""
        rid = req.request_id
        self._unfinished.pop(rid, None)
        self._stale.pop(rid, None)
        old = self._value.pop(rid, None)
        if old is not None:
            self.total -= old[0]
        self.context_total -= self._context.pop(rid, 0)
        self._version.pop(rid, None)

    def refresh(self, estimate: Estimate, inputs: Hashable) -> None:
        """Recompute the stale estimates; all of them when ``inputs`` (what every estimate depends on) moved."""
        if inputs != self._inputs:
            self._inputs = inputs
            self._stale = dict(self._unfinished)
            self._value.clear()
            self._version.clear()
            self._heap.clear()
            self.total = 0.0
        for rid, req in self._stale.items():
            self.context_total += req.context_len - self._context.get(rid, 0)
            self._context[rid] = req.context_len
            old = self._value.get(rid)
            new = estimate(req)
            if old is not None:
                if old == new:
                    continue
                self.total -= old[0]
            self._value[rid] = new
            self.total += new[0]
            version = self._version.get(rid, -1) + 1
            self._version[rid] = version
            if new[1]:
                heapq.heappush(self._heap, (-new[0], rid, version))
        if self._stale and len(self._heap) > 4 * len(self._unfinished) + 64:
            self._compact()
        self._stale = {}

    def _compact(self) -> None:
        """Drop stale heap entries, and re-add the total exactly (the running sum drifts by rounding)."""
        self._heap = [e for e in self._heap if self._version.get(e[1]) == e[2]]
        heapq.heapify(self._heap)
        self.total = math.fsum(v for v, _ in self._value.values())

    def longest(self) -> Generator[tuple[float, RolloutRequest], None, None]:
        """Beliefs, longest first (ties: lowest request id). Take what you need and close the iterator: the
        entries taken return to the heap then."""
        taken: list[tuple[float, int, int]] = []
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                if self._version.get(entry[1]) != entry[2]:
                    continue  # stale: the request was re-estimated or finished
                taken.append(entry)
                yield -entry[0], self._unfinished[entry[1]]
        finally:
            for entry in taken:
                heapq.heappush(self._heap, entry)

    def check_integrity(self, estimate: Estimate | None = None) -> None:
        """The cache covers exactly the unfinished requests; with ``estimate``, every fresh entry is current."""
        assert set(self._value) | set(self._stale) >= set(self._unfinished), "an unfinished request is untracked"
        assert set(self._value) <= set(self._unfinished), "a finished request is still counted"
        assert set(self._context) == set(self._value), "context lengths and estimates cover different requests"
        assert self.context_total == sum(self._context.values()), "the context total drifted"
        exact = math.fsum(v for v, _ in self._value.values())
        assert abs(exact - self.total) <= 1e-6 * max(1.0, abs(exact)), "the running total drifted"
        live = {e[1] for e in self._heap if self._version.get(e[1]) == e[2]}
        assert live == {rid for rid, (_, known) in self._value.items() if known}, "heap and beliefs differ"
        if estimate is not None:
            for rid, value in self._value.items():
                if rid not in self._stale:
                    assert estimate(self._unfinished[rid]) == value, f"request {rid}: a stale estimate is cached"
