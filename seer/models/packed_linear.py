"""Pre-packed weights for the CPU decode path (oneDNN's blocked layout, packed once, reused every step).

Why: ``F.linear`` on a CPU tensor either hands the weight to oneDNN in plain row-major layout, which re-blocks
it on every call (bf16), or to MKL's sgemm (fp32), which is slow for the decode shapes: few rows against a wide
weight, above all the 49,152-wide LM head. A packed weight skips both costs; the decode step at batch 16-256
spends most of its time in these products, and the tail of a rollout runs at small batch where the gain is
largest (figures in benchmarks/README.md, "Pre-packed linears").

How: ``prepack_linears(model)`` switches every bf16/fp32 ``nn.Linear`` of an inference model to ``PackedLinear``
in place (a class swap, so parameter names, the loader and weight sync are untouched) and packs its weight. The
pack records the weight's version counter; any in-place change of the weight (``load_weights``,
``update_weights``) bumps it and the next call re-packs, so a stale pack is never used. bf16 outputs are
bit-identical to ``F.linear``; fp32 ones differ only in summation order (relative 1e-6), and the greedy tokens
and logprobs of the real model still match transformers' (tests/engine/test_smollm2.py). The packed copy
doubles the weights' memory. Autograd keeps ``F.linear``; ``SEER_PREPACK=0`` disables packing.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

PACKED_DTYPES = (torch.bfloat16, torch.float32)


def packing_supported(dtype: torch.dtype) -> bool:
    """Packing is on (``SEER_PREPACK`` unset or not 0) and this CPU's oneDNN can pack ``dtype`` weights: its
    bf16 path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, so an AVX2-only CPU packs float32 only."""
    return os.environ.get("SEER_PREPACK", "1") != "0" and _cpu_can_pack(dtype)


@functools.cache
def _cpu_can_pack(dtype: torch.dtype) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 256)
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that runs CPU inputs of its weight's dtype through a cached oneDNN-packed copy."""

    _packed: torch.Tensor | None
    _packed_version: int

    def pack(self) -> None:
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 256)
        self._packed_version = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self._packed is None or x.dtype != self.weight.dtype or x.device.type != "cpu"
                or (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        if self.weight._version != self._packed_version:
            self.pack()
        lead = x.shape[:-1]
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self._packed, self.bias, "none",
                                                 [], "")
        return out.view(*lead, out.shape[-1])


def prepack_linears(model: nn.Module) -> int:
    """Pack every bf16/fp32 CPU ``nn.Linear`` of ``model``; returns how many were packed (0 when unsupported)."""
    count = 0
    for module in model.modules():
        if (type(module) is nn.Linear and module.weight.dtype in PACKED_DTYPES and module.weight.device.type == "cpu"
                and packing_supported(module.weight.dtype)):
            module.__class__ = PackedLinear
            try:
                module.pack()
            except RuntimeError as e:  # an unusual oneDNN build: fall back to plain linear for good
                module._packed = None
                log.warning("weight pre-packing unavailable, using plain linear: %s", e)
                return count
            count += 1
    return count
