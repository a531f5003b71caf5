"""Instances in this process, taking turns on the CPU/GPU; time is each instance's measured step time.

Used by tests, trace-replay benchmarks and single-machine runs where determinism matters more than wall time:
each instance keeps its own virtual clock (its steps' measured durations, drafting and KV movement included),
so eight instances on one core are timed as eight accelerators would be. The instances share one copy of the
weights (they never run at once), so memory does not grow with their number.
"""

from __future__ import annotations

from seer.engine.llm_engine import LLMEngine
from seer.engine.speculator import Speculator
from seer.rollout.backends.base import Backend
from seer.rollout.config import RolloutConfig
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import Instance
from seer.rollout.instances.engine import EngineInstance
from seer.rollout.kv_pool import KVPool
from seer.rollout.policies import RolloutPolicy
from seer.rollout.types import FaultPlan
from seer.spec.draft_server import DraftServer
from seer.spec.policy import VerifyCostModel


class InProcessBackend(Backend):
    virtual_time = True

    def __init__(self, model: str, config: RolloutConfig, pool: KVPool) -> None:
        super().__init__(model, config)
        self.pool = pool
        first = LLMEngine(config.instance_engine(model).for_instance(0))
        self.engines = [first] + [LLMEngine(config.instance_engine(model).for_instance(i), weights_from=first)
                                  for i in range(1, config.instances)]

    def weight_versions(self) -> list[int]:
        return [e.weight_version for e in self.engines]

    def update_weights(self, source, version: int | None = None) -> int:
        busy = [i for i, e in enumerate(self.engines) if e.has_unfinished()]
        if busy:
            raise RuntimeError(f"update_weights while instances {busy} run requests would mix weight versions")
        new = self.engines[0].update_weights(source, version)  # the one copy all instances share
        for engine in self.engines[1:]:
            engine.weights_changed(new)
        return new

    def set_pool(self, pool: KVPool) -> None:
        self.pool = pool

    def _measure_cost(self) -> VerifyCostModel:
        from seer.engine.profiler import profile_verify_cost
        from seer.utils.io import cache_dir

        return profile_verify_cost(self.engines[0], cache_dir=cache_dir() / "profiles")

    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], DraftServer | None]:
        for engine in self.engines:  # an instance killed by a fault plan kept the requests it was running
            for rid in list(engine.scheduler.requests):
                engine.abort(rid)
        server = DraftServer() if policy.speculative else None
        instances: list[Instance] = []
        cfg = self.config.spec
        for i, engine in enumerate(self.engines):
            spec = None
            if server is not None:
                spec = Speculator.build(cfg, self.verify_cost() if cfg.adaptive else None, server)
            instances.append(EngineInstance(i, engine, self.pool, spec))  # new instances: counters start at 0
        return instances, server

    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        driver.run()

    def _clear_kv(self) -> int:
        return self.pool.clear()

    def kv_entries(self) -> int:
        return self.pool.stats().entries

    def close(self) -> None:
        self.engines.clear()
