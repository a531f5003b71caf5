"""Sampling parameters, validated once at submission.

A frozen dataclass in the shape of vLLM's, so RL users can carry their settings over unchanged. Every bad
value raises ``ValueError`` naming the field, before any work is queued: an invalid request must never reach
the scheduler, where it could stall a batch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (or ``n`` sibling requests of a group).

    temperature 0 means greedy. ``logprobs`` are always returned for the sampled tokens: they are the log
    probabilities under the temperature-scaled distribution before top-p/top-k filtering (the distribution
    an RL trainer recomputes), or under the raw distribution when temperature is 0.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an integer >= 1, got {self.n!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _finite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k != -1 and self.top_k < 1):
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or an integer >= 1, got {self.top_k!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"SamplingParams.seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"SamplingParams.max_tokens must be an integer > 0, got {self.max_tokens!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"SamplingParams.stop_token_ids must be non-negative integers, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_seed(self, seed: int | None) -> "SamplingParams":
        return replace(self, seed=seed)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mix_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (ints and strings) through a cryptographic hash. Linear mixes collide: with
    ``seed * a + index * b`` the derivations of groups and of siblings meet (group g's seed equalled sibling g's of
    group 0 at seed 0), so two responses drew the same random numbers. A hash tagged with what it derives does not."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sibling_seed(seed: int | None, index: int) -> int | None:
    """Seed of sibling ``index`` of a group sampled with ``seed`` (sibling 0 keeps the seed itself), so a
    seeded group still gets G different responses, reproducibly."""
    if seed is None or index == 0:
        return seed
    return mix_seed("sibling", seed, index)


def group_seed(base_seed: int | None, step: int, group: int) -> int | None:
    """A distinct, reproducible seed per (step, group) from one run seed; None stays unseeded. Groups must not
    share a seed: sibling seeds derive from (seed, index), so sibling i of every group would draw the same random
    numbers and samples would be correlated across prompts."""
    if base_seed is None:
        return None
    return mix_seed("group", int(base_seed), int(step), int(group))
