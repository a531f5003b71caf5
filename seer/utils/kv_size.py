"""Bytes of KV cache one token occupies: the one formula the engine, the rollout's memory check and the simulator use.

Why here, torch-free: the engine sizes its cache with it, ``check_capacity`` refuses rollouts that cannot fit
before loading anything, and the simulator prices KV reads and transfers with it; the last two never import torch,
so the dtype arrives as its size in bytes (``DTYPE_BYTES`` maps the engine's dtype names).
"""

from __future__ import annotations

from typing import TypeVar

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per element of the engine's KV dtypes

Size = TypeVar("Size", int, float)  # whole bytes for a real cache; fractional for a simulated (quantised) one


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: Size, *,
                       latent_dim: int = 0) -> Size:
    """K and V of one token in every layer: 2 x layers x KV heads x head_dim x bytes per element. MLA models
    (``latent_dim`` > 0: cached latent plus rope dims per layer, which K and V share) store ``latent_dim`` elements
    per layer instead."""
    per_layer = latent_dim if latent_dim > 0 else 2 * num_kv_heads * head_dim
    return num_layers * per_layer * dtype_bytes
