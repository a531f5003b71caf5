"""A rollout backend whose instances are simulated: the engine's rollout template, a cost model for the model.

Why a backend: a replay must decide exactly as the measured run did, so it goes through the same template every
engine backend runs (``Backend.run``: the driver built from the ``RolloutConfig`` with the same ordering,
dispatch, critical-path speedup from the instances' step profile and per-rollout seed, the same pool clearing
and drafting stats). Only the instances differ: ``SimInstance``s built from the same
``EngineConfig`` (scheduler limits, KV blocks, block size, prefix caching), each drafting through the engine's
``Speculator`` with the profile the engine used, priced by ``cost``, on virtual time like the in-process backend.

The paper's presets run through it too, at a token quantum ``q`` (a simulated token stands for ``q`` real ones,
sim_instance.py): the caller gives the engine config in simulated blocks. Their instances draft with a fitted
acceptance model instead of suffix trees (``speculators``) and the drafting policy sees the cost model's prices
(``price_drafts``), since no engine profiled them. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seer.engine.block_manager import BlockManager
from seer.engine.scheduler import Scheduler
from seer.engine.speculator import Speculator
from seer.rollout.backends.base import Backend
from seer.rollout.config import RolloutConfig
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import Instance
from seer.rollout.policies import RolloutPolicy
from seer.rollout.types import FaultPlan
from seer.sim.cost_model import CostModel
from seer.sim.pool import SimKVPool
from seer.sim.sim_instance import SimInstance
from seer.spec.draft_server import DraftServer
from seer.spec.policy import VerifyCostModel

# a policy -> every instance's speculator and the draft service the driver tells of finished groups (or None)
Speculators = Callable[[RolloutPolicy], tuple[list[Any], DraftServer | None]]


class SimBackend(Backend):
    virtual_time = True

    def __init__(self, config: RolloutConfig, cost: CostModel, profile: VerifyCostModel, *, max_model_len: int,
                 eos_token_ids: tuple[int, ...] = (), quantum: int = 1, speculators: Speculators | None = None,
                 price_drafts: bool = False, record: bool = False, check: bool = False) -> None:
        """``profile``: the step profile the engine's draft policy and critical-path placement used;
        ``max_model_len`` and ``eos_token_ids``: the engine's context limit and the model's end tokens (in
        simulated tokens of ``quantum`` real ones); ``speculators``: how drafting policies draft (default: the
        engine's ``Speculator`` over one draft server, with ``profile``); ``price_drafts``: see ``SimInstance``;
        ``check``: integrity checks after every step."""
        if config.engine.num_kv_blocks is None:
            raise ValueError("a simulated instance needs engine.num_kv_blocks (its KV capacity in blocks)")
        super().__init__("simulated", config)
        self.cost = cost
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.quantum = quantum
        self.speculators = speculators
        self.price_drafts = price_drafts
        self.record = record
        self.check = check
        self.pool = SimKVPool()
        self._cost = profile
        self.last: list[SimInstance] = []  # the instances of the latest rollout (timelines, integrity checks)

    def weight_versions(self) -> list[int]:
        return [0] * self.config.instances

    def update_weights(self, source: Any, version: int | None = None) -> int:
        raise NotImplementedError("simulated instances hold no weights")

    def _measure_cost(self) -> VerifyCostModel:
        raise AssertionError("the profile is given at construction")

    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], DraftServer | None]:
        engine = self.config.instance_engine(self.model)
        specs, server = self._speculators(policy)
        self.last = []
        for i, spec in enumerate(specs):
            scheduler = Scheduler(engine.scheduler_config(self.max_model_len),
                                  BlockManager(engine.num_kv_blocks or 0, engine.block_size,
                                               engine.enable_prefix_caching))
            self.last.append(SimInstance(i, scheduler, self.cost, quantum=self.quantum, pool=self.pool,
                                         speculator=spec, record=self.record, check=self.check,
                                         price_drafts=self.price_drafts, eos_token_ids=self.eos_token_ids))
        return list(self.last), server

    def _speculators(self, policy: RolloutPolicy) -> tuple[list[Any], DraftServer | None]:
        n = self.config.instances
        if not policy.speculative:
            return [None] * n, None
        if self.speculators is not None:
            return self.speculators(policy)
        server = DraftServer()
        spec_cfg = self.config.spec
        cost = self.verify_cost() if spec_cfg.adaptive else None
        return [Speculator.build(spec_cfg, cost, server) for _ in range(n)], server

    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        if self.check:
            progress = driver.on_progress

            def checked(d: RolloutDriver) -> None:
                d.buffer.check_integrity()
                for iid in d.alive:
                    d.instances[iid].check_integrity()  # type: ignore[attr-defined]
                if progress is not None:
                    progress(d)
            driver.on_progress = checked
        driver.run()
        driver.buffer.check_integrity()
        for inst in self.last:
            inst.check_integrity()

    def _clear_kv(self) -> int:
        return self.pool.clear()

    def kv_entries(self) -> int:
        return len(self.pool)

    def close(self) -> None:
        self.last = []
