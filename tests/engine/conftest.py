import pytest


@pytest.fixture(scope="session")
def tiny_dirs(tiny_model_dir) -> dict:
    return {fam: tiny_model_dir(fam, 7) for fam in ("llama", "qwen2", "qwen3")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs):
    return tiny_dirs["llama"]
