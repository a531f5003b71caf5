"""Fixtures shared across the test packages: tiny random-weight checkpoints, one torch thread, a local Ray."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.models.helpers import make_tiny_model_dir

TinyModelDir = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> TinyModelDir:
    """``tiny_model_dir(family="qwen2", seed=3, **config)``: a tiny random-weight checkpoint with a character-level
    tokenizer, saved once per session for each (family, seed, config): building one imports transformers and
    writes safetensors, seconds each. Callers must not write into it (tests that change weights do so in memory)."""
    root = tmp_path_factory.mktemp("tiny-models")
    made: dict[tuple, Path] = {}

    def get(family: str = "qwen2", seed: int = 3, **config: object) -> Path:
        key = (family, seed, tuple(sorted(config.items())))
        if key not in made:
            made[key] = make_tiny_model_dir(root / str(len(made)), family, seed=seed, **config)
        return made[key]

    return get


def one_torch_thread(scope: str = "function") -> Callable[[], Iterator[None]]:
    """An autouse fixture (for a package's conftest) that runs its tests on one torch thread: the models are tiny,
    so intra-op threads only add synchronisation, and on a busy 2-core machine each multi-threaded op may wait a
    scheduler time slice for its second thread."""

    @pytest.fixture(scope=scope, autouse=True)  # type: ignore[call-overload]
    def _one_thread() -> Iterator[None]:
        saved = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(saved)

    return _one_thread


@pytest.fixture
def local_ray(monkeypatch):  # noqa: ANN001, ANN201
    """A Ray runtime on this machine, loopback only, two CPUs (skipped where Ray is not installed)."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # must precede the import
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()
