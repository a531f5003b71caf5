import random

import pytest

from seer.engine.block_manager import BlockManager
from seer.engine.decode_reserve import DecodeReserve, DecodeReserveConfig
from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerConfig
from seer.sampling_params import SamplingParams
from tests.engine.fake_model import reference, run


def fixed_batch(reserve: DecodeReserveConfig | None, num_blocks: int = 120) -> tuple[Scheduler, dict[str, list[int]]]:
    """32 responses of 96 tokens each (ignore_eos) behind 24-token prompts, in a cache that holds a third of them."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=512, decode_reserve=reserve), BlockManager(num_blocks, 16))
    expect = {}
    for i in range(32):
        prompt = [i % 7 + 1] * 24
        s.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=96, ignore_eos=True)))
        expect[f"r{i}"] = reference(prompt, 96)
    return s, expect


@pytest.mark.parametrize("bad", [dict(init=0.5, floor=0.6), dict(init=1.2), dict(floor=-0.1), dict(window=0)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="DecodeReserveConfig"):
        DecodeReserveConfig(**bad)


def finished(used: int, max_tokens: int) -> Request:
    req = Request("f", [1, 2, 3], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    for t in range(used):
        req.append_output(t, 0.0)
    return req


def test_ratio_learns_from_finished_requests_and_rises_on_preemption():
    r = DecodeReserve(DecodeReserveConfig(init=1.0, floor=0.1, window=4), block_size=16, max_model_len=4096)
    for _ in range(20):
        r.observe_finish(finished(100, 100))  # responses that use their whole budget keep it at 1
    assert r.ratio == 1.0
    for _ in range(40):
        r.observe_finish(finished(25, 100))
        r.check_integrity()
    assert r.ratio == pytest.approx(0.25, abs=1e-3)  # it converges to the share of the budget responses use
    for _ in range(40):
        r.observe_finish(finished(0, 100))
    assert r.ratio == 0.1  # never below the floor
    r.observe_preemption()
    assert r.ratio == pytest.approx(0.55)  # halfway back to 1


def test_future_blocks_stop_at_chunk_end_and_model_length():
    r = DecodeReserve(DecodeReserveConfig(), block_size=16, max_model_len=100)
    req = Request("a", [1] * 20, SamplingParams(max_tokens=500, ignore_eos=True))
    assert r.future_blocks(req, allocated_tokens=32) == 5  # 68 tokens to the model length
    req.chunk_end = 40
    assert r.future_blocks(req, allocated_tokens=32) == 2  # divided rollout: 28 tokens to the chunk end
    assert r.future_blocks(req, allocated_tokens=64) == 0


def test_full_reserve_removes_preemption_of_fixed_length_batch():
    """Every response runs to max_tokens: reserving all of it admits only what can finish, so nothing is
    recomputed, and the tokens are those of an uninterrupted run."""
    plain, expect = fixed_batch(None)
    assert run(plain) == expect
    assert plain.stats.preemptions > 0 and plain.stats.reprefill_tokens > 0
    reserved, _ = fixed_batch(DecodeReserveConfig())
    assert run(reserved) == expect
    assert reserved.stats.preemptions == 0 and reserved.stats.reprefill_tokens == 0
    assert reserved.block_manager.num_free_blocks == 120


def test_low_reserve_still_preempts_less_and_always_finishes():
    """A reserve learnt too low is raised by the preemptions it causes; every request finishes."""
    plain, expect = fixed_batch(None)
    run(plain)
    low, _ = fixed_batch(DecodeReserveConfig(init=0.2, floor=0.2))
    assert run(low) == expect
    assert low.stats.reprefill_tokens < plain.stats.reprefill_tokens / 2


def test_reserve_with_lengths_that_vary():
    rng = random.Random(3)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=256, decode_reserve=DecodeReserveConfig(window=4)),
                  BlockManager(60, 16))
    expect = {}
    for i in range(24):
        prompt = [rng.randrange(1, 40) for _ in range(rng.randint(5, 40))]
        n = rng.randint(1, 200)
        s.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True)))
        expect[f"r{i}"] = reference(prompt, n)
    assert run(s) == expect
    assert s.block_manager.num_free_blocks == 60
