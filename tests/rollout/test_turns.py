"""Rollouts in threads taking turns: one step at a time, the least-served thread next, no hang when one leaves or
fails."""

from __future__ import annotations

import threading
import time

import pytest

from seer.rollout.turns import Turns


def run_members(turns: Turns, plans: list[list[float]], fail_after: dict[int, int] | None = None
                ) -> tuple[list[tuple[int, float, float]], list[BaseException]]:
    """Each member sleeps through its planned steps under ``turns``; returns (member, start, end) per step."""
    log: list[tuple[int, float, float]] = []
    errors: list[BaseException] = []
    active = [0]
    lock = threading.Lock()

    def member(index: int) -> None:
        try:
            with turns.turn() as pace:
                for k, seconds in enumerate(plans[index]):
                    if fail_after and fail_after.get(index) == k:
                        raise RuntimeError(f"member {index} failed")
                    pace()
                    with lock:
                        active[0] += 1
                        assert active[0] == 1, "two steps ran at once"
                    start = time.perf_counter()
                    time.sleep(seconds)
                    end = time.perf_counter()
                    with lock:
                        active[0] -= 1
                        log.append((index, start, end))
                    turns.check_integrity()
        except BaseException as err:  # noqa: BLE001 - collected for the test
            errors.append(err)

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive(), "a member never got its turn"
    return log, errors


def test_one_step_at_a_time_and_the_least_served_goes_next() -> None:
    turns = Turns()
    log, errors = run_members(turns, [[0.02] * 8, [0.01] * 16])
    assert not errors and len(log) == 24
    spans = sorted((s, e) for _, s, e in log)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # never overlapping
    served, steps = [0.0, 0.0], [0, 0]
    for member, start, end in sorted(log, key=lambda x: x[1]):
        served[member] += end - start
        steps[member] += 1
        if steps[0] < 8 and steps[1] < 16:  # both still running: within a step (and timer slack) of each other
            assert abs(served[0] - served[1]) <= 0.02 + 0.015
    assert turns.used_s(0) >= 0.16 and turns.used_s(1) >= 0.16


def test_a_member_that_leaves_or_fails_passes_the_turn() -> None:
    turns = Turns()
    log, errors = run_members(turns, [[0.005] * 2, [0.005] * 10, [0.005] * 10], fail_after={2: 3})
    assert [str(e) for e in errors] == ["member 2 failed"]
    assert [m for m, _, _ in log].count(1) == 10 and [m for m, _, _ in log].count(2) == 3
    turns.check_integrity()


@pytest.mark.parametrize("members", [1, 3])
def test_a_lone_member_never_waits(members: int) -> None:
    turns = Turns()
    t0 = time.perf_counter()
    log, errors = run_members(turns, [[0.0] * 50 for _ in range(members)])
    assert not errors and len(log) == 50 * members and time.perf_counter() - t0 < 5
