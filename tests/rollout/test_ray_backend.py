"""The Ray backend's start-up: an actor that never answers gives an error naming the likely causes."""

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from seer.rollout.backends.ray_cluster import RayBackend  # noqa: E402
from seer.rollout.coordinator import RolloutConfig  # noqa: E402


class _Timeout(Exception):
    pass


def _starved_ray() -> SimpleNamespace:
    """A stand-in for the ray module whose actors never answer."""
    handle = SimpleNamespace(snapshot=SimpleNamespace(remote=lambda: "ref"))
    actor_cls = SimpleNamespace(remote=lambda spec: handle)

    def get(ref, timeout=None):
        raise _Timeout()

    return SimpleNamespace(remote=lambda **kw: (lambda cls: actor_cls), get=get, kill=lambda a: None,
                           exceptions=SimpleNamespace(GetTimeoutError=_Timeout))


def test_an_actor_that_never_starts_is_a_clear_error() -> None:
    backend = RayBackend.__new__(RayBackend)
    backend.ray, backend.model, backend.config = _starved_ray(), "m", RolloutConfig(instances=1)
    backend.engine = RolloutConfig(instances=1).instance_engine("m", default_threads=1)
    backend.cpus_per_actor, backend.proxies, backend._key = 0.5, {}, "unset"
    backend.handoff = {}
    with pytest.raises(RuntimeError, match=r"instance 0 did not start within 600 s.*0.5 free CPUs.*lower priority"):
        backend._spawn(SimpleNamespace(speculative=False))


def _updating(versions) -> tuple[RayBackend, list]:
    """A backend over fake actors whose weight updates return ``versions`` in turn."""
    backend = RayBackend.__new__(RayBackend)
    calls: list[int] = []
    it = iter(versions)
    actor = SimpleNamespace(update_weights=SimpleNamespace(remote=lambda source, version: calls.append(1) or next(it)),
                            snapshot=SimpleNamespace(remote=lambda: {}))
    backend.ray = SimpleNamespace(get=lambda refs, timeout=None: list(refs))
    backend.proxies = {i: SimpleNamespace(actor=actor, snap={"weight_version": 0}) for i in range(len(versions))}
    backend._lost, backend._weights, backend.after_weights_sent = False, None, None
    return backend, calls


def test_update_weights_records_the_version_of_every_actor() -> None:
    """Each proxy's snapshot gets its own actor's new version, so the coordinator sees them agree."""
    backend, calls = _updating([3, 3, 3])
    assert backend.update_weights("ckpt") == 3 and len(calls) == 3
    assert backend.weight_versions() == [3, 3, 3]
    assert backend._weights == ("ckpt", 3)  # what restarted actors will be given


def test_actors_that_disagree_after_an_update_are_an_error() -> None:
    backend, _ = _updating([3, 4])
    with pytest.raises(RuntimeError, match=r"different weight versions: \[3, 4\]"):
        backend.update_weights("ckpt")
