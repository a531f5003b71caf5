"""Shared builders for the rollout control-plane tests."""

from __future__ import annotations

from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.types import InstanceState


def big_instance(instance_id: int = 0) -> InstanceState:
    """An instance with room for anything: isolates ordering from placement."""
    return InstanceState(instance_id, free_blocks=10**9, block_size=16)


def order(buf: RequestBuffer, n: int | None = None) -> list[tuple[int, int]]:
    """(group_id, index) of the next `n` dispatches on one roomy instance."""
    return [(a.request.group_id, a.request.index) for a in buf.select([big_instance()], n)]


def run_chunk(buf: RequestBuffer, group_id: int, index: int, new_tokens: int, finished: bool = False) -> None:
    """Dispatch one specific request and complete its chunk."""
    req = buf.groups[group_id].requests[index]
    buf.take(req.request_id, 0)
    buf.on_chunk_done(req.request_id, new_tokens, finished)
