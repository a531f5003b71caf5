"""The discrete-event loop of instances in this process: each keeps its own clock, priced by its steps.

In-process instances take turns on the machine, but each step's duration is charged to its own instance only,
so every instance's timeline is what it would be on an accelerator of its own: an instance starts a step when
it is free and has work, and the step's events take effect at its end. Steps are processed in order of their
end times, so the driver sees events in the order a real cluster would produce them. With a real engine a
duration is the step's measured time (compute, drafting and KV moved); with a cost model it is the model's
price, which makes every decision reproducible (the simulator and the engine then agree exactly). A step is
computed when it starts, so what it produces (tokens for sibling drafts, KV it frees, requests it ends) becomes
visible only when its end is processed (``join_virtual_time``): no decision reads an instance's future. A fault
plan kills its instance when the clock reaches its time. Before each step the driver's ``pace`` runs, where
several rollouts of one process take turns (``turns.py``). Torch-free.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from seer.rollout.instances.base import StepReport, merge_stalled
from seer.rollout.types import RolloutResult, RolloutStalled

if TYPE_CHECKING:
    from seer.rollout.driver import RolloutDriver


def run_virtual_time(driver: RolloutDriver) -> RolloutResult:
    """Run ``driver``'s rollout to completion on virtual time and return its result."""
    for inst in driver.instances.values():
        inst.join_virtual_time(lambda: driver.now)
    driver.begin()
    in_flight: list[tuple[float, int, int, StepReport, float]] = []
    busy_ids: set[int] = set()
    seq = 0

    def start_idle() -> None:
        nonlocal seq
        for iid in sorted(driver.alive - busy_ids):
            inst = driver.instances[iid]
            if not inst.has_work():
                continue
            if driver.pace is not None:
                driver.pace()
            rep = inst.step()
            if rep.stalled and not rep.scheduled_tokens and driver.relieve(iid):
                rep = merge_stalled(rep, inst.step())
            seq += 1
            heapq.heappush(in_flight, (driver.now + rep.duration_s, seq, iid, rep, driver.now))
            busy_ids.add(iid)

    start_idle()
    while not driver.buffer.all_finished:
        if driver.fault is not None and in_flight and in_flight[0][0] >= driver.fault.at_s \
                and driver.fault.instance_id in driver.alive:
            driver.now = max(driver.now, driver.fault.at_s)
            in_flight = [x for x in in_flight if x[2] != driver.fault.instance_id]
            heapq.heapify(in_flight)
            busy_ids.discard(driver.fault.instance_id)
            driver.on_instance_lost(driver.fault.instance_id)
            start_idle()
            continue
        if not in_flight:
            raise RolloutStalled(driver.diagnose())
        end, _, iid, rep, start = heapq.heappop(in_flight)
        driver.now = end
        busy_ids.discard(iid)
        driver.instances[iid].step_ended()
        if iid not in driver.alive:  # found dead while its step was in flight: its chunks were returned
            continue
        driver.on_step(iid, start, rep)
        start_idle()
    return driver.result()
