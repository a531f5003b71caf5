"""The wall-clock watchdog of backends whose instances step on their own (processes, Ray actors).

Why: the in-process driver knows at once when nothing can run (no step in flight), but a remote instance that
stops answering, or answers only with empty steps, looks the same as a slow one. A rollout must end in a
diagnosis, never a hang, so progress is timed and a rollout without any for ``timeout_s`` is stalled.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from seer.rollout.instances.base import StepReport
from seer.rollout.types import RolloutStalled

if TYPE_CHECKING:
    from seer.rollout.driver import RolloutDriver


class StallWatch:
    """For instances that step on their own (processes, Ray actors): the rollout is stalled when no instance
    has reported progress (a scheduled token or a chunk end) for ``timeout_s`` of wall time. A worker that
    stops answering, or one that answers only with empty steps, must end in a diagnosis, never a hang."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"stall timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.progress_at = time.monotonic()
        self.heard_at: dict[int, float] = {}

    def heard(self, iid: int, rep: StepReport) -> None:
        """A step report arrived from instance ``iid``."""
        now = time.monotonic()
        self.heard_at[iid] = now
        if rep.events or rep.scheduled_tokens:
            self.progress_at = now

    def left_s(self) -> float:
        """Seconds until the rollout counts as stalled (at least a little, to wait on)."""
        return max(0.05, self.timeout_s - (time.monotonic() - self.progress_at))

    def check(self, driver: "RolloutDriver") -> None:
        now = time.monotonic()
        if now - self.progress_at <= self.timeout_s:
            return
        silent = ", ".join(f"{iid}: {now - self.heard_at[iid]:.0f} s" if iid in self.heard_at else f"{iid}: never"
                           for iid in sorted(driver.alive))
        raise RolloutStalled(f"no instance made progress for {now - self.progress_at:.0f} s (stall timeout "
                             f"{self.timeout_s:g} s; time since each live instance last reported: {silent}); "
                             + driver.diagnose())
