"""The fused RMSNorm kernels (bf16, float32) equal the PyTorch formula (up to float summation order)."""

from __future__ import annotations

import pytest
import torch

from seer.models import rms_norm
from seer.models.layers import RMSNorm
from seer.models.rms_norm import rms_norm_fused, rms_norm_reference


@pytest.fixture(autouse=True)
def _need_kernel():
    if rms_norm._kernels() is None:
        pytest.skip("RMSNorm C kernel unavailable")


def fused_with_threads(x: torch.Tensor, w: torch.Tensor, threads: int) -> torch.Tensor | None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return rms_norm_fused(x, w, 1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(256, 576), (3, 64), (7, 100), (2, 5, 128), (1, 8)])
def test_equals_torch_formula(shape, threads):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[-1])).bfloat16()
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).bfloat16()
    got = fused_with_threads(x, w, threads)
    ref = rms_norm_reference(x, w, 1e-5)
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == ref.shape
    # summation order may move x * r across a bf16 rounding boundary: at most one bf16 step, rarely
    diff = (got.float() - ref.float()).abs()
    assert (diff <= ref.float().abs() * 2 ** -7 + 1e-30).all()
    assert (got != ref).float().mean() < 0.01


def test_matches_the_layer_module():
    norm = RMSNorm(576, 1e-5).to(torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    x = torch.randn(16, 576).bfloat16()
    with torch.inference_mode():
        ref = norm(x)
        got = rms_norm_fused(x, norm.weight, norm.eps)
    assert (got != ref).float().mean() < 0.01


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(256, 576), (3, 64), (7, 100), (2, 5, 128), (1, 8)])
def test_float32_equals_torch_formula(shape, threads):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[-1])
    w = 1 + 0.3 * torch.randn(shape[-1], generator=gen)
    got = fused_with_threads(x, w, threads)
    ref = rms_norm_reference(x, w, 1e-5)
    assert got is not None and got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.allclose(got, ref, rtol=2e-6, atol=0)  # only the sum of squares is ordered differently


def test_declines_what_it_does_not_cover():
    w = torch.ones(64, dtype=torch.bfloat16)
    assert rms_norm_fused(torch.randn(4, 64), w, 1e-5) is None  # float32 input, bf16 weight
    assert rms_norm_fused(torch.randn(4, 64).bfloat16(), w.float(), 1e-5) is None  # float32 weight
    assert rms_norm_fused(torch.randn(4, 64).half(), w.half(), 1e-5) is None  # float16
    x = torch.randn(4, 64).bfloat16().requires_grad_(True)
    assert rms_norm_fused(x, w, 1e-5) is None  # autograd
    with torch.no_grad():
        assert rms_norm_fused(x, w, 1e-5) is not None
