"""The one KV-size formula (callers are checked where they live: tests/models, tests/sim): GQA stores K and V per
KV head, MLA one shared latent, and the torch-free dtype sizes agree with torch's."""

from __future__ import annotations

import torch

from seer.engine.config import EngineConfig
from seer.utils.kv_size import DTYPE_BYTES, kv_bytes_per_token


def test_gqa_and_mla() -> None:
    assert kv_bytes_per_token(30, 3, 64, 2) == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token(27, 16, 128, 2.0, latent_dim=576) == 27 * 576 * 2.0
    assert kv_bytes_per_token(2, 1, 4, 0.5) == 8.0  # a quantised cache in the simulator


def test_dtype_bytes_agree_with_torch() -> None:
    for name, size in DTYPE_BYTES.items():
        assert getattr(torch, name).itemsize == size
    assert EngineConfig(dtype="bf16").dtype_bytes == 2 and EngineConfig(dtype="fp32").dtype_bytes == 4
