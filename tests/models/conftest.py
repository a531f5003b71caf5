"""Session fixtures for the model tests: one tiny checkpoint per family, loaded once by us and by transformers."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import one_torch_thread
from tests.models.helpers import FAMILIES

_one_thread = one_torch_thread()


@pytest.fixture(scope="session")
def tiny_dirs(tiny_model_dir):
    return {family: tiny_model_dir(family, 0) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    """family -> (our fp32 model, its ModelConfig, the transformers fp32 model)."""
    import transformers

    from seer.models.loader import load_model

    out = {}
    for family, path in tiny_dirs.items():
        model, cfg = load_model(path, dtype=torch.float32)
        hf = getattr(transformers, cfg.architecture).from_pretrained(path, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None  # generate exactly max_new_tokens, like our greedy loop
        out[family] = (model, cfg, hf)
    return out
