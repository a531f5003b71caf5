"""One engine step: draft, schedule, run, update, learn from the outcome. The sequence every engine user runs.

``LLMEngine.step`` (generation and serving) and the rollout instances (``ScheduledInstance``: the real engine
and the simulator) run exactly this sequence; only what "run" means differs (a forward pass, or a cost model's
price). Keeping it in one function is what makes a rollout step the same step a user's ``generate`` takes, and
the simulated step the same as the real one. Timings are split the way rollout reports need them: drafting
(before scheduling and after the update) apart from scheduling, running and updating. Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.engine.speculator import Speculator

# run one scheduled step: its results, and its price in seconds (None: the measured wall time is its cost)
Executor = Callable[[SchedulerOutput], tuple[dict[str, StepResult], float | None]]


@dataclass
class StepOutcome:
    out: SchedulerOutput
    finished: list[Request]
    scheduled: dict[str, Request]      # the requests the step ran
    tokens_before: dict[str, int]      # their output tokens before it
    drafted: int                       # requests that drafted this step
    draft_wall_s: float                # drafting before scheduling and after the update
    compute_wall_s: float              # scheduling, running and updating
    price_s: float | None              # the executor's price (None: the wall time is the cost)
    freed_blocks: int = 0              # KV blocks the update released (finished, paused and trimmed requests)


def run_step(scheduler: Scheduler, execute: Executor, speculator: Speculator | None = None) -> StepOutcome:
    """One step of ``scheduler``'s requests, run by ``execute``, with ``speculator`` drafting if given."""
    t_start = time.perf_counter()
    drafted = speculator.before_schedule(scheduler) if speculator is not None else 0
    t_sched = time.perf_counter()
    out = scheduler.schedule()
    scheduled = {c.request_id: scheduler.requests[c.request_id] for c in out.chunks}
    before = {rid: r.num_output_tokens for rid, r in scheduled.items()}
    results, price = execute(out) if not out.is_empty else ({}, None)
    free = scheduler.block_manager.num_free_blocks
    finished = scheduler.update_from_output(out, results)
    freed = scheduler.block_manager.num_free_blocks - free
    t_updated = time.perf_counter()
    if speculator is not None:
        speculator.after_update(out, results, scheduled)
    draft_wall = (t_sched - t_start) + (time.perf_counter() - t_updated)
    return StepOutcome(out, finished, scheduled, before, drafted, draft_wall, t_updated - t_sched, price,
                       max(0, freed))
