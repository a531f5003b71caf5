"""Shared RL test fixtures.

- One tiny random-weight model (and char-level tokenizer) for every RL test: building it imports transformers,
  which costs seconds, so it is made once per session.
- One torch thread while the RL tests run: the models are tiny, so OpenMP threads only add synchronisation, and
  on a busy shared machine their spin-waiting made these tests ~5x slower. Results do not depend on it.
"""

import pytest
import torch

from tests.models.helpers import make_tiny_model_dir


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("rl-model"), family="qwen2", seed=0)
