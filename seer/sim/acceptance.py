"""How many draft tokens a request accepts when only response lengths are known: a fitted acceptance model.

Why: grouped speculative decoding drafts from siblings, so acceptance grows with the number of sibling references
``n`` already ahead of a request (the paper reports a mean acceptance length of 1.70 / 2.04 / 2.32 / 2.53
at n = 0 / 1 / 5 / 15). With token-id traces the simulator replays real sibling streams through the real suffix
trees (``replay_speculator.py``); with length-only traces it needs a model, and the simplest one that keeps the
two effects that matter (more references, better drafts; longer drafts, diminishing returns) is a per-token
acceptance probability ``alpha(n)``: a draft of ``g`` tokens yields ``(1 - alpha^(g+1)) / (1 - alpha)`` tokens per
verification on average, bonus included. ``alpha(n)`` is solved from measured mean acceptance lengths at the
draft length they were measured with and interpolated in ``log2(1 + n)``.

Two fits exist: ``paper`` (the paper's Table 2, linear drafts; the measurement of the paper's own workloads) and
``math_cot`` (our suffix trees replayed on ``math_cot_groups.jsonl`` by ``seer.spec.replay``, modes n0/n1/n3/n7).
``scaled`` answers "what if my drafts accept less (or more)": it scales the tokens a verification gains beyond the
bonus token, tau - 1, at every reference count. The paper gives one table for all its workloads, so how a
prediction moves with it is worth knowing (``python -m seer.sim.reproduce --sensitivity``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from seer.data.traces import TraceGroup

PAPER_TABLE2_LINEAR: dict[int, float] = {0: 1.70, 1: 2.04, 5: 2.32, 15: 2.53}
PAPER_GAMMA = 8  # assumption: the paper's table measured at gamma_max 8 (our drafter's default)


def expected_accept_len(alpha: float, gamma: int) -> float:
    """Mean tokens per verification step (accepted drafts + the bonus token) with ``gamma`` drafts."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def alpha_from_tau(tau: float, gamma: int) -> float:
    """Per-token acceptance that gives mean acceptance length ``tau`` at ``gamma`` drafts (bisection)."""
    if not 1.0 <= tau <= gamma + 1:
        raise ValueError(f"mean acceptance length {tau} impossible with gamma {gamma}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_accept_len(mid, gamma) < tau:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class AcceptanceModel:
    name: str
    refs: tuple[int, ...]
    alphas: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.refs or len(self.refs) != len(self.alphas) or list(self.refs) != sorted(set(self.refs)):
            raise ValueError("acceptance model needs ascending distinct refs, one alpha each")
        if any(not 0 <= a < 1 for a in self.alphas):
            raise ValueError("acceptance probabilities must be in [0, 1)")

    @classmethod
    def from_tau(cls, name: str, table: Mapping[int, float], gamma: int, source: str = "") -> "AcceptanceModel":
        refs = tuple(sorted(table))
        return cls(name, refs, tuple(alpha_from_tau(table[n], gamma) for n in refs), source)

    def alpha(self, n: int) -> float:
        """Per-token acceptance with ``n`` sibling references, interpolated in log2(1 + n), clamped."""
        x = math.log2(1 + max(n, 0))
        xs = [math.log2(1 + r) for r in self.refs]
        if x <= xs[0]:
            return self.alphas[0]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return self.alphas[i - 1] + t * (self.alphas[i] - self.alphas[i - 1])
        return self.alphas[-1]

    def scaled(self, factor: float, gamma: int = PAPER_GAMMA) -> "AcceptanceModel":
        """The model whose mean acceptance length at ``gamma`` drafts is 1 + factor * (tau - 1) at every ref."""
        if factor <= 0:
            raise ValueError(f"acceptance scale must be > 0, got {factor}")
        if factor == 1:
            return self
        table = {n: 1.0 + factor * (expected_accept_len(a, gamma) - 1.0) for n, a in zip(self.refs, self.alphas)}
        if max(table.values()) >= gamma + 1:
            raise ValueError(f"acceptance scale {factor} asks for a mean acceptance length of "
                             f"{max(table.values()):.2f}, above the {gamma + 1} possible with {gamma} drafts")
        return AcceptanceModel.from_tau(f"{self.name} x{factor:g}", table, gamma,
                                        f"{self.source}; tau - 1 scaled by {factor:g}")

    def to_dict(self) -> dict:
        return {"name": self.name, "refs": list(self.refs), "alphas": list(self.alphas), "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping) -> "AcceptanceModel":
        return cls(str(d["name"]), tuple(int(r) for r in d["refs"]), tuple(float(a) for a in d["alphas"]),
                   str(d.get("source", "")))


def paper_model() -> AcceptanceModel:
    return AcceptanceModel.from_tau("paper", PAPER_TABLE2_LINEAR, PAPER_GAMMA,
                                    "Seer paper Table 2, linear drafts (assumed gamma_max 8)")


def fit_from_replay(groups: Sequence[TraceGroup], ns: Sequence[int] = (0, 1, 3, 7), gamma: int = 8,
                    name: str = "math_cot") -> AcceptanceModel:
    """Replay a token-id trace through the real suffix trees and drafter; fit alpha(n) to the measured tau."""
    from seer.spec.replay import ReplayConfig, replay_trace

    size = min(len(g.responses) for g in groups)
    ns = [n for n in ns if n < size]
    cfg = ReplayConfig(gamma_max=gamma, modes=tuple(f"n{n}" for n in ns), drafters=("linear",))
    taus = replay_trace(groups, cfg)["tau"]
    table = {n: max(1.0, taus[f"n{n}"]["linear"]) for n in ns}
    return AcceptanceModel.from_tau(name, table, gamma, f"seer.spec.replay over {len(groups)} groups, linear, "
                                                         f"gamma {gamma}: tau {table}")
