"""``RolloutCoordinator``: the user-facing rollout API over N engine instances.

It owns the instances (built once, weights loaded once each), the global KV pool and the grouped draft server,
and runs one rollout at a time through the ``RolloutDriver`` under a policy (``verl``, ``divided``, ``context``,
``seer``, ``oracle``). Every response records the weight version it was generated with; a rollout refuses to
start while instances disagree on the version, so a rollout never mixes weights.

Backend ``inprocess``: the instances live in this process and take turns; each step's duration is its measured
wall time, so every instance's timeline is what it would be on its own accelerator (with N instances the run
takes about N times the reported makespan). Backend ``local`` runs each instance in its own process (see
``rollout/backends/``), and ``ray`` as Ray actors, for real parallelism.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from seer.rollout.backends import Backend, make_backend
from seer.rollout.config import RolloutConfig
from seer.rollout.kv_pool import LocalKVPool
from seer.rollout.onpolicy import OnPolicyMonitor
from seer.rollout.policies import get_policy
from seer.rollout.types import FaultPlan, GroupInput, RolloutListener, RolloutResult
from seer.spec.policy import VerifyCostModel
from seer.utils.kv_size import kv_bytes_per_token


@dataclass
class RolloutOutput:
    result: RolloutResult
    weight_version: int
    policy: str
    wall_s: float
    texts: list[str]
    groups: list[GroupInput]
    onpolicy: dict = field(default_factory=dict)  # the on-policy report (seer/rollout/onpolicy.py)

    @property
    def metrics(self):
        return self.result.metrics

    def records(self) -> list[dict]:
        """One JSON-ready record per response (the JSONL rows)."""
        rows = []
        for r, text in zip(self.result.responses, self.texts):
            g = self.groups[r.group_id]
            rows.append({"group_id": r.group_id, "group_key": g.key, "index": r.index,
                         "prompt_token_ids": list(g.prompt_token_ids), "token_ids": r.token_ids,
                         "logprobs": r.logprobs, "text": text, "finish_reason": r.finish_reason,
                         "weight_version": self.weight_version, "finish_time_s": r.finish_time_s,
                         "instance_history": r.instance_history, "metadata": g.metadata or {}})
        return rows


class RolloutCoordinator:
    def __init__(self, model: str | Path, config: RolloutConfig | None = None) -> None:
        self.config = config or RolloutConfig()
        self.model = str(model)
        if not Path(self.model).is_dir():
            raise FileNotFoundError(f"model directory {self.model!r} does not exist")
        check_capacity(self.model, self.config)
        self._tmp = tempfile.TemporaryDirectory(prefix="seer-kvpool-")
        spill = self.config.spill_dir or self._tmp.name
        self.pool = LocalKVPool(int(self.config.pool_budget_gb * 2**30), spill)
        self.pool_version: int | None = None  # the weight version the pool's KV is computed under (None: initial)
        self.onpolicy = OnPolicyMonitor()
        self.backend = self._make_backend()
        from seer.models.tokenizer import Tokenizer
        self.tokenizer = Tokenizer.from_dir(self.model)

    def _make_backend(self) -> Backend:
        return make_backend(self.config.backend, self.model, self.config, self.pool)

    @property
    def weight_version(self) -> int:
        versions = set(self.backend.weight_versions())
        if len(versions) != 1:
            raise RuntimeError(f"instances disagree on the weight version: {sorted(versions)}")
        return versions.pop()

    def update_weights(self, source, version: int | None = None) -> int:
        """Load new weights on every instance (the synchronous barrier) and return the new version."""
        new = self.backend.update_weights(source, version)
        self.pool.close()
        self.pool = LocalKVPool(int(self.config.pool_budget_gb * 2**30), self.config.spill_dir or self._tmp.name)
        self.backend.set_pool(self.pool)
        self.pool_version = new
        return new

    def rollout(self, groups: list[GroupInput], policy: str | None = None, progress: bool = True,
                fault: FaultPlan | None = None, chunk_tokens: int | None = None,
                listener: RolloutListener | None = None) -> RolloutOutput:
        """Run one batch of groups to completion. ``listener`` hears each chunk's tokens and each finished
        group from the driver's thread, and may abort responses through the driver (see ``RolloutListener``)."""
        pol = get_policy(policy or self.config.policy)
        version = self.weight_version
        t0 = time.perf_counter()
        result = self.backend.run(pol, groups, chunk_tokens or self.config.chunk_tokens, progress, fault,
                                  listener=listener)
        wall = time.perf_counter() - t0
        versions = self.backend.weight_versions()
        if set(versions) != {version}:
            raise RuntimeError(f"weights changed during the rollout: instances at {sorted(set(versions))}, "
                               f"started at {version}")
        texts = [self.tokenizer.decode(r.token_ids) for r in result.responses]
        if self.pool_version is None:
            self.pool_version = version
        report = self.onpolicy.report(version, versions, self.pool_version,
                                      len(result.responses), result.stats.get("kv_sources") or {},
                                      result.stats.get("spec"))
        return RolloutOutput(result, version, pol.name, wall, texts, list(groups), report)

    def verify_cost(self) -> VerifyCostModel:
        """The profiled step cost T(B, n) of the instances (measured once, cached on disk)."""
        return self.backend.verify_cost()

    def close(self) -> None:
        from seer.utils.malloc import release_freed_memory

        self.backend.close()
        self.pool.close()
        self._tmp.cleanup()
        release_freed_memory()  # the engines' memory goes back to the system, not only to this heap

    def __enter__(self) -> "RolloutCoordinator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def available_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_capacity(model: str, config: RolloutConfig) -> None:
    """Refuse, before loading anything, a rollout whose instances cannot fit in this machine's memory."""
    engine = config.engine
    if config.backend == "ray" or engine.device != "cpu":
        return  # Ray places actors across nodes; GPU memory is checked by the engine itself
    from seer.models.config import ModelConfig

    mc = ModelConfig.from_dir(model)
    itemsize = engine.dtype_bytes
    weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    weights = weights * itemsize // 4 if mc.torch_dtype in (None, "float32") else weights
    kv_per_token = kv_bytes_per_token(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, itemsize)
    kv = (engine.num_kv_blocks * engine.block_size * kv_per_token if engine.num_kv_blocks is not None
          else int(engine.kv_cache_memory_gb * 2**30))
    need = config.instances * (weights + kv)
    avail = available_memory_bytes()
    if avail is not None and need > 0.9 * avail:
        raise ValueError(f"{config.instances} instances need about {need / 2**30:.1f} GiB (weights "
                         f"{weights / 2**30:.2f} GiB + KV {kv / 2**30:.2f} GiB each) but this machine has "
                         f"{avail / 2**30:.1f} GiB available; use fewer instances, less KV, or --backend ray")
