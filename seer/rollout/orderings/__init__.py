"""Orderings of the request buffer: which waiting request gets the next chunk.

- ``context`` (``context.py``): probes first, then longest estimated remaining length (Seer's context-aware
  scheduling; ``rank="group"`` is the paper's group order, ``paper.py``, and ``rank="attained"`` a variant).
- ``fifo`` (``simple.py``): divided rollout without context.
- ``oracle`` (``simple.py``): longest true remaining length first; a reference that needs replayed lengths.
- ``group-oracle`` (``context.py``): ``context`` told each group's true median length, the bound for any
  estimate learned from siblings.
All are built from ``LazyHeap`` (``heap.py``); the length model they read is ``rollout/length_model.py``.
"""

from __future__ import annotations

from seer.rollout.orderings.base import CONTEXT_RANKS, Ordering, OrderingConfig
from seer.rollout.orderings.context import ContextOrdering, GroupOracleOrdering
from seer.rollout.orderings.simple import FifoOrdering, OracleOrdering

__all__ = ["CONTEXT_RANKS", "ORDERINGS", "ContextOrdering", "FifoOrdering", "GroupOracleOrdering", "OracleOrdering",
           "Ordering", "OrderingConfig", "make_ordering"]

ORDERINGS: dict[str, type[Ordering]] = {
    cls.name: cls for cls in (FifoOrdering, ContextOrdering, GroupOracleOrdering, OracleOrdering)
}


def make_ordering(name: str, config: OrderingConfig | None = None) -> Ordering:
    """Build an ordering by registry name (``fifo``, ``context``, ``group-oracle``, ``oracle``)."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; known: {', '.join(sorted(ORDERINGS))}")
    return ORDERINGS[name](config)
