"""Request buffer and dispatcher: placement, fit-only admission, KV sources, errors, static split."""

from __future__ import annotations

import pytest

from seer.rollout.dispatch import DispatchConfig, reserved_tokens
from seer.rollout.policies import instance_of_group
from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.types import InstanceState, KVSource, RequestState, blocks_for, chunk_blocks_needed

from .helpers import run_chunk


def one_group_buffer(size: int = 1, prompt_len: int = 16, max_tokens: int = 100, chunk: int = 16,
                     **dispatch: int | bool) -> RequestBuffer:
    buf = RequestBuffer("fifo", chunk_tokens=chunk, dispatch=DispatchConfig(**dispatch))
    buf.add_group(prompt_len, size, max_tokens)
    return buf


def test_chunk_max_tokens_is_capped_by_remaining_budget() -> None:
    buf = one_group_buffer(max_tokens=40, chunk=16)
    req = buf.requests[0]
    assert req.chunk_max_tokens(16) == 16 and req.chunk_max_tokens(None) == 40
    run_chunk(buf, 0, 0, 30)
    [a] = buf.select([InstanceState(0, 100, 16)])
    assert a.max_new_tokens == 10


def test_blocks_needed_counts_resident_kv_only_on_its_holder() -> None:
    buf = one_group_buffer(prompt_len=20)
    req = buf.requests[0]
    req.kv_instance, req.kv_tokens = 0, 20
    here, there = InstanceState(0, 0, 16), InstanceState(1, 0, 16)
    assert chunk_blocks_needed(req, there, 16) == blocks_for(36, 16) == 3
    assert chunk_blocks_needed(req, here, 16) == 3 - blocks_for(20, 16) == 1


def test_prefers_the_instance_holding_the_kv() -> None:
    buf = one_group_buffer()
    buf.take(0, 0)
    buf.on_chunk_done(0, 16, kv_instance=0, kv_in_pool=True)
    holder, roomy = InstanceState(0, 2, 16), InstanceState(1, 100, 16)
    [a] = buf.select([holder, roomy])
    assert (a.instance_id, a.kv_source) == (0, KVSource.LOCAL)
    assert a.blocks_reserved == blocks_for(48, 16) - blocks_for(32, 16) == 1
    assert (holder.free_blocks, holder.running, roomy.free_blocks) == (1, 1, 100)


def test_a_chunk_reserves_only_its_first_tokens_unless_critical() -> None:
    buf = one_group_buffer(prompt_len=20, reserve_tokens=4)
    inst = InstanceState(0, 100, 16)
    [a] = buf.select([inst])
    assert (a.max_new_tokens, a.reserve_tokens, a.blocks_reserved) == (16, 4, blocks_for(24, 16))
    assert inst.free_blocks == 100 - 2
    assert reserved_tokens(16, 4, critical=False) == 4 and reserved_tokens(16, 4, critical=True) == 16
    assert reserved_tokens(16, None, critical=False) == 16 and reserved_tokens(2, 4, critical=False) == 2
    with pytest.raises(ValueError, match="reserve_tokens"):
        DispatchConfig(reserve_tokens=0)


def test_moves_to_the_roomiest_instance_through_the_pool_when_the_holder_is_full() -> None:
    buf = one_group_buffer()
    buf.take(0, 0)
    buf.on_chunk_done(0, 16, kv_instance=0, kv_in_pool=True)
    instances = [InstanceState(0, 0, 16), InstanceState(1, 50, 16), InstanceState(2, 80, 16)]
    [a] = buf.select(instances)
    assert (a.instance_id, a.kv_source, a.blocks_reserved) == (2, KVSource.POOL, 3)
    assert buf.kv_sources[KVSource.POOL] == 1 and buf.reprefill_tokens == 0


def test_kv_affinity_yields_to_an_overloaded_holder() -> None:
    def place(spread: int | None, holder_running: int) -> KVSource:
        buf = one_group_buffer(affinity_spread=spread)
        buf.take(0, 0)
        buf.on_chunk_done(0, 16, kv_instance=0, kv_in_pool=True)
        holder = InstanceState(0, 50, 16, running=holder_running, max_running=64)
        [a] = buf.select([holder, InstanceState(1, 40, 16, running=0, max_running=64)])
        assert buf.affinity_yields == (a.kv_source is KVSource.POOL)
        return a.kv_source

    assert place(None, 40) is KVSource.LOCAL   # unbounded affinity: stays however loaded
    assert place(32, 32) is KVSource.LOCAL     # within the spread
    assert place(32, 33) is KVSource.POOL      # beyond it: moved to the other instance with its KV


def test_lost_kv_is_recomputed_and_counted() -> None:
    buf = one_group_buffer(prompt_len=10)
    buf.take(0, 0)
    buf.on_chunk_done(0, 16, kv_instance=None, kv_in_pool=False)
    [a] = buf.select([InstanceState(1, 50, 16)])
    assert a.kv_source is KVSource.RECOMPUTE and a.reprefill_tokens == 26 == buf.reprefill_tokens


def test_ties_go_to_the_least_loaded_instance() -> None:
    buf = one_group_buffer(size=1)
    instances = [InstanceState(0, 40, 16, running=3), InstanceState(1, 40, 16, running=1)]
    [a] = buf.select(instances)
    assert a.instance_id == 1 and a.kv_source is KVSource.FRESH


def test_spreads_over_instances_by_free_kv() -> None:
    buf = RequestBuffer("fifo", chunk_tokens=16)
    for _ in range(4):
        buf.add_group(16, 1, 100)  # four prompts; each chunk needs 2 blocks
    instances = [InstanceState(0, 4, 16), InstanceState(1, 5, 16)]
    placed = [a.instance_id for a in buf.select(instances)]
    assert placed == [1, 0, 1, 0]
    assert [i.free_blocks for i in instances] == [0, 1]
    buf.check_integrity()


def test_siblings_start_where_their_prompt_is_cached() -> None:
    buf = one_group_buffer(size=4, prompt_len=16, chunk=16)  # each chunk needs 2 blocks
    instances = [InstanceState(0, 4, 16), InstanceState(1, 5, 16)]
    placed = [a.instance_id for a in buf.select(instances)]
    # the first goes to the roomiest instance; its siblings follow while they fit, then a second home opens
    assert placed == [1, 1, 0, 0]
    assert buf.prompt_homes == {0: [1, 0]}
    buf.check_integrity()


def test_a_prompt_home_yields_when_overloaded_and_is_forgotten_when_the_group_ends() -> None:
    def place(home_running: int) -> int:
        buf = one_group_buffer(size=2, prompt_len=16, chunk=16, affinity_spread=2)
        run_chunk(buf, 0, 0, 16, finished=True)
        assert buf.prompt_homes == {0: [0]}
        [a] = buf.select([InstanceState(0, 40, 16, running=home_running), InstanceState(1, 50, 16)])
        buf.on_chunk_done(a.request_id, 16, finished=True)
        assert buf.prompt_homes == {}
        buf.check_integrity()
        return a.instance_id

    assert place(2) == 0  # within the spread: the home, though the other instance has more free KV
    assert place(3) == 1  # beyond it: the roomiest instance


def test_never_over_admits_and_respects_slots() -> None:
    buf = one_group_buffer(size=20, prompt_len=30, chunk=40)  # 70 tokens: 5 blocks of 16
    instances = [InstanceState(0, 12, 16), InstanceState(1, 100, 16, max_running=3), InstanceState(2, 9, 16)]
    out = buf.select(instances)
    assert len(out) == 2 + 3 + 1
    assert all(i.free_blocks >= 0 for i in instances) and instances[1].running == 3
    assert buf.num_buffered == 14 and buf.num_running == 6
    buf.check_integrity()


def test_dead_instances_get_nothing_and_n_caps_the_round() -> None:
    buf = one_group_buffer(size=5)
    instances = [InstanceState(0, 100, 16, alive=False), InstanceState(1, 10, 16)]
    assert {a.instance_id for a in buf.select(instances, n=2)} == {1}
    assert buf.num_running == 2


def test_head_of_line_blocks_unless_skips_are_allowed() -> None:
    for skips, expected in ((0, 0), (1, 1)):
        buf = RequestBuffer("fifo", chunk_tokens=16, dispatch=DispatchConfig(max_skips=skips))
        buf.add_group(200, 1, 100)  # needs 14 blocks
        buf.add_group(8, 1, 100)  # needs 2 blocks
        out = buf.select([InstanceState(0, 4, 16)])
        assert len(out) == expected and all(a.request.group_id == 1 for a in out)
        assert buf.ordering.pop() is buf.requests[0]  # the skipped request kept its place


def test_chunk_that_can_never_fit_is_an_error_and_loses_nothing() -> None:
    buf = one_group_buffer(prompt_len=100)
    with pytest.raises(ValueError, match="largest instance"):
        buf.select([InstanceState(0, 4, 16, total_blocks=4)])
    buf.check_integrity()
    assert buf.num_buffered == 1


def test_reaching_max_tokens_finishes_with_length() -> None:
    buf = one_group_buffer(max_tokens=20)
    run_chunk(buf, 0, 0, 16)
    run_chunk(buf, 0, 0, 4)
    req = buf.requests[0]
    assert req.finished and req.finish_reason == "length" and buf.all_finished
    assert req.instance_history == [0, 0] and req.chunks == 2
    buf.check_integrity()


def test_bad_completions_and_groups_are_rejected() -> None:
    buf = one_group_buffer(max_tokens=20)
    with pytest.raises(ValueError, match="not running"):
        buf.on_chunk_done(0, 1)
    buf.take(0, 0)
    with pytest.raises(ValueError, match="exceeds max_tokens"):
        buf.on_chunk_done(0, 21)
    with pytest.raises(ValueError, match="not in the buffer"):
        buf.take(0, 1)
    for bad in ({"size": 0}, {"max_tokens": 0}, {"prompt_len": 0}):
        with pytest.raises(ValueError):
            buf.add_group(**{"prompt_len": 4, "size": 2, "max_tokens": 8, **bad})
    with pytest.raises(ValueError, match="already added"):
        buf.add_group(4, 2, 8, group_id=0)
    with pytest.raises(ValueError, match="true_lengths"):
        buf.add_group(4, 2, 8, true_lengths=[1])


def test_instance_failure_returns_running_requests_to_the_buffer() -> None:
    buf = one_group_buffer(size=3)
    buf.select([InstanceState(0, 100, 16)])
    for req in buf.running_on(0):
        buf.on_chunk_done(req.request_id, 0, kv_instance=None, kv_in_pool=False)
    assert buf.num_buffered == 3 and buf.running_on(0) == []
    assert {a.kv_source for a in buf.select([InstanceState(1, 100, 16)])} == {KVSource.FRESH}
    buf.check_integrity()


def test_select_pinned_follows_the_static_split() -> None:
    buf = RequestBuffer("fifo", chunk_tokens=None)
    for _ in range(5):
        buf.add_group(4, 2, 50)
    out = buf.select_pinned(instance_of_group(list(buf.groups), 2))
    assert [a.instance_id for a in out] == [0] * 6 + [1] * 4
    assert all(a.max_new_tokens == 50 and a.blocks_reserved == 0 for a in out)
    assert all(r.state is RequestState.RUNNING for r in buf.requests.values())
    buf.check_integrity()


def test_select_pinned_rejects_an_incomplete_split_without_dispatching() -> None:
    buf = RequestBuffer("fifo")
    buf.add_group(4, 2, 50)
    buf.add_group(4, 2, 50)
    with pytest.raises(KeyError, match=r"groups \[1\]"):
        buf.select_pinned({0: 0})
    assert buf.num_buffered == 4
    buf.check_integrity()


def test_an_aborted_response_is_no_evidence_of_its_groups_length() -> None:
    buf = RequestBuffer("context", chunk_tokens=16)
    group = buf.add_group(8, 3, 100)
    run_chunk(buf, 0, 0, 16, finished=True)                       # the probe ends at 16
    run_chunk(buf, 0, 1, 16)                                       # a sibling pauses after 16 tokens ...
    buf.abort(1)                                                   # ... and its client goes away
    buf.take(2, 0)
    buf.on_chunk_done(2, 5, True, "abort")                         # a running one is aborted at its chunk end
    assert group.finished_lengths == [16] and group.aborted == 2 and group.done and buf.all_finished
    assert [buf.requests[r].finish_reason for r in (1, 2)] == ["abort", "abort"]
    buf.check_integrity()
