"""The wall-clock drive loop of instances that run elsewhere (local processes, Ray actors), written once.

Why one loop: what the coordinator does with a step answer does not depend on how it travelled, and two copies
had already begun to drift. Instances step on their own (a process steps whenever it has work; a Ray actor
once per step call, which ``Transport.request_steps`` keeps in flight), and the loop reacts to answers as they
arrive: the proxy takes the answer's snapshot, the driver the report (times on the wall clock since the
rollout began), the other instances' draft-server replicas the new tokens (drafts may be a step stale, never
wrong), and an instance that could schedule nothing because paused KV fills it is relieved of one request.

A lost instance is noticed by the transport (a dead process, an actor error, a kill) and reported to the
driver, whose requests then continue elsewhere; a rollout in which no instance makes progress for the stall
timeout ends in ``RolloutStalled`` (``stall.py``), never a hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.host import StepAnswer
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.instances.transport import Transport
from seer.rollout.policies import RolloutPolicy
from seer.rollout.stall import StallWatch
from seer.rollout.types import FaultPlan, RolloutStalled


def drive(driver: RolloutDriver, link: Transport, proxies: dict[int, RemoteInstanceProxy], policy: RolloutPolicy,
          stall_timeout_s: float, fault: FaultPlan | None = None,
          kill: Callable[[int], None] | None = None) -> None:
    """Run ``driver`` to completion on the wall clock; ``fault``: ``kill`` that instance at that time."""
    if policy.speculative:
        prompts = [(str(sp.group_id), sp.prompt_token_ids) for sp in driver.specs.values()]
        for iid in proxies:
            _post(link, iid, "register", prompts)
    t0 = time.time()
    driver.begin()
    killed = False
    watch = StallWatch(stall_timeout_s)
    while not driver.done:
        if fault is not None and kill is not None and not killed and time.time() - t0 >= fault.at_s:
            kill(fault.instance_id)  # the transport knows it is gone, so the loss is noticed at once
            killed = True
        if not link.request_steps([iid for iid in sorted(driver.alive) if proxies[iid].has_work()]):
            raise RolloutStalled(driver.diagnose())
        for iid, answer in link.poll(min(0.5, watch.left_s())):
            if iid in driver.alive:
                _on_step(driver, link, proxies, iid, answer, t0, policy, watch)
        for iid in sorted(driver.alive):
            if not link.alive(iid):
                driver.now = time.time() - t0
                driver.on_instance_lost(iid)
        watch.check(driver)


def _on_step(driver: RolloutDriver, link: Transport, proxies: dict[int, RemoteInstanceProxy], iid: int,
             answer: StepAnswer, t0: float, policy: RolloutPolicy, watch: StallWatch) -> None:
    """One instance's step came back: its snapshot to the proxy, its report to the driver, its new tokens to
    the other replicas."""
    start, end, rep, snap = answer
    proxies[iid].refresh(snap)
    if rep is None:  # it had no work when the step ran (a start sent just after the step call runs after it)
        return
    driver.now = end - t0
    if policy.speculative and rep.new_tokens:
        updates = [(str(driver.specs[rid].group_id), str(rid), toks) for rid, toks in rep.new_tokens]
        for other in sorted(driver.alive - {iid}):
            _post(link, other, "feed", updates)
    rep.duration_s = end - start
    watch.heard(iid, rep)
    driver.on_step(iid, start - t0, rep)
    if rep.stalled and not rep.scheduled_tokens:
        driver.relieve(iid)


def _post(link: Transport, iid: int, command: str, *args: object) -> None:
    """A command whose loss does not matter: an instance that is gone is noticed by the loop's liveness check."""
    try:
        link.post(iid, command, *args)
    except InstanceLost:
        pass
