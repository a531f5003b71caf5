"""The coordinator's view of a remote instance: starts its snapshot has not seen yet stay reserved."""

from __future__ import annotations

from typing import Any

from seer.rollout.instances.base import ChunkStart, RequestSpec
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.types import Assignment, KVSource, RolloutRequest
from seer.sampling_params import SamplingParams
from tests.rollout.fake_transport import FakeTransport, snapshot


def started(link: FakeTransport) -> list[Any]:
    """The numbers of the chunk starts posted, in order."""
    return [args[1] for _, command, args in link.posted if command == "start"]


def chunk(rid: int, blocks: int) -> ChunkStart:
    req = RolloutRequest(rid, 0, rid, 8, 64)
    spec = RequestSpec(rid, 0, rid, (1,) * 8, SamplingParams(max_tokens=64), None, "")
    return ChunkStart(Assignment(req, 0, 16, KVSource.FRESH, blocks), spec, (), 16, reserve_tokens=16)


def test_a_snapshot_taken_before_a_start_keeps_it_reserved() -> None:
    link = FakeTransport()
    proxy = RemoteInstanceProxy(0, snapshot(free=50, running=0, handled=0), link)
    proxy.start(chunk(1, 10))
    proxy.start(chunk(2, 5))
    assert started(link) == [1, 2]
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2)
    # the worker's step report was taken after it handled start 1 only (start 2 arrived during the step)
    proxy.refresh(snapshot(free=40, running=1, handled=1))
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2)
    proxy.refresh(snapshot(free=35, running=2, handled=2))
    assert (proxy.state().free_blocks, proxy.state().running) == (35, 2) and not proxy.unseen


def test_numbering_continues_from_what_the_instance_reports() -> None:
    link = FakeTransport()
    proxy = RemoteInstanceProxy(0, snapshot(free=50, running=0, handled=7), link)  # a host that outlived a proxy
    proxy.start(chunk(1, 1))
    assert started(link) == [8]


def test_a_start_the_snapshot_has_not_seen_is_work() -> None:
    """An idle snapshot taken before a start arrived (a step call that overtook it) still leaves work to step."""
    proxy = RemoteInstanceProxy(0, snapshot(free=50, running=0, handled=0), FakeTransport())
    proxy.start(chunk(1, 1))
    proxy.refresh(snapshot(free=50, running=0, handled=0))
    assert proxy.has_work()
    proxy.refresh(snapshot(free=49, running=0, handled=1))
    assert not proxy.has_work()


def test_evicted_kv_that_comes_back_rides_with_the_next_start() -> None:
    """A host without a shared pool answers an eviction with its KV: the transport holds it for the next start."""
    link = FakeTransport(evicted_kv=(b"kv", {}))
    snap = snapshot(free=40, running=0, handled=0)
    snap["resident"] = {3: 10}
    proxy = RemoteInstanceProxy(0, snap, link)
    assert proxy.evict(3) == 100 and proxy.state().free_blocks == 50 and link.held == {3: (b"kv", {})}
    proxy.start(chunk(3, 1))
    assert link.posted[-1][2][2] == (b"kv", {}) and not link.held


def test_blocks_an_eviction_frees_pay_what_the_instance_owes_first() -> None:
    """A snapshot whose instance owes its waiting chunks 3 blocks more than are free: evicting a 10-block resident
    request leaves 7 to offer, not 10."""
    snap = snapshot(free=-3, running=2, handled=0)
    snap["resident"] = {3: 10}
    proxy = RemoteInstanceProxy(0, snap, FakeTransport(evicted_kv=(b"kv", {})))
    assert proxy.state().free_blocks == 0
    proxy.evict(3)
    assert proxy.state().free_blocks == 7
