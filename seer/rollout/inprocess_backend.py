"""Instances in this process, taking turns on the CPU/GPU; time is each instance's measured step time.

Used by tests, trace-replay benchmarks and single-machine runs where determinism matters more than wall time.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from seer.engine.config import EngineConfig
from seer.engine.llm_engine import LLMEngine
from seer.engine.speculator import Speculator
from seer.rollout.driver import FaultPlan, GroupInput, RolloutDriver, RolloutListener, RolloutResult
from seer.rollout.engine_instance import EngineInstance
from seer.rollout.kv_pool import KVPool
from seer.rollout.policies import RolloutPolicy
from seer.spec.draft_server import DraftServer
from seer.spec.policy import PolicyConfig, SpecPolicy, VerifyCostModel


class InProcessBackend:
    def __init__(self, model: str, config, pool: KVPool) -> None:
        self.config = config
        self.pool = pool
        self.engines = [LLMEngine(EngineConfig(model=model, **config.engine_kwargs()))
                        for _ in range(config.instances)]
        self._cost = None

    def weight_versions(self) -> list[int]:
        return [e.weight_version for e in self.engines]

    def update_weights(self, source, version: int | None = None) -> int:
        versions = {e.update_weights(source, version) for e in self.engines}
        return versions.pop()

    def set_pool(self, pool: KVPool) -> None:
        self.pool = pool

    def verify_cost(self) -> VerifyCostModel:
        """The profiled step cost T(B, n) of these engines (measured once, cached on disk)."""
        if self._cost is None:
            from seer.utils.io import cache_dir
            from seer.engine.profiler import profile_verify_cost
            self._cost = profile_verify_cost(self.engines[0], cache_dir=cache_dir() / "profiles")
        return self._cost

    def _speculators(self, policy: RolloutPolicy) -> tuple[list[Speculator | None], DraftServer | None]:
        if not policy.speculative:
            return [None] * len(self.engines), None
        spec = self.config.spec
        server = DraftServer()
        return [Speculator(server, SpecPolicy(self.verify_cost(), PolicyConfig(gamma_max=spec.gamma_max))
                           if spec.adaptive else None, spec) for _ in self.engines], server

    def run(self, policy: RolloutPolicy, groups: list[GroupInput], chunk_tokens: int, progress: bool,
            fault: FaultPlan | None, listener: RolloutListener | None = None) -> RolloutResult:
        specs, server = self._speculators(policy)
        self.pool.clear()  # request ids restart each rollout: an old entry would pass for a new request's KV
        instances = [EngineInstance(i, e, self.pool, s) for i, (e, s) in enumerate(zip(self.engines, specs))]
        total = sum(g.size for g in groups)
        with tqdm(total=total, disable=not progress, desc=f"rollout[{policy.name}]", unit="resp") as bar:
            def on_progress(driver: RolloutDriver) -> None:
                done = driver.buffer.num_finished
                bar.update(done - bar.n)
                tok_s = driver.counters["emitted"] / max(driver.now, 1e-9)
                bar.set_postfix(tok_s=f"{tok_s:.0f}", running=driver.buffer.num_running,
                                queued=driver.buffer.num_buffered)

            cost = self.verify_cost() if policy.critical else None
            driver = RolloutDriver(policy, instances, groups, chunk_tokens, **self.config.driver_kwargs(policy, cost),
                                   on_progress=on_progress, fault=fault, draft_server=server, listener=listener)
            result = driver.run()
        for inst in instances:
            for rid in inst.resident():
                inst.release(rid)
        for rid in driver.aborted:
            self.pool.drop(rid)  # KV an aborted request had parked in the pool
        if server is not None:
            result.stats["spec"] = server.metrics.as_dict()  # per_group included: a bench reads one group
        return result

    def close(self) -> None:
        self.engines.clear()
