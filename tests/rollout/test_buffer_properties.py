"""Random simulated rollouts: the buffer stays consistent, nothing is over-admitted, every group ends with G."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from seer.rollout.dispatch import DispatchConfig
from seer.rollout.orderings import OrderingConfig
from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.types import InstanceState, RequestState, blocks_for

BLOCK = 4


def usage(buf: RequestBuffer, instance_id: int) -> int:
    """Blocks an instance really holds: running chunks at full size plus KV left resident by paused requests."""
    used = 0
    for req in buf.requests.values():
        if req.state is RequestState.RUNNING and req.running_on == instance_id:
            used += blocks_for(req.context_len + req.chunk_max_tokens(buf.chunk_tokens), BLOCK)
        elif req.state is RequestState.BUFFERED and req.kv_instance == instance_id:
            used += blocks_for(req.kv_tokens, BLOCK)
    return used


def simulate(buf: RequestBuffer, n_instances: int, total_blocks: int, max_running: int, rng: random.Random) -> None:
    running: dict[int, int] = {}  # request id -> max_new_tokens of its chunk
    for _ in range(100_000):
        if buf.all_finished:
            return
        states = [
            InstanceState(i, total_blocks - usage(buf, i), BLOCK, len(buf.running_on(i)), max_running,
                          total_blocks=total_blocks)
            for i in range(n_instances)
        ]
        for a in buf.select(states, n=rng.choice([None, 1, 2])):
            running[a.request_id] = a.max_new_tokens
        for i in range(n_instances):
            assert usage(buf, i) <= total_blocks, "over-admitted"
        buf.check_integrity()
        if not running:  # everything left is blocked by resident KV: the driver evicts it to the pool
            for req in buf.buffered():
                req.kv_instance, req.kv_in_pool = None, True
            continue
        rid = rng.choice(sorted(running))
        cap = running.pop(rid)
        req = buf.requests[rid]
        here = req.running_on
        buf.on_chunk_done(
            rid, rng.randint(0, cap), finished=rng.random() < 0.2,
            kv_instance=rng.choice([here, None]), kv_in_pool=rng.random() < 0.8,
        )
        buf.check_integrity()
    raise AssertionError("rollout did not finish")


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    max_tokens=st.integers(1, 40),
    chunk=st.one_of(st.none(), st.integers(1, 12)),
    n_instances=st.integers(1, 3),
    max_running=st.integers(1, 4),
    ordering=st.sampled_from(["fifo", "context", "oracle"]),
    guard=st.integers(0, 3),
    skips=st.integers(0, 2),
    seed=st.integers(0, 2**31),
)
def test_random_rollouts_end_with_exactly_g_per_group(
    sizes: list[int], max_tokens: int, chunk: int | None, n_instances: int, max_running: int, ordering: str,
    guard: int, skips: int, seed: int,
) -> None:
    rng = random.Random(seed)
    buf = RequestBuffer(
        ordering, chunk_tokens=chunk, dispatch=DispatchConfig(max_skips=skips),
        ordering_config=OrderingConfig(guard_every=guard, max_wait=rng.choice([None, 3])),
    )
    prompt_len = rng.randint(1, 10)
    for size in sizes:
        buf.add_group(prompt_len, size, max_tokens, true_lengths=[rng.randint(0, max_tokens) for _ in range(size)])
    total_blocks = blocks_for(prompt_len + max_tokens, BLOCK) + rng.randint(0, 6)
    simulate(buf, n_instances, total_blocks, max_running, rng)
    assert buf.num_finished == sum(sizes) and buf.num_buffered == buf.num_running == 0
    for group in buf.groups.values():
        assert group.done and len({r.request_id for r in group.requests if r.finished}) == group.size
    assert sum(buf.kv_sources.values()) == sum(r.chunks for r in buf.requests.values())
    buf.check_integrity()
