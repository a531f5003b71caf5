"""Small simulated workloads for the simulator tests (seconds, not minutes)."""

from __future__ import annotations

from seer.sim.hardware import InstanceSpec, get_accelerator, get_model
from seer.sim.lengths import LengthModel
from seer.sim.workloads import Cluster, Workload, WorkloadGroup


def small_cluster(instances: int = 2, kv_tokens: int = 6000, model: str = "qwen2.5-7b") -> Cluster:
    return Cluster(InstanceSpec(get_accelerator("h100"), get_model(model), 1, kv_tokens=kv_tokens), instances)


def small_workload(groups: int = 8, size: int = 4, mean: int = 300, max_tokens: int = 1024, sigma: float = 0.8,
                   seed: int = 0, instances: int = 2, kv_tokens: int = 6000) -> Workload:
    """Group-correlated lengths, one cluster of ``instances`` small instances."""
    lengths = LengthModel(mean, max_tokens, sigma, 0.7).sample(groups, size, seed)
    gs = tuple(WorkloadGroup(40 + 8 * i, tuple(int(x) for x in lengths[i]), key=f"t{i}") for i in range(groups))
    return Workload("small", gs, max_tokens, small_cluster(instances, kv_tokens), "test")
