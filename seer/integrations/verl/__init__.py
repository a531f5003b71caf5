"""Seer as verl's rollout backend (see ``docs/verl.md``).

verl extension points filled:

- ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=seer.integrations.verl.SeerAgentLoopManager``: the
  trainer's per-step ``generate_sequences(batch)`` goes to Seer as one batch of groups (``manager``);
- ``actor_rollout_ref.rollout.name=seer``: verl's training workers build ``SeerServerAdapter`` as their
  ``BaseRollout`` and push every weight update through it into Seer (``adapter``), and verl 0.9's
  ``LLMServerManager`` builds ``SeerReplica`` records of where Seer runs (``replica``).

``register()`` adds ``seer`` to verl's rollout registries. It runs on import when verl is already imported,
so setting ``VERL_USE_EXTERNAL_MODULES=seer.integrations.verl`` (verl imports the listed modules on ``import
verl``, in every process) registers Seer everywhere; the manager calls it too. Nothing here imports verl until a
verl object is built: ``batching``, ``client`` and ``rollout.SeerVerlRollout.generate_arrays`` work without it.
"""

from __future__ import annotations

import importlib
import logging
import sys

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "seer"
ADAPTER_FQN = "seer.integrations.verl.adapter.SeerServerAdapter"
MANAGER_FQN = "seer.integrations.verl.SeerAgentLoopManager"

_LAZY = {
    "SeerAgentLoopManager": "seer.integrations.verl.manager",
    "SeerVerlRollout": "seer.integrations.verl.rollout",
    "SeerServerAdapter": "seer.integrations.verl.adapter",
    "SeerReplica": "seer.integrations.verl.replica",
    "InProcessClient": "seer.integrations.verl.client",
    "HTTPClient": "seer.integrations.verl.client",
    "RayActorClient": "seer.integrations.verl.client",
    "make_client": "seer.integrations.verl.client",
    "group_rows": "seer.integrations.verl.batching",
    "pack_rows": "seer.integrations.verl.batching",
    "sampling_params": "seer.integrations.verl.batching",
}

__all__ = ["register", "ROLLOUT_NAME", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _load_replica():
    from seer.integrations.verl.replica import SeerReplica

    return SeerReplica


def register() -> bool:
    """Add ``seer`` to verl's rollout registries; False (and nothing done) when verl is not importable."""
    try:
        from verl.workers.rollout import base
    except Exception as e:  # noqa: BLE001 - verl missing, or missing a GPU-only dependency
        logger.debug("verl not importable, Seer not registered: %s", e)
        return False
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN
    try:
        from verl.workers.rollout.replica import RolloutReplicaRegistry
    except Exception as e:  # noqa: BLE001 - replica.py imports ray; the manager path does not need it
        logger.debug("verl rollout replica registry not importable: %s", e)
    else:
        RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    return True


if "verl" in sys.modules:  # imported by verl itself (VERL_USE_EXTERNAL_MODULES) or after it: register now
    register()
