"""Orderings: probes first (shortest generated first), longest estimated remaining first, guard, oracle, fifo."""

from __future__ import annotations

import math

import pytest

from seer.rollout.length_model import censored_median, quantile_remaining
from seer.rollout.orderings import ORDERINGS, OrderingConfig, make_ordering
from seer.rollout.request_buffer import RequestBuffer

from .helpers import order, run_chunk

NO_GUARD = OrderingConfig(guard_every=0, max_wait=None)


def context_buffer(groups: int = 3, size: int = 3, max_tokens: int = 100, **cfg: object) -> RequestBuffer:
    buf = RequestBuffer("context", chunk_tokens=10, ordering_config=OrderingConfig(**{**vars(NO_GUARD), **cfg}))
    for _ in range(groups):
        buf.add_group(prompt_len=4, size=size, max_tokens=max_tokens)
    return buf


def test_registry_and_unknown_ordering() -> None:
    assert set(ORDERINGS) == {"fifo", "context", "group-oracle", "oracle"}
    with pytest.raises(ValueError, match="known: context, fifo, group-oracle, oracle"):
        make_ordering("lifo")


def test_probes_run_first_in_group_order() -> None:
    buf = context_buffer()
    assert order(buf, 3) == [(0, 0), (1, 0), (2, 0)]
    buf.check_integrity()


def test_shortest_generated_probe_first() -> None:
    buf = context_buffer()
    for gid, tokens in ((0, 30), (1, 10), (2, 20)):
        run_chunk(buf, gid, 0, tokens)
    assert order(buf, 3) == [(1, 0), (2, 0), (0, 0)]
    buf.check_integrity()


def test_longest_estimate_first_after_probes() -> None:
    buf = context_buffer()
    run_chunk(buf, 0, 0, 10, finished=True)  # L_0 = 10
    run_chunk(buf, 1, 0, 50, finished=True)  # L_1 = 50
    buf.take(buf.groups[2].requests[0].request_id, 1)  # group 2's probe still running: L_2 = max_tokens
    assert [buf.groups[g].length_estimate for g in range(3)] == [10, 50, 100]
    assert order(buf) == [(2, 1), (2, 2), (1, 1), (1, 2), (0, 1), (0, 2)]
    buf.check_integrity()


def test_estimate_updates_when_a_sibling_finishes() -> None:
    buf = context_buffer(groups=2)
    a_probe = buf.groups[0].requests[0].request_id
    buf.take(a_probe, 0)
    run_chunk(buf, 1, 0, 60, finished=True)  # L_B = 60 < L_A = 100
    assert order(buf, 1) == [(0, 1)]
    buf.on_chunk_done(a_probe, 20, finished=True)  # L_A drops to 20: B now goes first
    assert buf.groups[0].length_estimate == 20
    assert order(buf) == [(1, 1), (1, 2), (0, 2)]
    buf.check_integrity()


def test_estimate_is_longest_finished_sibling() -> None:
    buf = context_buffer(groups=1, size=4)
    run_chunk(buf, 0, 1, 40, finished=True)
    run_chunk(buf, 0, 2, 70, finished=True)
    run_chunk(buf, 0, 3, 5, finished=True)
    assert buf.groups[0].length_estimate == 70


def test_guard_every_k_serves_the_longest_waiting() -> None:
    buf = context_buffer(groups=2, guard_every=2)
    run_chunk(buf, 0, 0, 5, finished=True)  # L_0 = 5: group 0's siblings arrived first but go last
    run_chunk(buf, 1, 0, 90, finished=True)  # L_1 = 90
    # every 2nd dispatch is the guard's: the oldest waiting request
    assert order(buf) == [(1, 1), (0, 1), (1, 2), (0, 2)]


def test_guard_max_wait_fires_after_w_dispatches() -> None:
    lengths = ((0, 5), (1, 90), (2, 80), (3, 70), (4, 60))
    guarded, plain = context_buffer(groups=5, size=2, max_wait=2), context_buffer(groups=5, size=2)
    for buf in (guarded, plain):
        for gid, length in lengths:
            run_chunk(buf, gid, 0, length, finished=True)
    assert order(plain) == [(1, 1), (2, 1), (3, 1), (4, 1), (0, 1)]
    # (0, 1) arrived first; once more than 2 dispatches have passed it over, it is served
    assert order(guarded) == [(1, 1), (2, 1), (3, 1), (0, 1), (4, 1)]


def test_oracle_longest_true_remaining_first() -> None:
    buf = RequestBuffer("oracle", chunk_tokens=10)
    buf.add_group(4, 2, 100, true_lengths=[30, 80])
    buf.add_group(4, 2, 100, true_lengths=[60, 10])
    assert order(buf, 1) == [(0, 1)]  # 80 remaining
    buf.on_chunk_done(buf.groups[0].requests[1].request_id, 50)  # now 30 remaining
    assert order(buf) == [(1, 0), (0, 0), (0, 1), (1, 1)]  # 60, 30 (earlier arrival), 30, 10
    buf.check_integrity()


def test_oracle_needs_true_lengths() -> None:
    buf = RequestBuffer("oracle")
    with pytest.raises(ValueError, match="true lengths"):
        buf.add_group(4, 2, 100)


def test_group_oracle_knows_group_medians_not_which_sibling_is_long() -> None:
    """Once a sibling has finished, a group's median is its true one (the short probe does not fool it); before
    that, and within a group, it ranks like `context`."""
    def probes_done(name: str) -> RequestBuffer:
        buf = RequestBuffer(name, chunk_tokens=10, ordering_config=NO_GUARD)
        buf.add_group(4, 3, 200, true_lengths=[10, 90, 100])   # short probe, long group
        buf.add_group(4, 3, 200, true_lengths=[40, 40, 40])
        run_chunk(buf, 0, 0, 10, finished=True)
        run_chunk(buf, 1, 0, 40, finished=True)
        return buf

    assert order(probes_done("context")) == [(1, 1), (1, 2), (0, 1), (0, 2)]  # fooled by the short probe
    buf = probes_done("group-oracle")
    ordering = buf.ordering
    g0 = buf.groups[0]
    assert ordering._length_model(g0)[0] == pytest.approx((10 * 90 * 100) ** (1 / 3))
    assert ordering.estimated_remaining(g0.requests[1], g0) == ordering.estimated_remaining(g0.requests[2], g0)
    assert order(buf) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    buf.check_integrity()
    assert make_ordering("group-oracle", OrderingConfig(rank="group")).config.rank == "remaining"
    with pytest.raises(ValueError, match="group-oracle ordering needs true lengths"):
        RequestBuffer("group-oracle").add_group(4, 2, 100)


def test_fifo_is_arrival_order() -> None:
    buf = RequestBuffer("fifo", chunk_tokens=10)
    buf.add_group(4, 2, 100)
    buf.add_group(4, 2, 100)
    run_chunk(buf, 0, 0, 10)  # goes to the back
    assert order(buf) == [(0, 1), (1, 0), (1, 1), (0, 0)]


@pytest.mark.parametrize("name", sorted(ORDERINGS))
def test_requeue_restores_position(name: str) -> None:
    buf = RequestBuffer(name, ordering_config=OrderingConfig(guard_every=0))
    for gid in range(3):
        buf.add_group(4, 3, 100, true_lengths=[50 + gid, 20, 90 - gid])
    ordering = buf.ordering
    first = ordering.pop()
    second = ordering.pop()
    assert first is not None and second is not None
    ordering.requeue(second, buf.groups[second.group_id])
    ordering.requeue(first, buf.groups[first.group_id])
    assert ordering.served == 0
    assert ordering.pop() is first and ordering.pop() is second



def test_unknown_groups_are_served_breadth_first() -> None:
    """Before any sibling finishes every group's L_g is max_tokens, so the remaining estimate is max_tokens -
    generated: a member that just ran a chunk waits behind the untouched members of the other long groups."""
    buf = context_buffer(groups=2, size=3, rank="remaining")
    for gid in (0, 1):
        buf.take(buf.groups[gid].requests[0].request_id, 0)  # probes running, nothing finished
    run_chunk(buf, 0, 1, 10)
    assert order(buf) == [(0, 2), (1, 1), (1, 2), (0, 1)]
    buf.check_integrity()


def test_longest_estimated_remaining_first() -> None:
    """A nearly done member of a long group yields to fresh members of a shorter group (LRPT, like the oracle)."""
    buf = context_buffer(groups=2, size=3, rank="remaining")
    run_chunk(buf, 0, 0, 50, finished=True)
    run_chunk(buf, 1, 0, 30, finished=True)
    run_chunk(buf, 0, 1, 90)
    ordering = buf.ordering
    rem = {(g, i): ordering.estimated_remaining(buf.groups[g].requests[i], buf.groups[g]) for g, i in
           ((0, 1), (0, 2), (1, 1))}
    assert rem[(0, 2)] > rem[(1, 1)] > rem[(0, 1)] > 0
    assert order(buf) == [(0, 2), (1, 1), (1, 2), (0, 1)]
    buf.check_integrity()


def test_request_beyond_its_finished_sibling_keeps_a_large_estimate() -> None:
    """The point estimate L_g - generated would rank a request that outgrew its finished sibling last (it is
    the group's longest: the tail). The hedged estimate keeps it ahead of a fresh member of a shorter group."""
    buf = context_buffer(groups=2, size=3)
    run_chunk(buf, 0, 0, 20, finished=True)  # L_0 = 20
    run_chunk(buf, 1, 0, 12, finished=True)  # L_1 = 12
    run_chunk(buf, 0, 1, 30)                 # 30 > L_0 and still running
    assert order(buf) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    buf.check_integrity()


def test_censored_siblings_raise_the_group_median() -> None:
    buf = context_buffer(groups=1, size=4)
    group = buf.groups[0]
    run_chunk(buf, 0, 0, 20, finished=True)
    assert censored_median(group, 0.3) == pytest.approx(20)  # nothing else known
    for i in (1, 2, 3):
        run_chunk(buf, 0, i, 30)                             # three siblings already longer than the probe
    assert censored_median(group, 0.3) > 30


def test_spread_is_learned_from_completed_groups() -> None:
    buf = context_buffer(groups=10, size=3, rank="remaining")
    ordering = buf.ordering
    assert ordering.spread == pytest.approx(0.3)
    for gid in range(10):
        for i, n in enumerate((10, 20, 40)):  # log sd ln(2): wider than the prior
            run_chunk(buf, gid, i, n, finished=True)
    assert ordering.spread == pytest.approx(math.log(2), rel=1e-6)
    buf.check_integrity()


def test_spread_counts_siblings_still_running() -> None:
    """Mid-rollout, the groups that completed are the narrow ones; a long sibling still running is censored
    evidence of a wider spread and must raise the estimate before its group completes."""
    buf = context_buffer(groups=13, size=3, max_tokens=10**6, rank="remaining")
    ordering = buf.ordering
    ordering.REFIT_GROWTH = 1.0  # refit at every finish (the default refits geometrically)
    for gid in range(12):
        run_chunk(buf, gid, 0, 100, finished=True)
        run_chunk(buf, gid, 1, 100, finished=True)
    for gid in range(8):
        run_chunk(buf, gid, 2, 104, finished=True)   # 8 complete groups of near-identical lengths
    narrow = ordering.spread
    assert narrow < 0.1
    for gid in range(8, 12):
        run_chunk(buf, gid, 2, 2000)                 # the other 4 have a sibling already 20x longer
    assert ordering.spread == narrow                 # nothing finished: no refit yet
    run_chunk(buf, 12, 0, 100, finished=True)        # the next finish refits and sees the censored ones
    assert ordering.spread > 3 * narrow
    buf.check_integrity()


def test_group_hedge_covers_the_longest_unfinished_sibling() -> None:
    """Siblings that start together are ranked by the hedge quantile of the longest of them: with k unfinished
    siblings the per-request level is hedge ** (1 / k), so the estimate falls as siblings finish."""
    buf = context_buffer(groups=1, size=8, max_tokens=10**6, rank="remaining")
    ordering, group = buf.ordering, buf.groups[0]
    run_chunk(buf, 0, 0, 100, finished=True)
    req = group.requests[7]
    sigma = 0.3 * math.sqrt(2.0)  # the prior spread, widened for one finished sibling
    assert ordering.estimated_remaining(req, group) == pytest.approx(
        quantile_remaining(100, 0, sigma, 0.99 ** (1 / 7), 10**6))
    wide = ordering.estimated_remaining(req, group)
    for i in range(1, 7):
        run_chunk(buf, 0, i, 100, finished=True)
    assert ordering.estimated_remaining(req, group) < wide
    assert ordering.estimated_remaining(req, group) == pytest.approx(
        quantile_remaining(100, 0, 0.3 * math.sqrt(1 + 1 / 7), 0.99, 10**6))
    buf.check_integrity()


def test_estimate_change_rekeys_waiting_siblings() -> None:
    buf = context_buffer(groups=2, size=3)
    probe = buf.groups[0].requests[0].request_id
    buf.take(probe, 0)
    run_chunk(buf, 1, 0, 60, finished=True)  # group 1 known, group 0 unknown (max_tokens)
    buf.on_chunk_done(probe, 5, finished=True)  # group 0 turns out short
    assert order(buf) == [(1, 1), (1, 2), (0, 1), (0, 2)]
    buf.check_integrity()


def test_paper_literal_group_rank() -> None:
    buf = context_buffer(groups=3, rank="group")
    run_chunk(buf, 0, 0, 10, finished=True)
    run_chunk(buf, 1, 0, 50, finished=True)
    run_chunk(buf, 1, 1, 45)  # members stay in arrival order within a group
    buf.take(buf.groups[2].requests[0].request_id, 1)
    assert order(buf) == [(2, 1), (2, 2), (1, 2), (1, 1), (0, 1), (0, 2)]
    buf.check_integrity()
    with pytest.raises(ValueError, match="unknown context rank"):
        OrderingConfig(rank="shortest")


def test_a_runaway_prior_above_one_minus_hedge_is_refused() -> None:
    """Runaway odds never fall below the prior, so with prior >= 1 - hedge every request would rank as a runaway
    (max_tokens - generated: least advanced first), silently turning the order into round robin."""
    OrderingConfig(hedge=0.99, runaway_prior=0.0025)
    with pytest.raises(ValueError, match=r"runaway_prior must be in \[0, 1 - hedge\)"):
        OrderingConfig(hedge=0.999, runaway_prior=0.0025)


def test_outgrown_request_is_ranked_as_a_runaway() -> None:
    """math_cot's straggler: 2,110 tokens of noise beside siblings of 164-282. Once a request is far past its
    finished siblings its hedged remaining is the runaway's (max_tokens - generated) and its hint grows."""
    buf = context_buffer(groups=1, size=4, max_tokens=1000, rank="remaining")
    ordering, group = buf.ordering, buf.groups[0]
    req = group.requests[3]
    assert ordering.remaining_hint(req, group) is None  # nothing finished: no evidence
    for i in (0, 1, 2):
        run_chunk(buf, 0, i, 100, finished=True)
    near = ordering.remaining_hint(req, group)
    run_chunk(buf, 0, 3, 400)
    assert ordering.estimated_remaining(req, group) == pytest.approx(600)
    assert ordering.remaining_hint(req, group) > 4 * near > 400
    buf.check_integrity()


def test_attained_rank_tests_every_request_before_it_trusts_estimates() -> None:
    """rank="attained": after the probes, first the requests whose hedged remaining is their whole budget (a
    runaway, or a group that may run to max_tokens), longest first; then those that have outgrown every finished
    sibling; then the siblings of groups with a finished member, shortest expected remaining first (finishing a
    short group is what exposes a runaway hidden in it); then the siblings of groups whose probe still runs,
    least generated first."""
    buf = context_buffer(groups=5, size=3, max_tokens=1000, rank="attained")
    for gid, probe in ((0, 40), (1, 400), (2, 40), (4, 100)):
        run_chunk(buf, gid, 0, probe, finished=True)  # group 1 long, group 4 medium, groups 0 and 2 short
    run_chunk(buf, 0, 1, 20)    # behind its finished sibling
    run_chunk(buf, 2, 1, 50)    # past its finished sibling (40): outgrown
    run_chunk(buf, 2, 2, 600)   # far past it: a runaway
    run_chunk(buf, 1, 1, 10)
    run_chunk(buf, 3, 0, 10)    # group 3's probe still runs
    run_chunk(buf, 3, 1, 5)
    assert buf.ordering.estimated_remaining(buf.groups[2].requests[2], buf.groups[2]) == 400
    first = order(buf)
    assert first == [(3, 0), (1, 2), (1, 1), (2, 2), (2, 1), (0, 1), (0, 2), (4, 1), (4, 2), (3, 2), (3, 1)]
    buf.check_integrity()


def test_attained_rank_starts_a_group_that_outgrew_the_population_before_untested_ones() -> None:
    """No member of groups 6 and 7 has finished, so their siblings say nothing of their length; but group 6's
    probe has outgrown the median of all responses (the censored population fit, ~50 here), so its siblings
    rank with the requests that outgrew their finished siblings, before group 7's, though they have generated
    more: least generated first among the untested would start the long group's laggards last."""
    buf = context_buffer(groups=8, size=3, max_tokens=1000, rank="attained")
    for gid in range(6):  # 18 finished responses of 40-60 tokens: enough to fit the population
        for index in range(3):
            run_chunk(buf, gid, index, 40 + 4 * gid + index, finished=True)
    run_chunk(buf, 6, 0, 200)
    run_chunk(buf, 7, 0, 30)
    for index in (1, 2):
        run_chunk(buf, 6, index, 10)
        run_chunk(buf, 7, index, 5)
    assert order(buf) == [(7, 0), (6, 0), (6, 1), (6, 2), (7, 1), (7, 2)]
    median = buf.ordering.population_median
    assert median is not None and 40 < median < 70
    buf.check_integrity()


def test_remaining_rank_keeps_long_groups_first() -> None:
    """The same state under rank="remaining": the long group's members go before the short groups'."""
    buf = context_buffer(groups=3, size=3, max_tokens=1000, rank="remaining")
    for gid, probe in ((0, 40), (1, 400), (2, 40)):
        run_chunk(buf, gid, 0, probe, finished=True)
    first = order(buf)
    assert [g for g, _ in first[:2]] == [1, 1]
