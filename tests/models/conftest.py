"""Session fixtures for the model tests: one tiny checkpoint per family, loaded once by us and by transformers."""

from __future__ import annotations

import pytest
import torch

from tests.models.helpers import FAMILIES, make_tiny_model_dir


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core box every multi-threaded op can wait a whole
    scheduler time slice (~20 ms) for its second thread; one thread keeps these tests fast and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: make_tiny_model_dir(root, family) for family in FAMILIES}


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
