"""Fixtures shared across the test packages."""

from __future__ import annotations

import pytest


@pytest.fixture
def local_ray(monkeypatch):  # noqa: ANN001, ANN201
    """A Ray runtime on this machine, loopback only, two CPUs (skipped where Ray is not installed)."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # must precede the import
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def rollout_config(**kw: object):  # noqa: ANN201
    """A ``RolloutConfig`` from flat keywords, the engine's fields going to its ``engine`` section (test shorthand:
    most tests set a few fields of both)."""
    import dataclasses

    from seer.engine.config import EngineConfig
    from seer.rollout.config import RolloutConfig, default_instance_engine

    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    engine = {k: kw.pop(k) for k in list(kw) if k in engine_fields}
    return RolloutConfig(engine=dataclasses.replace(default_instance_engine(), **engine), **kw)  # type: ignore[arg-type]
