"""The Ray transport's start-up: an actor that never answers gives an error naming the likely causes."""

from types import SimpleNamespace
from typing import Any

import pytest

from seer.rollout.backends.ray_cluster import RayTransport
from seer.rollout.config import RolloutConfig
from seer.rollout.instances.host import HostSpec


class _Timeout(Exception):
    pass


def _starved_ray() -> SimpleNamespace:
    """A stand-in for the ray module whose actors never answer."""
    handle = SimpleNamespace(handle=SimpleNamespace(remote=lambda *args: "ref"))
    actor_cls = SimpleNamespace(remote=lambda spec: handle)
    killed: list[Any] = []

    def get(ref: object, timeout: float | None = None) -> None:
        raise _Timeout()

    return SimpleNamespace(remote=lambda **kw: (lambda cls: actor_cls), get=get, kill=killed.append, killed=killed,
                           exceptions=SimpleNamespace(GetTimeoutError=_Timeout))


def test_an_actor_that_never_starts_is_a_clear_error() -> None:
    ray = _starved_ray()
    link = RayTransport(ray, 0.5)
    engine = RolloutConfig(instances=1).instance_engine("m", default_threads=1)
    with pytest.raises(RuntimeError, match=r"instance 0 did not start within 600 s.*0.5 free CPUs.*lower priority"):
        link.spawn([HostSpec(0, engine, None, None, None)])
    assert ray.killed and not link.actors  # what did start is stopped again
