"""Pre-packed bf16 linears: identical outputs, re-packed after weight updates, float32 left alone."""

import pytest
import torch
from torch import nn

from seer.models.packed_linear import PackedLinear, packing_supported, prepack_linears

pytestmark = pytest.mark.skipif(not packing_supported(), reason="oneDNN weight packing unavailable")


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96, bias=True), nn.Linear(96, 32, bias=False)).to(dtype).eval()


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_output_is_identical(rows: int) -> None:
    model = _model(torch.bfloat16)
    x = torch.randn(2, rows, 64).to(torch.bfloat16)
    with torch.inference_mode():
        ref = model(x)
        assert prepack_linears(model) == 2
        assert all(isinstance(m, PackedLinear) for m in model)
        assert torch.equal(model(x), ref)


def test_weight_update_repacks() -> None:
    model = _model(torch.bfloat16)
    prepack_linears(model)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # an in-place update, as load_weights does with copy_
        expect = nn.functional.linear(nn.functional.linear(x, model[0].weight, model[0].bias), model[1].weight)
        assert torch.equal(model(x), expect)


def test_float32_and_training_use_plain_linear() -> None:
    model = _model(torch.float32)
    assert prepack_linears(model) == 0 and type(model[0]) is nn.Linear
    bf = _model(torch.bfloat16)
    prepack_linears(bf)
    bf.requires_grad_(True)
    y = bf(torch.randn(2, 64).to(torch.bfloat16)).float().sum()
    y.backward()  # autograd goes through F.linear, so gradients exist
    assert bf[0].weight.grad is not None
    assert "weight" in dict(bf[0].named_parameters())  # names unchanged for the loader
