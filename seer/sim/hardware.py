"""Accelerator and model profiles: the numbers a roofline cost model needs, and nothing else.

Why profiles instead of measured tables: users size clusters before they own them, so the simulator must price a
step on an accelerator it has never seen. A roofline needs only peak bf16 FLOP/s, HBM bandwidth and memory per
accelerator, and per model the parameters touched per token (dense or MoE), the attention shape (KV bytes per
token, attention FLOPs per query-context pair) and the hidden size (tensor-parallel all-reduce volume). What a
roofline cannot know (kernel efficiency, launch and scheduling overhead) lives in ``CostConstants`` and is fitted
by ``calibrate.py`` to measured steps.

Sources: vendor datasheets (SXM parts, dense bf16 without sparsity) and the models' published configs
(Moonlight-16B-A3B and Kimi-K2 use DeepSeek-V3-style MLA: 512 latent + 64 rope dims of KV per layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from seer.utils.kv_size import kv_bytes_per_token

GB = 1e9


@dataclass(frozen=True)
class AcceleratorProfile:
    name: str
    peak_flops: float       # dense bf16 FLOP/s
    hbm_bandwidth: float    # bytes/s
    memory_bytes: float     # HBM capacity
    link_bandwidth: float   # intra-instance interconnect (NVLink) bytes/s per GPU, for TP all-reduce

    def __post_init__(self) -> None:
        for f in ("peak_flops", "hbm_bandwidth", "memory_bytes", "link_bandwidth"):
            if getattr(self, f) <= 0:
                raise ValueError(f"accelerator {self.name}: {f} must be > 0")


ACCELERATORS: dict[str, AcceleratorProfile] = {a.name: a for a in (
    AcceleratorProfile("h800", 989.5e12, 3.35e12, 80 * GB, 400 * GB),
    AcceleratorProfile("h100", 989.5e12, 3.35e12, 80 * GB, 900 * GB),
    AcceleratorProfile("h200", 989.5e12, 4.8e12, 141 * GB, 900 * GB),
    AcceleratorProfile("a100", 312e12, 2.039e12, 80 * GB, 600 * GB),
    # This machine's 2 CPU cores (AVX2 FMA, fp32), for calibrating against the real engine here.
    AcceleratorProfile("cpu-2core", 150e9, 20 * GB, 16 * GB, 20 * GB),
)}


@dataclass(frozen=True)
class ModelProfile:
    """Dense (``num_experts == 0``) or MoE; GQA or MLA (``mla_kv_dim`` set) attention."""

    name: str
    total_params: float
    active_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int = 0
    experts_per_token: int = 0
    mla_kv_dim: int = 0            # MLA: cached latent + rope dims per layer (K and V share it)
    mla_v_dim: int = 0             # MLA: per-head value dim after absorption (the latent dim)
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0

    def __post_init__(self) -> None:
        if self.active_params <= 0 or self.total_params < self.active_params:
            raise ValueError(f"model {self.name}: need 0 < active_params <= total_params")
        if self.num_experts and not 0 < self.experts_per_token < self.num_experts:
            raise ValueError(f"model {self.name}: experts_per_token must be in (0, num_experts)")
        if min(self.num_layers, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim) < 1:
            raise ValueError(f"model {self.name}: layer/head sizes must be >= 1")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_dim > 0

    @property
    def kv_bytes_per_token(self) -> float:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_bytes_per_elem,
                                  latent_dim=self.mla_kv_dim)

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of one query token attending to one context token, all layers (scores + weighted values)."""
        qk, v = (self.mla_kv_dim, self.mla_v_dim) if self.is_mla else (self.head_dim, self.head_dim)
        return 2.0 * self.num_layers * self.num_heads * (qk + v)

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert summed over layers (0 for dense models)."""
        if not self.is_moe:
            return 0.0
        return (self.total_params - self.active_params) / (self.num_experts - self.experts_per_token)

    @property
    def shared_params(self) -> float:
        """Parameters every token touches (attention, shared experts, embeddings)."""
        return self.active_params - self.experts_per_token * self.expert_params

    def weight_bytes_read(self, num_tokens: float) -> float:
        """Bytes of weights a step with ``num_tokens`` tokens streams from HBM (MoE: experts hit at least once)."""
        if not self.is_moe:
            return self.weight_bytes
        miss = (1.0 - self.experts_per_token / self.num_experts) ** max(num_tokens, 1.0)
        touched = self.num_experts * (1.0 - miss)
        return (self.shared_params + touched * self.expert_params) * self.weight_bytes_per_param


MODELS: dict[str, ModelProfile] = {m.name: m for m in (
    ModelProfile("moonlight-16b-a3b", 16.0e9, 3.0e9, 27, 2048, 16, 16, 128, num_experts=64,
                 experts_per_token=6, mla_kv_dim=576, mla_v_dim=512),
    ModelProfile("qwen2-vl-72b", 72.7e9, 72.7e9, 80, 8192, 64, 8, 128),
    ModelProfile("kimi-k2", 1.04e12, 32.6e9, 61, 7168, 64, 64, 128, num_experts=384, experts_per_token=8,
                 mla_kv_dim=576, mla_v_dim=512, weight_bytes_per_param=1.0),  # fp8 weights as released
    ModelProfile("qwen2.5-7b", 7.6e9, 7.6e9, 28, 3584, 28, 4, 128),
    ModelProfile("smollm2-135m", 134.5e6, 134.5e6, 30, 576, 9, 3, 64),
)}


@dataclass(frozen=True)
class InstanceSpec:
    """One engine instance: ``gpus`` accelerators holding one model replica (TP/EP inside the instance).

    KV memory: ``gpu_memory_utilization`` of HBM minus the weights and an activation reserve. ``kv_shards`` is
    how many ways the KV cache is split across the instance's GPUs: GQA under tensor parallelism splits it by KV
    head (up to ``num_kv_heads`` ways); MLA's latent cache is replicated across TP ranks (1 shard) unless the
    engine runs data-parallel attention. ``kv_tokens`` overrides the derived capacity.
    """

    accelerator: AcceleratorProfile
    model: ModelProfile
    gpus: int = 1
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 4 * GB
    kv_shards: int = 0                 # 0: derive from the attention type
    kv_tokens: int = 0                 # 0: derive from memory

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus per instance must be >= 1, got {self.gpus}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.kv_tokens < 0 or self.kv_shards < 0:
            raise ValueError("kv_tokens and kv_shards must be >= 0")
        if self.kv_tokens == 0 and self.memory_kv_tokens <= 0:
            raise ValueError(f"{self.model.name} does not fit on {self.gpus} x {self.accelerator.name} "
                             f"at gpu_memory_utilization {self.gpu_memory_utilization}: no room for KV")

    @property
    def effective_kv_shards(self) -> int:
        if self.kv_shards:
            return self.kv_shards
        return 1 if self.model.is_mla else min(self.gpus, self.model.num_kv_heads)

    @property
    def memory_kv_tokens(self) -> int:
        """KV tokens the instance's memory holds after weights and the activation reserve."""
        per_gpu = (self.accelerator.memory_bytes * self.gpu_memory_utilization - self.activation_reserve_bytes
                   - self.model.weight_bytes / self.gpus)
        kv_per_gpu_per_token = self.model.kv_bytes_per_token / self.effective_kv_shards
        return int(per_gpu / kv_per_gpu_per_token) if per_gpu > 0 else 0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_tokens or self.memory_kv_tokens


def get_accelerator(name: str) -> AcceleratorProfile:
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise ValueError(f"unknown accelerator {name!r}; known: {', '.join(ACCELERATORS)}") from None


def get_model(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model profile {name!r}; known: {', '.join(MODELS)}") from None
