"""Engine configuration: one frozen dataclass, validated at construction, with derived values as properties.

Torch-free: the dtype stays a name until the model runner needs the torch dtype (``torch_dtype``), so configs
can be built, validated and shipped to workers by code that never loads torch (the control plane, the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from seer.engine.decode_reserve import DecodeReserveConfig
from seer.engine.scheduler import SchedulerConfig
from seer.utils.kv_size import DTYPE_BYTES
from seer.utils.machine import auto_dtype

if TYPE_CHECKING:
    import torch

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}  # accepted name -> torch attribute


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine instance.

    KV memory is given either as ``num_kv_blocks`` or as ``kv_cache_memory_gb`` (converted with the model's
    KV bytes per token). ``max_model_len`` defaults to the model's context length, capped at 8192. ``model`` may
    stay empty in a template (a rollout's per-instance settings): whoever builds the engine fills it in.
    """

    model: str = ""
    dtype: str = "auto"  # "auto": the faster of bf16 and fp32 on this device (seer.utils.machine.auto_dtype)
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 4.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    # admission leaves adaptive room for running requests' tokens (decode_reserve.py); rollout instances turn it
    # off (RolloutConfig.instance_engine)
    decode_reserve: bool = True
    seed: int = 0
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", auto_dtype(self.device))
        if self.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; choose auto or one of {sorted(_DTYPES)}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"unsupported device {self.device!r}; use 'cpu' or 'cuda[:N]'")
        if self.block_size < 1 or (self.num_kv_blocks is not None and self.num_kv_blocks < 1):
            raise ValueError("block_size and num_kv_blocks must be >= 1")
        if self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")

    def for_instance(self, instance_id: int) -> EngineConfig:
        """The config of instance ``instance_id`` of a rollout: the same settings with a seed of its own, so the
        samplers of several instances never draw one stream (unseeded rows would be alike across instances)."""
        from seer.sampling_params import mix_seed

        return replace(self, seed=mix_seed("instance", self.seed, instance_id))

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, _DTYPES[self.dtype])

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of weights and KV in ``dtype``, known without torch."""
        return DTYPE_BYTES[_DTYPES[self.dtype]]

    def resolve_num_blocks(self, kv_bytes_per_token: int) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        return max(1, int(self.kv_cache_memory_gb * 2**30) // (kv_bytes_per_token * self.block_size))

    MAX_DEFAULT_MODEL_LEN = 8192

    def model_len(self, max_position_embeddings: int) -> int:
        """The longest prompt + response an instance serves: ``max_model_len`` if set, else the model's context
        length capped at 8192 (a 128K-position model would otherwise size every table for contexts a rollout on
        this hardware never reaches)."""
        return self.max_model_len or min(max_position_embeddings, self.MAX_DEFAULT_MODEL_LEN)

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's settings, derived from these (the engine and the simulator build their schedulers
        from an ``EngineConfig``, so the two cannot hold different limits)."""
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                               max_model_len=max_model_len, enable_prefix_caching=self.enable_prefix_caching,
                               decode_reserve=DecodeReserveConfig() if self.decode_reserve else None)


def verl_rollout_engine() -> EngineConfig:
    """veRL's vLLM rollout settings, the engine the simulator models unless told otherwise: up to 1,024
    sequences and 8,192 tokens a step, admission of whatever fits now (no decode reserve)."""
    return EngineConfig(dtype="bfloat16", max_num_seqs=1024, max_num_batched_tokens=8192, decode_reserve=False)
