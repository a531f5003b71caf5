"""Rollouts in threads of one process taking turns step by step, so that their timings meet the same machine.

Why: a shared machine's speed drifts over minutes, by more than policies differ (benchmarks/README.md, "CASTILLO
again, one bench alone and with the policies taking turns"). Policies run one after the other each meet another
stretch of that drift, and the ratio of their makespans carries it. Running them at once, one per core, makes them
contend for memory bandwidth and caches instead, which need not slow both alike. Taking turns does neither: one
rollout runs at any moment, so its steps are timed as if it ran alone, and the turn passes at every step, so each
rollout meets the drift the others meet. A rollout's instances keep their own virtual clocks (``virtual_time.py``);
turns only decide which rollout's next step the machine computes. Meeting the same drift is not being slowed alike
by it (a slower machine may cost large compute-bound batches more than small ones), so a ratio still moves with the
machine's state.

The turn goes to the waiting rollout that has held it for the least time so far, so all advance at one pace in
machine time; the one that needs less finishes first and the others take their remaining steps alone. A rollout
holds the turn from its first step on, through its control-plane work between steps, and gives it up only at the
start of a step or when it leaves: only the holder runs Python at all, so the others do not even contend for the
interpreter lock inside its timed steps. Torch-free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial


class Turns:
    """Hands one turn at a time to the threads that joined; ``turn()`` is a thread's membership."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None
        self._since = 0.0                 # when the holder took the turn
        self._used: dict[int, float] = {}  # member -> seconds it has held the turn
        self._waiting: set[int] = set()
        self._members = 0

    @contextmanager
    def turn(self) -> Iterator[Callable[[], None]]:
        """Join; yields the call to make before each step. Leaving (also on an exception) passes the turn on."""
        with self._cond:
            member = self._members
            self._members += 1
            self._used[member] = 0.0
        try:
            yield partial(self.before_step, member)
        finally:
            with self._cond:
                self._waiting.discard(member)
                if self._holder == member:
                    self._release(member)
                self._cond.notify_all()

    def before_step(self, member: int) -> None:
        """Give up the turn if ``member`` holds it, wait until it is ``member``'s, and return holding it."""
        with self._cond:
            if self._holder == member:
                self._release(member)
            self._waiting.add(member)
            self._cond.notify_all()
            while self._holder is not None or self._due() != member:
                self._cond.wait()
            self._waiting.discard(member)
            self._holder, self._since = member, time.perf_counter()

    def used_s(self, member: int) -> float:
        """Seconds ``member`` has held the turn, up to its last release."""
        with self._cond:
            return self._used[member]

    def _due(self) -> int | None:
        return min(self._waiting, key=lambda m: (self._used[m], m), default=None)

    def _release(self, member: int) -> None:
        self._used[member] += time.perf_counter() - self._since
        self._holder = None

    def check_integrity(self) -> None:
        with self._cond:
            assert self._holder is None or self._holder not in self._waiting, "the holder also waits for the turn"
            assert self._waiting <= set(self._used), "a thread waits that never joined"
            assert all(t >= 0 for t in self._used.values()), "negative turn time"
