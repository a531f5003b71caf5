"""How every backend runs a rollout, whatever runs its instances: the one rollout loop of the runtime.

Around the steps, every backend does the same things, and they live here once (``Backend.run``): make its
instances ready for this policy and restart their per-rollout counters; empty the KV pool (request ids restart
each rollout, so an old entry would pass for a new request's KV); build the driver with the policy's ordering,
dispatch and critical-path settings; show progress; drive steps until every group has its G responses; then
release the KV instances still hold, empty the pool again (what is left there is garbage), and attach the
drafting stats.
A backend says only how its instances are made ready (``_prepare``), how steps are driven (``_drive``) and where
its pool lives (``_clear_kv``, ``kv_entries``).

In-process instances run on virtual time (each instance's measured step durations, one clock each), so faults
are injected by the driver at a virtual time; local processes and Ray actors run on the wall clock, and their
loops inject faults themselves.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from seer.engine.config import EngineConfig
from seer.rollout.config import RolloutConfig
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import Instance
from seer.rollout.instances.faulty import FaultyInstance
from seer.rollout.policies import RolloutPolicy
from seer.rollout.types import FaultPlan, GroupInput, RolloutListener, RolloutResult
from seer.sampling_params import mix_seed
from seer.spec.metrics import SpecCounters
from seer.spec.policy import VerifyCostModel


class Backend(abc.ABC):
    virtual_time = False  # True: steps are timed per instance and the driver injects faults
    # virtual time only: called before each step, where rollouts in threads take turns (rollout/turns.py)
    pace: Callable[[], None] | None = None

    def __init__(self, model: str, config: RolloutConfig) -> None:
        self.model = model
        self.config = config
        self.rollouts = 0  # rollouts run: unseeded responses of each draw from a stream of their own
        self._cost: VerifyCostModel | None = None

    # ------------------------------------------------------------------ weights and the step profile
    @abc.abstractmethod
    def weight_versions(self) -> list[int]:
        """The weight version of every instance (one entry each)."""

    @abc.abstractmethod
    def update_weights(self, source: Any, version: int | None = None) -> int:
        """Load new weights on every instance; returns the version they all hold."""

    def set_pool(self, pool: Any) -> None:
        """The coordinator replaced its pool (new weights): backends whose instances use it take the new one."""

    def verify_cost(self) -> VerifyCostModel:
        """The instances' profiled step cost T(B, n): measured once, cached on disk and here."""
        if self._cost is None:
            self._cost = self._measure_cost()
        return self._cost

    @abc.abstractmethod
    def _measure_cost(self) -> VerifyCostModel:
        """Profile (or read the cached profile of) one instance as configured."""

    # ------------------------------------------------------------------ the rollout template
    def run(self, policy: RolloutPolicy, groups: list[GroupInput], chunk_tokens: int, progress: bool,
            fault: FaultPlan | None, listener: RolloutListener | None = None) -> RolloutResult:
        cost = self.verify_cost() if policy.critical else None  # profiled (once) before counters restart
        instances, drafts = self._prepare(policy)
        self._clear_kv()
        if fault is not None and fault.during != "step":  # dies in the middle of moving KV, not at a time
            iid = fault.instance_id
            instances = [FaultyInstance(i, fault.during, self._killer(iid)) if i.instance_id == iid else i
                         for i in instances]
            fault = None
        with tqdm(total=sum(g.size for g in groups), disable=not progress, desc=f"rollout[{policy.name}]",
                  unit="resp") as bar:
            driver = RolloutDriver(policy, instances, groups, chunk_tokens, **self._driver_kwargs(policy, cost),
                                   on_progress=_progress(bar), fault=fault if self.virtual_time else None,
                                   draft_server=drafts, listener=listener,
                                   seed=mix_seed("rollout", self.config.engine.seed, self.rollouts))
            self.rollouts += 1
            driver.pace = self.pace if self.virtual_time else None
            self._drive(driver, policy, None if self.virtual_time else fault)
            bar.update(driver.buffer.num_finished - bar.n)
        for inst in instances:  # a proxy of a dead instance ignores the call: its KV is gone anyway
            for rid in inst.resident():
                inst.release(rid)
        result = driver.result()
        # every response is done, so any entry left is garbage: KV of aborted requests, KV an instance died
        # before importing
        result.stats["kv_entries_dropped"] = self._clear_kv()
        if policy.speculative:
            result.stats["spec"] = self._spec_stats(drafts, result)
        return result

    def _driver_kwargs(self, policy: RolloutPolicy, cost: VerifyCostModel | None) -> dict[str, Any]:
        """The driver's settings from the rollout config (a backend whose token is not one token adapts them)."""
        return self.config.driver_kwargs(policy, cost)

    @abc.abstractmethod
    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], Any]:
        """Instances ready for a rollout under ``policy`` (counters restarted), and the draft service the
        driver tells when a group finishes (None without drafting)."""

    @abc.abstractmethod
    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        """Run steps until ``driver.done``; ``fault``: kill an instance at that wall time (wall-clock backends)."""

    @abc.abstractmethod
    def _clear_kv(self) -> int:
        """Empty the pool KV moves through between instances; returns how many entries it held."""

    @abc.abstractmethod
    def kv_entries(self) -> int:
        """Entries in the pool KV moves through between instances (none are left after a rollout)."""

    def _killer(self, instance_id: int) -> Callable[[], None]:
        """How to kill an instance for a fault plan (nothing to do for one in this process)."""
        return lambda: None

    def kill_instance(self, instance_id: int) -> None:
        """Kill an instance now (fault injection: ``seer bench faults``); the next rollout or weight update
        notices and starts it again. A no-op for instances in this process."""
        self._killer(instance_id)()

    @staticmethod
    def _spec_stats(drafts: Any, result: RolloutResult) -> dict:
        """Drafting stats: the draft server's own (per group included) where it runs here, else the instances'
        summed verification counters (tau and acceptance; remote replicas keep their per-group counters); and
        in both cases ``by_source``, the instances' counters split by where the drafts came from."""
        instances = list(result.stats["instances"].values())
        total = _summed(instances, "spec_drafted", "spec_accepted", "spec_steps")
        history = _summed(instances, "history_drafted", "history_accepted", "history_steps")
        group = SpecCounters(total.drafted - history.drafted, total.accepted - history.accepted,
                             total.bonus - history.bonus, total.steps - history.steps)
        by_source = {name: {k: c.as_dict()[k] for k in ("drafted", "accepted", "steps", "tau", "accept_rate")}
                     for name, c in (("group", group), ("history", history))}
        metrics = getattr(drafts, "metrics", None)
        if metrics is not None:
            return {**metrics.as_dict(), "by_source": by_source}
        out = total.as_dict()
        for unknown in ("plain_steps", "tokens_per_step"):  # remote instances do not count plain steps
            out.pop(unknown)
        return {**out, "by_source": by_source}

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the instances and free what they hold."""


def _summed(stats: list[dict], drafted: str, accepted: str, steps: str) -> SpecCounters:
    """Verification counters summed over instances' stats: every verification step emits one bonus token."""
    n = sum(int(st.get(steps, 0)) for st in stats)
    return SpecCounters(sum(int(st.get(drafted, 0)) for st in stats), sum(int(st.get(accepted, 0)) for st in stats),
                        n, n)


class BroadcastDrafts:
    """Stands in for the draft server in the driver where instances run elsewhere: each keeps a replica, so a
    finished group is announced to all of them (``finish``: how one backend sends that)."""

    def __init__(self, finish: Callable[[str], None]) -> None:
        self.finish = finish

    def has_group(self, gid: str) -> bool:
        return True

    def finish_group(self, gid: str) -> None:
        self.finish(gid)


def profile_here(engine_config: EngineConfig) -> VerifyCostModel:
    """The step profile of one instance as configured, measured in this process (or read from the disk cache)
    for backends whose instances run elsewhere; the torch thread count is restored afterwards."""
    import torch

    from seer.engine.llm_engine import LLMEngine
    from seer.engine.profiler import profile_verify_cost
    from seer.utils.io import cache_dir

    threads = torch.get_num_threads()
    try:
        engine = LLMEngine(engine_config)
        return profile_verify_cost(engine, cache_dir=cache_dir() / "profiles")
    finally:
        torch.set_num_threads(threads)


def _progress(bar: tqdm):
    """The driver's progress callback: finished responses, and tokens per second of rollout time."""

    def update(driver: RolloutDriver) -> None:
        bar.update(driver.buffer.num_finished - bar.n)
        bar.set_postfix(tok_s=f"{driver.counters.emitted / max(driver.now, 1e-9):.0f}",
                        running=driver.buffer.num_running, queued=driver.buffer.num_buffered)

    return update
