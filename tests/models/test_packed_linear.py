"""Pre-packed linears: bf16 bit-identical, fp32 equal up to summation order, re-packed after weight updates."""

import pytest
import torch
from torch import nn

from seer.models.packed_linear import PackedLinear, packing_supported, prepack_linears

needs_bf16 = pytest.mark.skipif(not packing_supported(torch.bfloat16), reason="oneDNN bf16 packing unavailable")
needs_fp32 = pytest.mark.skipif(not packing_supported(torch.float32), reason="oneDNN fp32 packing unavailable")


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96, bias=True), nn.Linear(96, 32, bias=False)).to(dtype).eval()


@needs_bf16
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_bf16_output_is_identical(rows: int) -> None:
    model = _model(torch.bfloat16)
    x = torch.randn(2, rows, 64).to(torch.bfloat16)
    with torch.inference_mode():
        ref = model(x)
        assert prepack_linears(model) == 2
        assert all(isinstance(m, PackedLinear) for m in model)
        assert torch.equal(model(x), ref)


@needs_fp32
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_fp32_output_matches(rows: int) -> None:
    model = _model(torch.float32)
    x = torch.randn(2, rows, 64)
    with torch.inference_mode():
        ref = model(x)
        assert prepack_linears(model) == 2
        assert all(isinstance(m, PackedLinear) and m._packed is not None for m in model)
        out = model(x)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_bf16),
                                   pytest.param(torch.float32, marks=needs_fp32)])
def test_weight_update_repacks(dtype: torch.dtype) -> None:
    model = _model(dtype)
    prepack_linears(model)
    x = torch.randn(3, 64).to(dtype)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # an in-place update, as load_weights does with copy_
        expect = nn.functional.linear(nn.functional.linear(x, model[0].weight, model[0].bias), model[1].weight)
        torch.testing.assert_close(model(x), expect, rtol=1e-5, atol=1e-6)
        model[1].weight.zero_()
        assert torch.equal(model(x), torch.zeros(3, 32, dtype=dtype))  # a stale pack would give non-zeros


@needs_fp32
def test_training_uses_plain_linear_and_env_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(torch.float32)
    prepack_linears(model)
    model.requires_grad_(True)
    y = model(torch.randn(2, 64)).sum()
    y.backward()  # autograd goes through F.linear, so gradients exist
    assert model[0].weight.grad is not None
    assert "weight" in dict(model[0].named_parameters())  # names unchanged for the loader
    assert prepack_linears(_model(torch.float16)) == 0  # dtypes not packed stay plain
    monkeypatch.setenv("SEER_PREPACK", "0")
    plain = _model(torch.float32)
    assert prepack_linears(plain) == 0 and type(plain[0]) is nn.Linear
