"""Shared RL test fixtures.

- One tiny random-weight model (and char-level tokenizer) for every RL test: building it imports transformers,
  which costs seconds, so it is made once per session.
- One torch thread while the RL tests run: the models are tiny, so OpenMP threads only add synchronisation, and
  on a busy shared machine their spin-waiting made these tests ~5x slower. Results do not depend on it.
"""

import pytest

from tests.conftest import one_torch_thread

_one_thread = one_torch_thread("package")


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen2", 0)
