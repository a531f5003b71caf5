"""Fused RMSNorm on CPU (``rms_norm.c``) for bf16 and float32 inference, with the PyTorch formula as the reference.

Why: ``layers.RMSNorm`` in PyTorch is ~5-8 small ops per call and a decode step makes 61 calls (2 per layer plus
the final norm; more with q/k norms); the C version does one pass per row with the same arithmetic (see the
header of ``rms_norm.c``). It is used only where it is the torch formula up to float summation order: input and
weight both bf16 or both float32, CPU, no autograd. Anything else (training, other devices, mixed dtypes) gets
``None`` and must use the PyTorch formula. ``SEER_RMS_KERNEL=0`` disables it; a build failure disables it too
(logged once).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from seer.models import attn_kernel

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("rms_norm.c")
_lock = threading.Lock()
_fns: dict[torch.dtype, Callable[..., int]] | None = None
_tried = False
_SYMBOLS = {torch.bfloat16: "seer_rms_norm_bf16", torch.float32: "seer_rms_norm_f32"}


def _kernels() -> dict[torch.dtype, Callable[..., int]] | None:
    global _fns, _tried
    if _tried:
        return _fns
    with _lock:
        if not _tried:
            if os.environ.get("SEER_RMS_KERNEL", "1") != "0":
                try:
                    lib = attn_kernel.build_library(_SOURCE)
                    p, i64 = ctypes.c_void_p, ctypes.c_int64
                    fns = {}
                    for dtype, name in _SYMBOLS.items():
                        fn = getattr(lib, name)
                        fn.argtypes = [p, p, p, i64, i64, ctypes.c_float, ctypes.c_int]
                        fn.restype = ctypes.c_int
                        fns[dtype] = fn
                    _fns = fns
                except Exception as e:  # noqa: BLE001 - any failure means: use the PyTorch formula
                    log.warning("RMSNorm C kernel unavailable, using the PyTorch formula: %s", e)
            _tried = True
    return _fns


def kernel_available() -> bool:
    """True when the compiled kernels are loaded (builds them on the first call)."""
    return _kernels() is not None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The PyTorch formula of ``layers.RMSNorm`` (normalise in float32, back to x's dtype, times the weight)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``rms_norm_reference(x, weight, eps)`` via the C kernel, or ``None`` when it does not apply here."""
    if (x.dtype not in _SYMBOLS or weight.dtype != x.dtype or x.device.type != "cpu"
            or weight.device.type != "cpu" or x.shape[-1] != weight.numel() or x.numel() == 0
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return None
    fns = _kernels()
    if fns is None:
        return None
    x = x.contiguous()
    w = weight.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    if fns[x.dtype](x.data_ptr(), w.data_ptr(), out.data_ptr(), x.numel() // dim, dim, float(eps),
                    torch.get_num_threads()):
        raise MemoryError("RMSNorm kernel could not allocate its weight buffer")
    return out
