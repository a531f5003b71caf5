"""Building blocks shared by the decoder families: RMSNorm and the gated SiLU MLP.

Numerics follow HF exactly (RMSNorm normalises in float32, casts back, then scales), so fp32 logits match
transformers to rounding and bf16 behaves like the checkpoints were trained/evaluated. Projections that read
the same input are fused into one matmul (gate+up here, q+k+v in the attention), which on CPU saves a third of
the GEMM calls of a decode step; the loader slices HF tensors into the fused weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seer.models.rms_norm import rms_norm_fused


class RMSNorm(nn.Module):
    """y = w * (x / sqrt(mean(x^2) + eps)), normalised in float32 like HF."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = rms_norm_fused(x, self.weight, self.eps)  # CPU inference: one C pass, same arithmetic
        if fused is not None:
            return fused
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one [2I, hidden] weight."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
