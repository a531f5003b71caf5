"""The coordinator's view of a remote instance: starts its snapshot has not seen yet stay reserved."""

from __future__ import annotations

from seer.rollout.instances.base import ChunkStart, RequestSpec
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.types import Assignment, KVSource, RolloutRequest
from seer.sampling_params import SamplingParams


class Recorder(RemoteInstanceProxy):
    def __init__(self, snap: dict) -> None:
        super().__init__(0, snap)
        self.sent_numbers: list[int] = []

    def send_start(self, chunk: ChunkStart, number: int) -> None:
        self.sent_numbers.append(number)

    def evict(self, request_id: int) -> int:
        raise NotImplementedError

    def release(self, request_id: int) -> None:
        raise NotImplementedError


def snapshot(free: int, running: int, handled: int) -> dict:
    return {"free_blocks": free, "running": running, "max_running": 8, "total_blocks": 100, "block_size": 16,
            "resident": {}, "has_work": running > 0, "weight_version": 0, "handled": handled}


def chunk(rid: int, blocks: int) -> ChunkStart:
    req = RolloutRequest(rid, 0, rid, 8, 64)
    spec = RequestSpec(rid, 0, rid, (1,) * 8, SamplingParams(max_tokens=64), None, "")
    return ChunkStart(Assignment(req, 0, 16, KVSource.FRESH, blocks), spec, (), 16, reserve=True)


def test_a_snapshot_taken_before_a_start_keeps_it_reserved() -> None:
    proxy = Recorder(snapshot(free=50, running=0, handled=0))
    proxy.start(chunk(1, 10))
    proxy.start(chunk(2, 5))
    assert proxy.sent_numbers == [1, 2]
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2)
    # the worker's step report was taken after it handled start 1 only (start 2 arrived during the step)
    proxy.refresh(snapshot(free=40, running=1, handled=1))
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2)
    proxy.refresh(snapshot(free=35, running=2, handled=2))
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2) and not proxy.unseen


def test_numbering_continues_from_what_the_instance_reports() -> None:
    proxy = Recorder(snapshot(free=50, running=0, handled=7))  # a worker that outlived an earlier proxy
    proxy.start(chunk(1, 1))
    assert proxy.sent_numbers == [8]
