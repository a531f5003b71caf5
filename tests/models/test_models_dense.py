"""forward_dense against transformers: padding on either side, llama3 RoPE scaling, and autograd."""

from __future__ import annotations

import pytest
import torch

from tests.models.helpers import FAMILIES, make_tiny_hf_model

TOL = 1e-4


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_transformers(tiny_models, family, side):
    model, _, hf = tiny_models[family]
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 128, (n,), generator=gen).tolist() for n in (11, 7, 3)]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = torch.tensor(r), 1
    with torch.no_grad():
        logp = model.compute_logits(model.forward_dense(ids, mask)).log_softmax(-1)
    assert torch.isfinite(logp).all()
    for i, r in enumerate(rows):
        got = logp[i][mask[i].bool()]
        assert (got - _hf_logprobs(hf, r)).abs().max() < TOL


def test_forward_dense_is_differentiable(tiny_models):
    model, _, _ = tiny_models["qwen3"]
    ids = torch.randint(5, 128, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    try:
        logp = model.compute_logits(model.forward_dense(ids, mask)).log_softmax(-1)
        loss = -(logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]).sum()
        loss.backward()
        grads = [p.grad for p in params]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert model.model.layers[0].self_attn.qkv_proj.weight.grad.abs().sum() > 0
    finally:
        for p in params:
            p.requires_grad_(False)
            p.grad = None


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    from seer.models.loader import load_model

    hf = make_tiny_hf_model("llama", seed=3)
    hf.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 16}
    hf.save_pretrained(str(tmp_path))
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    model, cfg = load_model(tmp_path, dtype=torch.float32)
    assert cfg.rope.rope_type == "llama3"
    ids = torch.randint(5, 128, (1, 40))
    with torch.no_grad():
        ours = model.compute_logits(model.forward_dense(ids)).log_softmax(-1)
    assert (ours[0] - _hf_logprobs(hf, ids[0].tolist())).abs().max() < TOL
