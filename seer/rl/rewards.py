"""Reward registry and the runner that never lets a reward crash a training run.

A long RL run must not die on iteration 900 because one response made a math parser raise or hang. The runner
therefore scores every response under a guard: an exception, a non-finite value or a call that exceeds
``timeout_s`` scores 0 and logs a warning (the first few per batch verbatim, then a count). Timeouts run the
scorer in a daemon thread and stop waiting at the deadline; Python cannot kill a thread, so a truly stuck call
keeps its thread until it returns, but the run goes on. Counts of errors and timeouts go into the metrics.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seer.rl.scorers import CustomScorer, MathVerifyScorer, ReasoningGymScorer, RewardInput, Scorer, TokenFractionScorer

if TYPE_CHECKING:
    from seer.rl.config import RewardConfig

log = logging.getLogger("seer.rl.rewards")
_MAX_LOGGED = 5


def _token_fraction(cfg: "RewardConfig", tokenizer: Any) -> Scorer:
    kwargs = dict(cfg.kwargs)
    if "token_id" in kwargs:
        return TokenFractionScorer(int(kwargs["token_id"]))
    token = kwargs.get("token")
    if not isinstance(token, str):
        raise ValueError("reward token_fraction needs reward.kwargs.token (a string) or reward.kwargs.token_id")
    token_id = tokenizer.token_to_id(token) if tokenizer is not None else None
    if token_id is None:
        raise ValueError(f"reward token_fraction: {token!r} is not a single token of this tokenizer")
    return TokenFractionScorer(token_id)


REWARDS: dict[str, Callable[["RewardConfig", Any], Scorer]] = {
    "math_verify": lambda cfg, tok: MathVerifyScorer(**cfg.kwargs),
    "reasoning_gym": lambda cfg, tok: ReasoningGymScorer(**cfg.kwargs),
    "token_fraction": _token_fraction,
    "custom": lambda cfg, tok: CustomScorer(cfg.function or "", **cfg.kwargs),
}


def build_scorer(cfg: "RewardConfig", tokenizer: Any = None) -> Scorer:
    """The scorer a ``RewardConfig`` names (unknown kwargs raise ``ValueError`` naming them)."""
    if cfg.name not in REWARDS:
        raise ValueError(f"unknown reward {cfg.name!r}; choose one of {', '.join(REWARDS)}")
    try:
        return REWARDS[cfg.name](cfg, tokenizer)
    except TypeError as err:
        raise ValueError(f"reward {cfg.name}: bad reward.kwargs {dict(cfg.kwargs)} ({err})") from None


@dataclass(frozen=True)
class RewardBatch:
    scores: list[float]
    errors: int
    timeouts: int


class RewardRunner:
    def __init__(self, scorer: Scorer, timeout_s: float | None = None, name: str = "reward") -> None:
        self.scorer = scorer
        self.timeout_s = timeout_s
        self.name = name

    def score(self, samples: Sequence[RewardInput]) -> RewardBatch:
        scores: list[float] = []
        errors = timeouts = 0
        for i, sample in enumerate(samples):
            value, problem = self._score_one(sample)
            if problem is not None:
                timed_out = problem.startswith("timed out")
                timeouts += timed_out
                errors += not timed_out
                if errors + timeouts <= _MAX_LOGGED:
                    log.warning("%s: response %d scores 0: %s", self.name, i, problem)
            scores.append(value)
        if errors + timeouts > _MAX_LOGGED:
            log.warning("%s: %d errors and %d timeouts in %d responses scored 0", self.name, errors, timeouts,
                        len(samples))
        return RewardBatch(scores, errors, timeouts)

    def _score_one(self, sample: RewardInput) -> tuple[float, str | None]:
        """(score, None) or (0.0, what went wrong)."""
        if self.timeout_s is None:
            outcome = _call(self.scorer, sample)
        else:
            box: list[tuple[Any, str | None]] = []
            worker = threading.Thread(target=lambda: box.append(_call(self.scorer, sample)), daemon=True,
                                      name="seer-reward")
            worker.start()
            worker.join(self.timeout_s)
            if not box:
                return 0.0, f"timed out after {self.timeout_s:g}s"
            outcome = box[0]
        value, problem = outcome
        if problem is not None:
            return 0.0, problem
        try:
            score = float(value)
        except (TypeError, ValueError):
            return 0.0, f"returned {value!r}, not a number"
        if not math.isfinite(score):
            return 0.0, f"returned {score}"
        return score, None


def _call(scorer: Scorer, sample: RewardInput) -> tuple[Any, str | None]:
    try:
        return scorer(sample), None
    except Exception as err:  # noqa: BLE001  (any reward bug must score 0, not end the run)
        return None, f"{type(err).__name__}: {err}"
