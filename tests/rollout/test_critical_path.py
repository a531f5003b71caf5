"""Critical-path placement: who is critical, where it runs, and that nothing else runs there."""

from __future__ import annotations

import pytest

from seer.rollout.critical_path import CriticalPath, batch_speedup, fitted_companions, lone_companions
from seer.rollout.dispatch import DispatchConfig
from seer.rollout.length_model import PopulationLength
from seer.rollout.policies import UnknownPolicyError, get_policy
from seer.rollout.remaining import Estimate, RemainingWork
from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.step_cost import LinearStepCost
from seer.rollout.types import InstanceState, RequestState, RolloutRequest


def flat(b: float) -> float:
    """An instance that runs up to 6 sequences for the price of one."""
    return min(max(b, 1.0), 6.0)


def requests(estimates: list[float]) -> tuple[list[RolloutRequest], dict[int, tuple[float, bool]]]:
    reqs = [RolloutRequest(i, i, 0, 8, 2000) for i in range(len(estimates))]
    return reqs, {i: (e, True) for i, e in enumerate(estimates)}


def update(cp: CriticalPath, reqs: list[RolloutRequest], estimate: Estimate,
           live: list[InstanceState]) -> None:
    """One dispatch round's update over ``reqs`` estimated afresh."""
    work = RemainingWork()
    for req in reqs:
        work.add(req)
    work.refresh(estimate, None)
    work.check_integrity(estimate)
    cp.work = work
    cp.update(live)


def instances(n: int, running: tuple[int, ...] = ()) -> list[InstanceState]:
    return [InstanceState(i, 100, 16, running=running[i] if i < len(running) else 0) for i in range(n)]


def test_isolates_the_runaway_when_the_rest_fits_beside_it() -> None:
    reqs, est = requests([1000.0] + [20.0] * 20)
    reqs[0].running_on = 2
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: est[r.request_id], instances(4))
    assert cp.instance_of == {0: 2} and cp.critical_on(2) == 0 and cp.isolated == 1
    cp.check_integrity()


def test_nothing_is_critical_while_the_rest_of_the_work_dominates() -> None:
    reqs, est = requests([100.0] + [50.0] * 100)
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: est[r.request_id], instances(4))
    assert cp.instance_of == {}


def test_the_margin_decides_borderline_cases() -> None:
    # j = 1: 100 * flat(20 / 3) * 3 = 1800 against the rest, 20 * 60 = 1200
    reqs, est = requests([100.0] + [60.0] * 20)
    strict, loose = CriticalPath(flat, margin=1.6), CriticalPath(flat, margin=1.0)
    for cp in (strict, loose):
        update(cp, reqs, lambda r: est[r.request_id], instances(4))
    assert strict.instance_of == {} and set(loose.instance_of) == {0}
    with pytest.raises(ValueError, match="margin"):
        CriticalPath(flat, margin=0.5)


def test_a_budget_is_never_evidence_but_counts_as_work() -> None:
    reqs, est = requests([1000.0] + [20.0] * 20)
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: (est[r.request_id][0], r.request_id != 0), instances(4))
    assert cp.instance_of == {}  # the long one is only a budget; the short ones are not critical


def test_budgets_above_a_belief_do_not_hide_it() -> None:
    # eight requests known only by their budgets rank above the runaway, more than the 3 instances that could be
    # reserved: they count as work but must not use up the candidates
    reqs, est = requests([1100.0] * 8 + [1000.0] + [5.0] * 10)
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: (est[r.request_id][0], r.request_id >= 8), instances(4))
    assert set(cp.instance_of) == {8}
    cp.check_integrity()


def test_the_buffer_estimates_unrevealed_groups_from_the_population() -> None:
    buf = RequestBuffer("context", chunk_tokens=16, dispatch=DispatchConfig(critical_speedup=flat))
    for _ in range(5):
        group = buf.add_group(8, 4, 2000)
        for req in group.requests:
            req.state = RequestState.FINISHED
            group.finished_lengths.append(100)
    long = buf.add_group(8, 4, 2000)
    for req in long.requests:
        req.generated = 700
    req = long.requests[1]
    assert buf.estimated_remaining(req) == (1300.0, False)  # nothing revealed: the budget, not a belief
    population = PopulationLength.fit(buf.groups.values())
    est, known = buf.estimated_remaining(req, lambda: population)
    assert known and 0 < est < 1300


def test_one_instance_stays_shared_and_the_least_loaded_are_reserved() -> None:
    reqs, est = requests([1000.0, 990.0, 980.0, 5.0, 5.0])
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: est[r.request_id], instances(3, running=(4, 0, 1)))
    assert cp.instance_of == {0: 1, 1: 2}  # two of three instances, least running first
    cp.check_integrity()


def test_a_finished_or_overtaken_request_releases_its_instance() -> None:
    reqs, est = requests([1000.0] + [20.0] * 20)
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: est[r.request_id], instances(4))
    [iid] = cp.instance_of.values()
    update(cp, reqs[1:], lambda r: est[r.request_id], instances(4))  # the runaway finished
    assert cp.instance_of == {} and cp.critical_on(iid) is None
    cp.check_integrity()


def test_a_dead_instance_is_never_reserved() -> None:
    reqs, est = requests([1000.0] + [20.0] * 20)
    reqs[0].running_on = 0
    live = instances(4)
    live[0].alive = False
    cp = CriticalPath(flat)
    update(cp, reqs, lambda r: est[r.request_id], live)
    assert list(cp.instance_of.values()) != [0] and len(cp.instance_of) == 1


def test_batch_speedup_from_a_step_profile() -> None:
    times = {1.0: 0.09, 4.0: 0.15, 16.0: 0.228}

    def step(b: float) -> float:  # piecewise linear between the profiled sizes
        if b <= 4:
            return 0.09 + (b - 1) * (0.15 - 0.09) / 3
        return 0.15 + (b - 4) * (0.228 - 0.15) / 12

    s = batch_speedup(list(times), step)
    assert s(1) == 1.0 and s(0.5) == 1.0
    assert s(4) == pytest.approx(4 * 0.09 / 0.15)
    assert s(16) == pytest.approx(16 * 0.09 / 0.228) == s(100)  # no batch beyond the profile is assumed
    assert s(4) < s(8) < s(16)


def test_the_buffer_runs_a_critical_request_alone_on_its_instance() -> None:
    buf = RequestBuffer("oracle", chunk_tokens=16, dispatch=DispatchConfig(critical_speedup=flat))
    buf.add_group(8, 4, 2000, true_lengths=(1500, 10, 10, 10))
    for _ in range(5):
        buf.add_group(8, 4, 2000, true_lengths=(12, 10, 10, 10))
    states = instances(3)
    buf.update_critical(states)
    assert set(buf.critical.instance_of) == {0}  # the runaway, request 0
    own = buf.critical.instance_of[0]
    placed = buf.select(states)
    assert [a.instance_id for a in placed if a.request.request_id == 0] == [own]
    assert all(a.instance_id != own for a in placed if a.request.request_id != 0)
    assert len(placed) == 24
    buf.check_integrity()


def test_critical_is_a_suffix_of_divided_policies_only() -> None:
    pol = get_policy("seer-paper+critical")
    assert pol.critical and pol.speculative and pol.name == "seer-paper+critical"
    assert not get_policy("seer-paper").critical and get_policy("seer").critical
    with pytest.raises(UnknownPolicyError, match="does not divide"):
        get_policy("verl+critical")
    with pytest.raises(UnknownPolicyError, match="NAME\\+critical"):
        get_policy("seer+fast")


def test_the_shared_batch_is_capped_by_what_an_instance_kv_holds() -> None:
    """Ideal batching would absorb the rest beside the long request, but each instance's KV holds only two
    80-token contexts: the rest needs the instances, so nothing is isolated."""
    reqs = [RolloutRequest(i, i, 0, 80, 2000) for i in range(101)]
    est = {i: (1000.0 if i == 0 else 100.0, True) for i in range(101)}

    def linear(b: float) -> float:
        return max(b, 1.0)

    small = [InstanceState(i, 10, 16, total_blocks=10) for i in range(4)]
    unsized = [InstanceState(i, 10, 16) for i in range(4)]  # an instance that does not report its size
    capped, uncapped = CriticalPath(linear), CriticalPath(linear)
    update(capped, reqs, lambda r: est[r.request_id], small)
    update(uncapped, reqs, lambda r: est[r.request_id], unsized)
    assert capped.instance_of == {} and list(uncapped.instance_of) == [0]


def test_companions_come_from_the_flat_part_of_the_step_profile() -> None:
    def weight_bound(b: float) -> float:  # a step of up to four costs what one does, then 10% a sequence
        return 0.04 * (1.0 + 0.1 * max(b - 4.0, 0.0))

    def per_sequence(b: float) -> float:
        return 0.04 + 0.004 * b

    assert lone_companions([1, 4, 16], weight_bound) == 3
    assert lone_companions([1, 4, 16], weight_bound, tolerance=0.25) == 5
    assert lone_companions([1, 4, 16], lambda b: 0.04) == 7          # capped at `most`
    assert lone_companions([1, 2], lambda b: 0.04) == 1              # never beyond the profiled batches
    assert lone_companions([1, 4, 16], per_sequence) == 0
    with pytest.raises(ValueError, match="companions"):
        CriticalPath(flat, companions=-1)


def test_measured_steps_price_companions_once_enough_have_run() -> None:
    """A fit where every sequence adds 1 ms and every context token 5 us to a 40 ms step: one companion at 100
    tokens fits the 2 ms slack, a second does not; at 500 tokens none does. Once fitted, the fit decides, within
    what the profile allows."""
    fit = LinearStepCost(0.039, 0.0005, 0.0005, 5e-6)
    assert fitted_companions(fit, 100, 100) == 1 and fitted_companions(fit, 100, 500) == 0
    assert fitted_companions(LinearStepCost(0.04, 0.0, 0.0, 0.0), 100, 100, most=3) == 3  # free: capped
    reqs, est = requests([100.0] + [60.0] * 20)
    cp = CriticalPath(flat, margin=1.6, companions=3)
    update(cp, reqs, lambda r: est[r.request_id], instances(4))
    assert list(cp.companions_on.values()) == [3]  # the profile's count, before any step is measured
    for _ in range(cp.measured.min_steps // 2):
        cp.measured.add(((0, 40, 1, 0, 0),), 0.04)
        cp.measured.add(((0, 40, 1, 0, 0), (1, 40, 1, 0, 0)), 0.05)  # a companion costs 25%
    update(cp, reqs, lambda r: est[r.request_id], instances(4))
    assert cp.measured.fit is not None and cp.instance_of == {}  # no companion, so isolating does not pay
    cp.check_integrity()


def test_companions_make_isolation_cheaper() -> None:
    """j = 1: 100 * flat(20 / 3) * 3 = 1800 falls short of 1.6 * 1200; with three companions beside the
    critical request its instance also works off the rest: 100 * (18 + 3) = 2100 >= 1920."""
    reqs, est = requests([100.0] + [60.0] * 20)
    alone, accompanied = CriticalPath(flat, margin=1.6), CriticalPath(flat, margin=1.6, companions=3)
    for cp in (alone, accompanied):
        update(cp, reqs, lambda r: est[r.request_id], instances(4))
        cp.check_integrity()
    assert alone.instance_of == {} and set(accompanied.instance_of) == {0}
    assert alone.companions_on == {} and accompanied.companions_on == {accompanied.instance_of[0]: 3}


def test_a_critical_instance_takes_companions_up_to_its_places_and_keeps_room() -> None:
    def placed_on(companions: int, blocks: int = 100) -> list[tuple[int, int]]:
        buf = RequestBuffer("oracle", chunk_tokens=16,
                            dispatch=DispatchConfig(critical_speedup=flat, critical_companions=companions))
        buf.add_group(8, 4, 2000, true_lengths=(1500, 10, 10, 10))
        for _ in range(5):
            buf.add_group(8, 4, 2000, true_lengths=(12, 10, 10, 10))
        states = [InstanceState(i, blocks, 16, total_blocks=blocks) for i in range(3)]
        buf.update_critical(states)
        own = buf.critical.instance_of[0]
        placed = [(a.request.request_id, a.instance_id) for a in buf.select(states)]
        buf.check_integrity()
        return [(rid, iid) for rid, iid in placed if iid == own]

    assert [rid for rid, _ in placed_on(0)] == [0]               # alone
    beside = placed_on(3)
    assert beside[0][0] == 0 and len(beside) == 4                # the critical request first, then three more
    # five blocks: the critical request's chunk takes two, a companion's would take two more, and the
    # critical request's next chunk would then find one of the two (and a spare) it needs: alone again
    assert [rid for rid, _ in placed_on(3, blocks=5)] == [0]
