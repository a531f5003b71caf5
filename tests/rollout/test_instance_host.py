"""The instance host, what a process and a Ray actor both run: one protocol, answered the same way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.instances.base import ChunkStart, RequestSpec
from seer.rollout.instances.host import HostSpec, InstanceHost
from seer.rollout.types import Assignment, KVSource, RolloutRequest
from seer.sampling_params import SamplingParams
from tests.conftest import TinyModelDir


@pytest.fixture(scope="module")
def host(tiny_model_dir: TinyModelDir) -> InstanceHost:
    cfg = RolloutConfig(engine=replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=48))
    return InstanceHost(HostSpec(0, cfg.instance_engine(str(tiny_model_dir("qwen2", 3))), None, None, None))


def chunk(rid: int, chunk_end: int, source: KVSource = KVSource.FRESH, output: tuple[int, ...] = ()) -> ChunkStart:
    req = RolloutRequest(rid, 0, 0, 8, 32)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = RequestSpec(rid, 0, 0, tuple(range(5, 13)), params, None, "")
    return ChunkStart(Assignment(req, 0, chunk_end - len(output), source, 4), spec, output, chunk_end,
                      reserve_tokens=chunk_end - len(output))


def run_chunk(host: InstanceHost) -> dict[int, list[int]]:
    """Step until the host has no work; the new tokens of each request whose chunk ended."""
    ended: dict[int, list[int]] = {}
    while host.has_work():
        _, _, rep, _ = host.step()
        assert rep is not None
        ended.update({ev.request_id: ev.new_token_ids for ev in rep.events})
    return ended


def test_a_chunk_ends_paused_and_resident(host: InstanceHost) -> None:
    host.handle("start", chunk(1, 4), 1)
    assert list(run_chunk(host)) == [1]
    snap = host.handle("snapshot")
    assert snap["handled"] == 1 and list(snap["resident"]) == [1] and not snap["has_work"]
    start, end, rep, idle = host.handle("step")  # a step with no work answers at once, with a snapshot
    assert rep is None and start == end and idle["handled"] == 1


def test_release_frees_only_a_resident_request(host: InstanceHost) -> None:
    host.handle("start", chunk(2, 4), 2)
    host.handle("release", 2)  # queued, not resident: the coordinator's view was stale, so it stays
    assert list(run_chunk(host)) == [2]
    host.handle("release", 2)
    host.handle("release", 99)  # unknown: nothing to do
    assert 2 not in host.handle("snapshot")["resident"]


def test_an_eviction_answers_with_the_kv_when_the_pool_is_the_hosts_own(host: InstanceHost) -> None:
    host.handle("start", chunk(3, 4), 3)
    out = tuple(run_chunk(host)[3])
    nbytes, kv = host.handle("evict", 3)
    assert nbytes > 0 and kv is not None and kv[1]["tokens"] == 8 + len(out) - 1
    assert 3 not in host.handle("snapshot")["resident"] and not host.inst.pool.contains(3)
    host.handle("start", chunk(3, 8, KVSource.POOL, out), 4, kv)  # handed back with the next chunk: no recompute
    assert list(run_chunk(host)) == [3] and host.inst.stats()["reprefill_tokens"] == 0


def test_the_snapshot_shows_blocks_owed_beyond_those_free(host: InstanceHost) -> None:
    """Waiting chunks promised more KV than is free: the snapshot's balance is negative (the instance's own view
    stops at 0), so blocks an eviction frees later pay that debt before a proxy offers them."""
    free = host.inst.scheduler.block_manager.num_free_blocks
    rids = range(20, 20 + free // 8 + 1)  # 8 prompt + 24 reserved tokens: 8 blocks each, one chunk too many
    for n, rid in enumerate(rids, start=host.handled + 1):
        host.handle("start", chunk(rid, 24), n)
    snap = host.handle("snapshot")
    assert snap["free_blocks"] == free - 8 * len(rids) < 0 and host.inst.state().free_blocks == 0
    for rid in rids:
        host.inst.scheduler.abort(str(rid))
    assert host.handle("snapshot")["free_blocks"] == free


def test_unknown_commands_are_refused(host: InstanceHost) -> None:
    with pytest.raises(ValueError, match="unknown instance command 'inst'"):
        host.handle("inst")
