"""A heap of buffered requests with lazy deletion, the structure every ordering is built from.

Why lazy: a request's key changes whenever its group learns something (a sibling finishes), and it leaves the
buffer when dispatched; finding and fixing its entry in a binary heap is O(n). Instead every push stamps the
request with a fresh ``ticket`` (the ordering does), the entry records it, and an entry whose request no longer
carries its ticket is stale and skipped when it reaches the top. Push, pop and re-keying are then O(log n).
Tickets are unique, so comparing two entries never reaches the requests.
"""

from __future__ import annotations

import heapq
from typing import Any

from seer.rollout.types import RolloutRequest


class LazyHeap:
    def __init__(self) -> None:
        self._entries: list[tuple[Any, int, RolloutRequest]] = []  # (key, ticket, request)

    def push(self, key: Any, req: RolloutRequest) -> None:
        """Add ``req`` under ``key`` (smallest first) with its current ticket."""
        heapq.heappush(self._entries, (key, req.ticket, req))

    @staticmethod
    def _live(entry: tuple[Any, int, RolloutRequest]) -> bool:
        return entry[2].ticket == entry[1]

    def pop(self) -> RolloutRequest | None:
        """The live request with the smallest key, removed; None when no live entry is left."""
        while self._entries:
            entry = heapq.heappop(self._entries)
            if self._live(entry):
                return entry[2]
        return None

    def top(self) -> RolloutRequest | None:
        """The live request with the smallest key, left in place (stale entries above it are dropped)."""
        while self._entries and not self._live(self._entries[0]):
            heapq.heappop(self._entries)
        return self._entries[0][2] if self._entries else None

    def live_requests(self) -> list[RolloutRequest]:
        return [e[2] for e in self._entries if self._live(e)]

    def tickets(self) -> list[int]:
        """Tickets of the live entries (for integrity checks: each buffered request has exactly one)."""
        return [e[1] for e in self._entries if self._live(e)]

    def compact(self) -> None:
        """Drop every stale entry."""
        self._entries = [e for e in self._entries if self._live(e)]
        heapq.heapify(self._entries)
