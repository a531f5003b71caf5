"""Fixtures shared by the verl integration tests: one torch thread, a tiny Qwen2 model, a coordinator per module
(module scope: tests that push weights must not leak their version into another module)."""

import pytest

from tests.conftest import one_torch_thread
from tests.integrations.helpers import coordinator

_one_thread = one_torch_thread()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen2", 5)


@pytest.fixture(scope="module")
def coord(tiny):
    with coordinator(tiny) as c:
        yield c
