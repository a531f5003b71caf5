"""``RolloutConfig``: one rollout's settings, composed of the sections that other layers own.

The per-instance engine (``EngineConfig``), drafting (``SpecConfig``) and the context ordering
(``OrderingConfig``) are nested as they are, never restated field by field, so the API, the YAML of ``seer
train`` (``rollout.engine.dtype``, ``rollout.spec.gamma_max``), the server and the benchmarks name every setting
the same way and a new engine setting reaches all of them at once. Torch-free: configs are built and checked by
code that never loads a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from seer.engine.config import EngineConfig
from seer.engine.speculator import SpecConfig
from seer.rollout.critical_path import batch_speedup, lone_companions
from seer.rollout.orderings import OrderingConfig
from seer.rollout.policies import RolloutPolicy, get_policy
from seer.spec.policy import VerifyCostModel

BACKENDS = ("inprocess", "local", "ray")  # where instances run (rollout/backends/)


def default_instance_engine() -> EngineConfig:
    """An instance's engine unless told otherwise: 1 GiB of KV each, since a rollout runs several per machine."""
    return EngineConfig(kv_cache_memory_gb=1.0)


@dataclass(frozen=True)
class RolloutConfig:
    policy: str = "seer"
    instances: int = 2
    backend: str = "inprocess"
    chunk_tokens: int = 128
    engine: EngineConfig = field(default_factory=default_instance_engine)  # every instance's engine; model unset
    spec: SpecConfig = field(default_factory=SpecConfig)
    ordering: OrderingConfig = field(default_factory=OrderingConfig)  # knobs of the context ordering
    pool_budget_gb: float = 4.0
    spill_dir: str | None = None
    # a request's next chunk stays on the instance holding its KV only while that instance runs at most this
    # many more requests than the least loaded one (None: always); else it goes where dispatch puts it, KV moved
    kv_affinity_spread: int | None = 32
    # divided rollout: a chunk reserves KV for this many of its tokens at admission (a critical request's chunk: all
    # of them) and allocates the rest as it runs, ending early where the instance's KV runs out; None: whole chunks
    chunk_reserve_tokens: int | None = 16
    # processes and Ray actors: a rollout in which no instance makes progress for this long is stalled (an error
    # with a diagnosis, never a hang)
    stall_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        get_policy(self.policy)
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if self.stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {self.stall_timeout_s}")
        if self.kv_affinity_spread is not None and self.kv_affinity_spread < 0:
            raise ValueError(f"kv_affinity_spread must be >= 0 or None, got {self.kv_affinity_spread}")
        if self.chunk_reserve_tokens is not None and self.chunk_reserve_tokens < 1:
            raise ValueError(f"chunk_reserve_tokens must be >= 1 or None, got {self.chunk_reserve_tokens}")
        if self.pool_budget_gb <= 0:
            raise ValueError(f"pool_budget_gb must be > 0, got {self.pool_budget_gb}")

    def process_threads(self) -> int:
        """Torch threads of one instance process where none are set: the machine's cores split evenly."""
        return max(1, (os.cpu_count() or 1) // self.instances)

    def instance_engine(self, model: str, default_threads: int | None = None) -> EngineConfig:
        """The engine config of one instance of ``model``; ``default_threads`` where none is set (a worker
        process or actor takes one thread unless told otherwise: several share the machine). Admission never
        reserves room by ``max_tokens`` here: trace replay sets it to each response's recorded length, which would
        hand the baseline the lengths, and the simulator, which must decide as the engine does, models vLLM."""
        return replace(self.engine, model=model, num_threads=self.engine.num_threads or default_threads,
                       decode_reserve=False)

    def driver_kwargs(self, policy: RolloutPolicy, cost: VerifyCostModel | None = None) -> dict[str, Any]:
        """What every backend passes to the ``RolloutDriver`` besides policy, instances, groups and chunk size;
        ``cost``: the instances' step profile, which critical-path placement needs."""
        speedup, companions = None, 0
        if policy.critical:
            if cost is None:
                raise ValueError("critical-path placement needs the engine's step profile")
            decode = partial(cost.step_time, tokens_per_seq=1)  # a decode step's time at a batch
            speedup = batch_speedup(cost.batch_sizes, decode)
            companions = lone_companions(cost.batch_sizes, decode)
        return dict(ordering_config=self.ordering, affinity_spread=self.kv_affinity_spread,
                    critical_speedup=speedup, critical_companions=companions,
                    chunk_reserve_tokens=self.chunk_reserve_tokens)
