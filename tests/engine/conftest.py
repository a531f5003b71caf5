import pytest

from tests.models.helpers import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny_models")
    return {fam: make_tiny_model_dir(root / fam, family=fam, seed=7) for fam in ("llama", "qwen2", "qwen3")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs):
    return tiny_dirs["llama"]
