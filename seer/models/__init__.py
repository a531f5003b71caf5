"""Model package: HF checkpoints (Llama, Qwen2, Qwen3) as our own PyTorch modules over a paged KV cache.

Exports are resolved lazily so that importing a light submodule (``seer.models.tokenizer``) from torch-free
code does not import torch and the model code with it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AttentionMetadata": "seer.models.attention",
    "ModelConfig": "seer.models.config",
    "CausalLM": "seer.models.llama",
    "load_model": "seer.models.loader",
    "load_weights": "seer.models.loader",
    "hf_state_dict": "seer.models.loader",
    "allocate_kv_caches": "seer.models.paged_attention",
    "paged_attention": "seer.models.paged_attention",
    "Tokenizer": "seer.models.tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seer.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
