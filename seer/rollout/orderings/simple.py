"""Orderings with one fixed key per request: first come first served, and the oracle's longest true remaining.

``fifo`` is divided rollout without context (the ablation); ``oracle`` runs the longest true remaining length
first (LRPT, which makes every response end together): an upper reference that needs a replayed trace's lengths.
Ties go to the earlier arrival.
"""

from __future__ import annotations

from seer.rollout.orderings.base import Ordering, OrderingConfig
from seer.rollout.orderings.heap import LazyHeap
from seer.rollout.types import Group, RolloutRequest


class _KeyedOrdering(Ordering):
    """One heap keyed by ``_key(req)``, then arrival."""

    def __init__(self, config: OrderingConfig | None = None) -> None:
        super().__init__(config)
        self._heap = LazyHeap()

    def _key(self, req: RolloutRequest) -> int:
        return 0

    def _store(self, req: RolloutRequest, group: Group) -> None:
        self._heap.push((self._key(req), req.arrival_seq), req)

    def _pop_live(self) -> RolloutRequest:
        req = self._heap.pop()
        assert req is not None
        return req

    def _live_tickets(self) -> list[int]:
        return self._heap.tickets()


class FifoOrdering(_KeyedOrdering):
    """Plain divided rollout: first come, first served."""

    name = "fifo"


class OracleOrdering(_KeyedOrdering):
    """Longest true remaining length first (needs ``true_length``, i.e. a replayed trace)."""

    name = "oracle"

    def _key(self, req: RolloutRequest) -> int:
        if req.true_length is None:
            raise ValueError(f"oracle ordering needs true lengths; request {req.request_id} has none")
        return -(req.true_length - req.generated)

    def remaining_hint(self, req: RolloutRequest, group: Group) -> float | None:
        return float(req.true_length - req.generated) if req.true_length is not None else None
