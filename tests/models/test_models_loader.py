"""Loading checkpoints (single file, sharded), strictness, weight sync into a live model, HF export."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from seer.models.loader import hf_state_dict, load_model, load_weights
from tests.models.helpers import make_tiny_hf_model, make_tiny_model_dir


def _logits(model, ids):
    with torch.no_grad():
        return model.compute_logits(model.forward_dense(ids))


def test_sharded_checkpoint_matches_single_file(tmp_path, tiny_dirs):
    hf = make_tiny_hf_model("llama")
    hf.save_pretrained(str(tmp_path), max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded, _ = load_model(tmp_path, dtype=torch.float32)
    single, _ = load_model(tiny_dirs["llama"], dtype=torch.float32)
    ids = torch.randint(5, 128, (1, 9))
    assert torch.equal(_logits(sharded, ids), _logits(single, ids))


def test_tied_embeddings_share_storage(tiny_models):
    model, cfg, _ = tiny_models["qwen2"]
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    untied, _, _ = tiny_models["llama"]
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_bf16_load_and_dtype(tiny_dirs):
    model, _ = load_model(tiny_dirs["qwen3"], dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in model.parameters())
    assert _logits(model, torch.randint(5, 128, (1, 4))).dtype == torch.float32


def test_missing_and_unexpected_tensors(tmp_path, tiny_dirs):
    tensors = load_file(str(tiny_dirs["llama"] / "model.safetensors"))
    for f in ("config.json",):
        (tmp_path / f).write_text((tiny_dirs["llama"] / f).read_text())
    missing = {k: v for k, v in tensors.items() if "layers.1.self_attn.k_proj" not in k}
    save_file(missing, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing.*qkv_proj"):
        load_model(tmp_path, dtype=torch.float32)
    save_file(dict(tensors, **{"model.extra.weight": torch.zeros(2)}), str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.extra.weight"):
        load_model(tmp_path, dtype=torch.float32)
    bad = dict(tensors)
    bad["model.norm.weight"] = torch.zeros(3)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="shape"):
        load_model(tmp_path, dtype=torch.float32)


def test_missing_model_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_model(tmp_path / "does-not-exist")


def test_weight_sync_from_state_dict_and_directory(tmp_path, tiny_dirs):
    model, _ = load_model(tiny_dirs["qwen3"], dtype=torch.float32)
    new_dir = make_tiny_model_dir(tmp_path, "qwen3", seed=7, with_tokenizer=False)
    reference, _ = load_model(new_dir, dtype=torch.float32)
    ids = torch.randint(5, 128, (2, 8))
    assert not torch.allclose(_logits(model, ids), _logits(reference, ids))
    load_weights(model, load_file(str(new_dir / "model.safetensors")))  # HF names
    assert torch.equal(_logits(model, ids), _logits(reference, ids))
    model2, _ = load_model(tiny_dirs["qwen3"], dtype=torch.bfloat16)
    load_weights(model2, new_dir)  # from a directory, converting fp32 -> bf16
    load_weights(model2, hf_state_dict(reference))  # our export, HF names
    load_weights(model2, reference.state_dict())  # our own names
    assert (_logits(model2, ids) - _logits(reference, ids)).abs().max() < 0.5
    with pytest.raises(ValueError, match="missing"):
        load_weights(model, {"model.norm.weight": torch.ones(64)})
    assert load_weights(model, {"model.norm.weight": torch.ones(64)}, strict=False) == ["model.norm.weight"]


def test_hf_export_round_trip(tiny_dirs):
    model, _ = load_model(tiny_dirs["qwen2"], dtype=torch.float32)
    exported = hf_state_dict(model)
    on_disk = load_file(str(tiny_dirs["qwen2"] / "model.safetensors"))
    assert set(exported) == set(on_disk) - {"lm_head.weight"}
    assert all(torch.equal(exported[k], on_disk[k]) for k in exported)
