"""Pre-packed bf16 weights for the CPU decode path (oneDNN's blocked layout, packed once, reused every step).

Why: ``F.linear`` on a bf16 CPU tensor hands the weight to oneDNN in plain row-major layout, and oneDNN
re-blocks it on every call. For a decode step that is most of the cost at small batch: measured here (2 cores,
576 x 3072 weight) 0.148 ms vs 0.049 ms at batch 1, 0.249 vs 0.099 at batch 8, 2.40 vs 2.19 at batch 256,
with bit-identical outputs. The tail of a rollout runs at small batch and draft verification adds a few rows
per request, so both gain the most.

How: ``prepack_linears(model)`` switches every ``nn.Linear`` of an inference model to ``PackedLinear`` in place
(a class swap, so parameter names, the loader and weight sync are untouched) and packs its weight. The pack
records the weight's version counter; any in-place change of the weight (``load_weights``, ``update_weights``)
bumps it and the next call re-packs, so a stale pack is never used. Only bf16 on CPU is packed: float32 keeps
the exact reference path of the equivalence tests. ``SEER_PREPACK=0`` disables packing.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def packing_supported() -> bool:
    """Packing is on (``SEER_PREPACK`` unset or not 0) and this CPU's oneDNN can pack bf16 weights: its bf16
    path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, so an AVX2-only CPU keeps plain linears."""
    return os.environ.get("SEER_PREPACK", "1") != "0" and _cpu_can_pack()


@functools.cache
def _cpu_can_pack() -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 256)
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that runs bf16 CPU inputs through a cached oneDNN-packed copy of its weight."""

    _packed: torch.Tensor | None
    _packed_version: int

    def pack(self) -> None:
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 256)
        self._packed_version = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self._packed is None or x.dtype != torch.bfloat16 or x.device.type != "cpu"
                or (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        if self.weight._version != self._packed_version:
            self.pack()
        lead = x.shape[:-1]
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self._packed, self.bias, "none",
                                                 [], "")
        return out.view(*lead, out.shape[-1])


def prepack_linears(model: nn.Module) -> int:
    """Pack every bf16 CPU ``nn.Linear`` of ``model``; returns how many were packed (0 when unsupported)."""
    if not packing_supported():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16 and module.weight.device.type == "cpu":
            module.__class__ = PackedLinear
            try:
                module.pack()
            except RuntimeError as e:  # an unusual oneDNN build: fall back to plain linear for good
                module._packed = None
                log.warning("weight pre-packing unavailable, using plain linear: %s", e)
                return count
            count += 1
    return count
