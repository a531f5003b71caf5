"""Synchronous on-policy RL (GRPO) on Seer rollouts: rollout -> reward -> advantage -> update -> weight sync.

Entry points: ``load_config`` (YAML + overrides -> ``TrainConfig``) and ``Trainer(config).run()``; the CLI is
``seer train``. Imported lazily so that ``seer.rl.config`` stays cheap to import.
"""

from __future__ import annotations

__all__ = ["TrainConfig", "load_config", "Trainer", "StaleRolloutError"]


def __getattr__(name: str):
    if name in ("TrainConfig", "load_config"):
        from seer.rl import config
        return getattr(config, name)
    if name in ("Trainer", "StaleRolloutError"):
        from seer.rl import trainer
        return getattr(trainer, name)
    raise AttributeError(name)
