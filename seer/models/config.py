"""Model hyper-parameters parsed from an HF ``config.json``, with no transformers import.

Llama, Qwen2 and Qwen3 share one decoder design and differ only in a few switches (QKV bias, per-head q/k
RMSNorm, explicit head_dim), so one frozen ``ModelConfig`` describes all three and the model code reads flags
rather than architecture names. Checkpoints written by transformers 4.x keep ``rope_theta``/``rope_scaling`` at
top level; 5.x writes ``rope_parameters``; both are accepted and normalised into ``RopeConfig``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seer.utils.kv_size import kv_bytes_per_token

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (``rope_type`` default, linear or llama3)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs; derived sizes are properties."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always; Llama/Qwen3 when attention_bias)
    o_bias: bool  # bias on o_proj (Llama/Qwen3 when attention_bias; never Qwen2)
    mlp_bias: bool
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str | None  # dtype the checkpoint was saved in, e.g. "bfloat16"

    # ------------------------------------------------------------------------------------------- derived
    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @property
    def attention_bias(self) -> bool:
        return self.qkv_bias

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def checkpoint_dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.torch_dtype or "")

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes of K and V cache one token occupies across all layers."""
        return kv_bytes_per_token(self.num_hidden_layers, self.num_key_value_heads, self.head_dim, dtype.itemsize)

    # ------------------------------------------------------------------------------------------- parsing
    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        """Read ``path/config.json``; missing dir/file -> FileNotFoundError, unsupported arch -> ValueError."""
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"model directory not found: {root}")
        cfg_file = root / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"no config.json in model directory {root}")
        with cfg_file.open(encoding="utf-8") as f:
            raw = json.load(f)
        return cls.from_dict(raw, source=str(cfg_file))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "ModelConfig":
        arch = _architecture(raw, source)
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim") or hidden // heads
        if raw.get("use_sliding_window"):
            raise ValueError(f"{source}: sliding-window attention (use_sliding_window=true) is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act {raw.get('hidden_act')!r} is not supported (only silu)")
        attention_bias = bool(raw.get("attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_parse_rope(raw, source),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen2 else attention_bias,
            o_bias=False if is_qwen2 else attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
            eos_token_ids=_eos_ids(raw.get("eos_token_id")),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
        )


def _architecture(raw: dict[str, Any], source: str) -> str:
    archs = raw.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    name = ", ".join(archs) if archs else f"<none; model_type={raw.get('model_type')!r}>"
    raise ValueError(f"{source}: unsupported architecture {name}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _eos_ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return ()


def _parse_rope(raw: dict[str, Any], source: str) -> RopeConfig:
    """Merge transformers-5 ``rope_parameters`` and transformers-4 ``rope_theta`` + ``rope_scaling``."""
    params: dict[str, Any] = {}
    if isinstance(raw.get("rope_scaling"), dict):
        params.update(raw["rope_scaling"])
    if isinstance(raw.get("rope_parameters"), dict):
        params.update(raw["rope_parameters"])
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: rope type {rope_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    orig = params.get("original_max_position_embeddings")
    return RopeConfig(
        theta=float(theta),
        rope_type=str(rope_type),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(orig) if orig is not None else None,
    )
