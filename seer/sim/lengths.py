"""Response lengths that look like RL rollouts: heavy-tailed, capped at max_tokens, and alike within a group.

Why this model: Seer's premise is that siblings of one prompt have similar lengths; a simulator whose lengths
are independent would hide the effect being measured. So log length is
``mu + b_g + w_gi`` with a group effect ``b_g ~ N(0, icc * sigma^2)`` and a sibling effect
``w_gi ~ N(0, (1 - icc) * sigma^2)``, rounded and capped at ``max_tokens`` (runaway reasoning hits the cap, as in
production). ``icc`` is the intraclass correlation of log length, measured on real traces (``trace_icc``, the
one-way random-effects ANOVA estimator, pooled within strata so that differences between datasets or models do
not pass for group similarity); ``sigma`` (the spread) is a workload unknown fitted to the baseline; ``mu`` is
solved so that the capped sample has exactly the requested mean.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

from seer.data.traces import TraceGroup


def icc_anova(log_lengths: np.ndarray) -> tuple[float, float, float]:
    """(ICC(1), mean square between groups, mean square within) of an (n_groups, G) array."""
    n, k = log_lengths.shape
    if n < 2 or k < 2:
        raise ValueError(f"ICC needs >= 2 groups of >= 2 responses, got {n} x {k}")
    gm = log_lengths.mean(axis=1)
    msb = k * float(((gm - gm.mean()) ** 2).sum()) / (n - 1)
    msw = float(((log_lengths - gm[:, None]) ** 2).sum()) / (n * (k - 1))
    denom = msb + (k - 1) * msw
    return ((msb - msw) / denom if denom > 0 else 0.0), msb, msw


def _log_lengths(groups: Sequence[TraceGroup]) -> np.ndarray:
    return np.log(np.maximum(np.array([[r.length for r in g.responses] for g in groups], dtype=float), 1.0))


def trace_icc(groups: Sequence[TraceGroup], stratum: Callable[[TraceGroup], Hashable] | None = None,
              min_groups: int = 50) -> dict[str, float]:
    """ICC of log length, weighted over strata of at least ``min_groups`` groups (one stratum if ``stratum`` is
    None), the pooled within-group log-sd and the pooled total log-sd."""
    if not groups:
        raise ValueError("no groups to measure")
    by: dict[Hashable, list[TraceGroup]] = defaultdict(list)
    for g in groups:
        by[stratum(g) if stratum else 0].append(g)
    iccs, weights, msws, tvars = [], [], [], []
    for members in by.values():
        if len(members) < (min_groups if stratum else 2):
            continue
        logs = _log_lengths(members)
        icc, _, msw = icc_anova(logs)
        iccs.append(icc)
        weights.append(len(members))
        msws.append(msw)
        tvars.append(float(logs.var()))
    if not weights:
        raise ValueError(f"no stratum has {min_groups} groups")
    w = np.array(weights, dtype=float)
    return {"icc": float(np.dot(iccs, w) / w.sum()), "sigma_within": float(np.sqrt(np.dot(msws, w) / w.sum())),
            "sigma_total": float(np.sqrt(np.dot(tvars, w) / w.sum())), "groups": int(w.sum()),
            "strata": len(weights)}


@dataclass(frozen=True)
class LengthModel:
    mean_tokens: float
    max_tokens: int
    sigma: float = 1.0
    icc: float = 0.74
    min_tokens: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.min_tokens <= self.mean_tokens < self.max_tokens:
            raise ValueError(f"need 0 < min_tokens <= mean_tokens < max_tokens, got {self.min_tokens}, "
                             f"{self.mean_tokens}, {self.max_tokens}")
        if self.sigma < 0 or not 0 <= self.icc <= 1:
            raise ValueError(f"need sigma >= 0 and icc in [0, 1], got {self.sigma}, {self.icc}")

    def _capped(self, mu: float, z: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(np.exp(mu + z)), self.min_tokens, self.max_tokens)

    def sample(self, num_groups: int, group_size: int, seed: int = 0) -> np.ndarray:
        """(num_groups, group_size) integer lengths whose mean is ``mean_tokens`` (to within rounding)."""
        if num_groups < 1 or group_size < 1:
            raise ValueError("num_groups and group_size must be >= 1")
        rng = np.random.default_rng(seed)
        b = rng.standard_normal((num_groups, 1)) * self.sigma * np.sqrt(self.icc)
        w = rng.standard_normal((num_groups, group_size)) * self.sigma * np.sqrt(1.0 - self.icc)
        z = b + w
        lo, hi = np.log(self.min_tokens) - 10 * self.sigma - 1, np.log(self.max_tokens) + 1
        for _ in range(100):  # the capped mean is monotone in mu: bisect
            mid = 0.5 * (lo + hi)
            if self._capped(mid, z).mean() < self.mean_tokens:
                lo = mid
            else:
                hi = mid
        return self._capped(hi, z).astype(np.int64)
