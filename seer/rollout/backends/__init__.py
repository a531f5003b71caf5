"""Where a rollout's instances run: in this process (virtual time), local processes, or Ray actors.

``Backend`` (``base.py``) holds the rollout loop all three share. Processes and Ray actors run the same instance
host (``instances/host.py``) under one wall-clock drive loop (``wall_clock.py``) and one spawn and weight
lifecycle (``remote.py``); ``local.py`` and ``ray_cluster.py`` say only how commands reach their hosts.
"""

from __future__ import annotations

from typing import Any

from seer.rollout.backends.base import Backend
from seer.rollout.config import BACKENDS, RolloutConfig

__all__ = ["BACKENDS", "Backend", "make_backend"]


def make_backend(name: str, model: str, config: RolloutConfig, pool: Any) -> Backend:
    """The backend ``name`` for ``model`` under a ``RolloutConfig``; ``pool``: the coordinator's KV pool."""
    if name == "inprocess":
        from seer.rollout.backends.inprocess import InProcessBackend
        return InProcessBackend(model, config, pool)
    if name == "local":
        from seer.rollout.backends.local import ProcessBackend
        return ProcessBackend(model, config, pool)
    if name == "ray":
        from seer.rollout.backends.ray_cluster import RayBackend
        return RayBackend(model, config, pool)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
