"""Fixtures of the HTTP server tests: one tiny random-weight model with a character-level tokenizer and chat
template (no downloads), a coordinator over two in-process instances, and servers on loopback ports.

Everything runs on CPU in float32 (so greedy results do not depend on batch composition) with one torch
thread: the model is tiny, and spare threads only spin on a shared 2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator
from tests.conftest import TinyModelDir, one_torch_thread

MODEL_NAME = "tiny"


_one_thread = one_torch_thread("package")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: TinyModelDir) -> Path:
    return tiny_model_dir("qwen2", 3, max_position_embeddings=1024)


def make_coordinator(model: Path, engine: dict | None = None, **overrides: object) -> RolloutCoordinator:
    """``engine``: fields of the instances' engine to change; ``overrides``: fields of the rollout."""
    base = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=1024, num_threads=1)
    cfg: dict = dict(policy="context", instances=2, chunk_tokens=8, spec=SpecConfig(adaptive=False))
    cfg.update(overrides)
    return RolloutCoordinator(model, RolloutConfig(engine=replace(base, **(engine or {})), **cfg))


@pytest.fixture(scope="package")
def coordinator(tiny_model: Path) -> Iterator[RolloutCoordinator]:
    with make_coordinator(tiny_model) as c:
        yield c


@pytest.fixture(scope="package")
def reference_llm(tiny_model: Path):
    """The in-process API on its own engine: what greedy results over HTTP must equal."""
    from seer import LLM

    return LLM(tiny_model, dtype="float32", block_size=4, num_kv_blocks=1024, num_threads=1)


def start_server(coordinator: RolloutCoordinator, **config: object):
    from seer.server.app import create_app
    from seer.server.config import ServerConfig
    from seer.server.serving import ServerThread

    cfg: dict = dict(model_name=MODEL_NAME, chunk_tokens=8)
    cfg.update(config)
    app = create_app(coordinator, ServerConfig(**cfg))
    return ServerThread(app, app.state.seer.batcher).start()


@pytest.fixture(scope="package")
def server(coordinator: RolloutCoordinator):
    """A shared server; tests that change or stop it make their own."""
    handle = start_server(coordinator)
    yield handle
    handle.stop()


@pytest.fixture()
def state(server):
    return server.server.config.app.state.seer


def check_engines_clean(coordinator: RolloutCoordinator) -> None:
    """No request left in any engine, every KV block free, nothing parked in the pool."""
    for engine in coordinator.backend.engines:
        engine.scheduler.check_integrity()
        assert not engine.scheduler.requests, f"requests left: {list(engine.scheduler.requests)}"
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    coordinator.pool.check_integrity()
    assert coordinator.pool.stats().entries == 0
