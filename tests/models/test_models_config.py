"""ModelConfig parsing: the three families, transformers 4 and 5 rope layouts, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from seer.models.config import SUPPORTED_ARCHITECTURES, ModelConfig

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128}


def test_families_parse(tiny_dirs):
    llama = ModelConfig.from_dir(tiny_dirs["llama"])
    qwen2 = ModelConfig.from_dir(tiny_dirs["qwen2"])
    qwen3 = ModelConfig.from_dir(tiny_dirs["qwen3"])
    assert llama.architecture == "LlamaForCausalLM" and not llama.qkv_bias and not llama.qk_norm
    assert llama.head_dim == 16 and llama.eos_token_ids == (2,) and llama.bos_token_id == 1
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_word_embeddings
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.q_size == 128
    assert llama.rope_theta == 10000.0 and llama.torch_dtype == "float32"


def test_transformers4_rope_layout_and_llama3_scaling():
    raw = dict(BASE, architectures=["LlamaForCausalLM"], rope_theta=500000.0, eos_token_id=[7, 9],
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope.theta == 500000.0 and cfg.rope.rope_type == "llama3" and cfg.rope.factor == 8.0
    assert cfg.rope.original_max_position_embeddings == 8192
    assert cfg.eos_token_ids == (7, 9) and cfg.eos_token_id == 7


def test_transformers5_rope_parameters():
    raw = dict(BASE, architectures=["Qwen2ForCausalLM"],
               rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope.theta == 1e6 and cfg.rope.rope_type == "default" and cfg.qkv_bias


def test_kv_bytes_per_token():
    cfg = ModelConfig.from_dict(dict(BASE, architectures=["LlamaForCausalLM"]))
    assert cfg.kv_bytes_per_token(torch.bfloat16) == 2 * 2 * 2 * 16 * 2
    assert cfg.kv_bytes_per_token(torch.float32) == 2 * 2 * 2 * 16 * 4


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        ModelConfig.from_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_dir(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE, architectures=["GPT2LMHeadModel"])))
    with pytest.raises(ValueError) as err:
        ModelConfig.from_dir(tmp_path)
    assert "GPT2LMHeadModel" in str(err.value)
    assert all(a in str(err.value) for a in SUPPORTED_ARCHITECTURES)


def test_unsupported_rope_type_and_sliding_window():
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict(dict(BASE, architectures=["LlamaForCausalLM"], rope_scaling={"type": "yarn"}))
    with pytest.raises(ValueError, match="sliding"):
        ModelConfig.from_dict(dict(BASE, architectures=["Qwen2ForCausalLM"], use_sliding_window=True))
