"""Fixtures shared by the verl integration tests: one torch thread, a tiny Qwen2 model, a coordinator per module
(module scope: tests that push weights must not leak their version into another module)."""

import pytest
import torch

from tests.integrations.helpers import coordinator
from tests.models.helpers import make_tiny_model_dir


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("verl"), family="qwen2", seed=5)


@pytest.fixture(scope="module")
def coord(tiny):
    with coordinator(tiny) as c:
        yield c
