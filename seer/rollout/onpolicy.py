"""The on-policy report of a rollout: what a trainer needs to trust that every sample is the current policy's.

Why: a rollout system is usable for on-policy RL only if its samples are exactly what plain sampling from the
current weights would give, and the ways to break that are silent. KV parked in the pool before a weight update
and imported after it would condition new tokens on the old weights' keys and values; a drafting failure (a
broken draft source, drafts fed from the wrong stream) shows as lower acceptance, never as an error. So each
rollout reports, beside its metrics: the weight version of its responses and of every instance, the KV it
imported from the pool by the version the pool was filled under, drafts proposed and accepted per source, and
warnings when the pool's version differs from the rollout's or the acceptance rate falls far below the running
mean of earlier rollouts (a sign that drafting broke, e.g. after a weight sync). Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class OnPolicyMonitor:
    """Builds each rollout's on-policy report and remembers the acceptance of earlier rollouts.

    ``drop_ratio``: warn when a rollout's acceptance rate is below this share of the running mean. ``min_drafted``:
    rollouts that drafted fewer tokens are too small to judge and do not enter the mean. ``min_history``: earlier
    rollouts needed before a drop is judged."""

    drop_ratio: float = 0.5
    min_drafted: int = 200
    min_history: int = 2
    accept_rates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 < self.drop_ratio < 1.0 or self.min_drafted < 1 or self.min_history < 1:
            raise ValueError("drop_ratio must be in (0, 1), min_drafted and min_history >= 1")

    @property
    def running_accept_rate(self) -> float | None:
        """Mean acceptance rate of the earlier rollouts that drafted enough to count; None before any."""
        return sum(self.accept_rates) / len(self.accept_rates) if self.accept_rates else None

    def report(self, version: int, instance_versions: Sequence[int], pool_version: int, responses: int,
               kv_sources: Mapping[str, int], spec: Mapping[str, Any] | None) -> dict[str, Any]:
        """The report of one finished rollout (and its warnings, also logged); updates the running mean."""
        warnings: list[str] = []
        if pool_version != version:
            warnings.append(f"the KV pool was filled under weight version {pool_version}, the rollout ran at "
                            f"version {version}")
        if any(v != version for v in instance_versions):
            warnings.append(f"instances report weight versions {sorted(set(instance_versions))}, the rollout's "
                            f"responses version {version}")
        out: dict[str, Any] = {
            "weight_version": version,
            "responses_by_version": {str(version): responses},
            "instance_versions": list(instance_versions),
            "kv_imports_by_version": {str(pool_version): int(kv_sources.get("pool", 0))},
        }
        if spec is not None:
            out.update(self._drafting(spec, warnings))
        out["warnings"] = warnings
        for w in warnings:
            log.warning("on-policy check: %s", w)
        return out

    def _drafting(self, spec: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
        drafted, rate = int(spec.get("drafted", 0)), float(spec.get("accept_rate", 0.0))
        mean = self.running_accept_rate
        if (drafted >= self.min_drafted and mean is not None and len(self.accept_rates) >= self.min_history
                and rate < self.drop_ratio * mean):
            warnings.append(f"draft acceptance {rate:.3f} is below {self.drop_ratio:g} x the running mean "
                            f"{mean:.3f} of {len(self.accept_rates)} earlier rollouts: check the draft sources "
                            f"and the last weight sync")
        if drafted >= self.min_drafted:
            self.accept_rates.append(rate)
        return {"drafts_by_source": dict(spec.get("by_source") or {}), "accept_rate": rate,
                "running_accept_rate": mean}

    def check_integrity(self) -> None:
        assert all(0.0 <= r <= 1.0 for r in self.accept_rates), "acceptance rates must lie in [0, 1]"
