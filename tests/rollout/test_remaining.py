"""The cached remaining-work estimates stay equal to estimating every unfinished request afresh."""

from __future__ import annotations

import math
import random

import pytest

from seer.rollout.dispatch import DispatchConfig
from seer.rollout.remaining import RemainingWork
from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.types import InstanceState, RolloutRequest


def flat(b: float) -> float:
    return min(max(b, 1.0), 6.0)


def fresh(buf: RequestBuffer) -> tuple[float, list[tuple[float, int]]]:
    """(total, beliefs longest first) estimated now from scratch, with the population fit of this round."""
    population = buf._population_fit()
    estimates = [(buf.estimated_remaining(r, lambda: population), r) for r in buf.requests.values()
                 if not r.finished]
    beliefs = sorted(((e, r.request_id) for (e, known), r in estimates if known), key=lambda x: (-x[0], x[1]))
    return math.fsum(e for (e, _), _ in estimates), beliefs


@pytest.mark.parametrize("ordering", ["context", "oracle", "fifo"])
def test_cached_estimates_equal_fresh_ones_through_a_random_rollout(ordering: str) -> None:
    rng = random.Random(7)
    buf = RequestBuffer(ordering, chunk_tokens=16, dispatch=DispatchConfig(critical_speedup=flat))
    for _ in range(24):
        center = rng.choice([20, 60, 200])
        buf.add_group(8, 6, 600, true_lengths=[min(600, int(center * rng.lognormvariate(0, 0.5))) + 1
                                               for _ in range(6)])
    rounds = 0
    while not buf.all_finished:
        live = [InstanceState(i, 400, 16, max_running=6) for i in range(4)]  # KV goes to the pool
        buf.update_critical(live)
        assert buf.critical is not None
        work = buf.critical.work
        total, beliefs = fresh(buf)
        assert work.total == pytest.approx(total, rel=1e-9, abs=1e-6)
        longest = work.longest()
        top = [(e, r.request_id) for _, (e, r) in zip(range(5), longest)]
        longest.close()
        assert top == beliefs[:5]
        buf.check_integrity()
        placed = buf.select(live)
        for a in placed:  # each chunk generates up to its size, stopping at the true length
            req = a.request
            n = min(a.max_new_tokens, req.true_length - req.generated)  # type: ignore[operator]
            buf.on_chunk_done(req.request_id, n, finished=req.generated + n >= req.true_length,
                              kv_instance=None)
        rounds += 1
        assert rounds < 1_000
    assert buf.critical is not None and len(buf.critical.work) == 0


def test_longest_restores_what_it_took_and_skips_stale_entries() -> None:
    reqs = [RolloutRequest(i, 0, i, 8, 1000) for i in range(5)]
    est = {0: (50.0, True), 1: (300.0, True), 2: (10.0, False), 3: (300.0, True), 4: (70.0, True)}
    work = RemainingWork()
    for r in reqs:
        work.add(r)
    work.refresh(lambda r: est[r.request_id], None)
    assert work.total == 730.0 and len(work) == 5
    it = work.longest()
    assert [r.request_id for _, r in (next(it), next(it))] == [1, 3]  # ties by request id
    it.close()
    est[1] = (5.0, True)
    work.touch(reqs[1])
    work.remove(reqs[3])
    work.refresh(lambda r: est[r.request_id], None)
    assert [(e, r.request_id) for e, r in work.longest()] == [(70.0, 4), (50.0, 0), (5.0, 1)]
    assert work.total == 135.0
    work.check_integrity(lambda r: est[r.request_id])
    est = {i: (1.0, True) for i in range(5)}
    work.refresh(lambda r: est[r.request_id], "new inputs")  # every estimate is recomputed
    assert work.total == 4.0
    work.check_integrity(lambda r: est[r.request_id])
