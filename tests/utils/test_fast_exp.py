"""fast_exp agrees with exp over the range sampling feeds it: shifted logits and log-probabilities (x <= 0)."""

import torch

from seer.utils.fast_exp import fast_exp


def test_matches_exp_where_sampling_uses_it():
    x = torch.cat([torch.linspace(-200.0, 0.0, 100_001), torch.tensor([float("-inf")])])
    ref = torch.exp(x.double())
    got = fast_exp(x).double()
    assert got[-1] == 0.0 and got[-2] == 1.0                 # -inf -> 0, 0 -> 1 exactly
    normal = ref > torch.finfo(torch.float32).tiny
    rel = ((got - ref).abs() / ref)[normal]
    assert rel.max() < 2e-5                                 # the rounding of x * log2(e)
    assert (got[~normal] - ref[~normal]).abs().max() < torch.finfo(torch.float32).tiny


def test_leaves_its_input_alone_and_keeps_dtype():
    x = torch.randn(4, 7) - 3
    before = x.clone()
    out = fast_exp(x)
    assert torch.equal(x, before) and out.dtype == x.dtype and out.shape == x.shape
    assert torch.allclose(out, x.exp(), rtol=1e-5, atol=0)
