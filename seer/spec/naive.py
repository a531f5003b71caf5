"""The naive baseline: longest suffix match over complete sibling references, copy what followed.

Why keep it: the issue sets our targets relative to this drafter (about 2.8 / 3.9 / 4.8 tokens per step with
1 / 3 / 7 finished siblings on math_cot). It has no frequencies, no prompt, no own past: find the longest suffix
of the context that occurs in a reference with something after it (first such occurrence wins) and draft the
next ``gamma`` tokens of that reference. It works on plain token lists, independent of the suffix index.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seer.spec.draft import EMPTY_DRAFT, Draft

__all__ = ["NaiveDrafter"]

_SEP = -1


class NaiveDrafter:
    """Drafts from a fixed set of complete references."""

    def __init__(self, references: Sequence[Sequence[int]], gamma: int = 8, max_pattern: int = 1 << 30) -> None:
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        flat: list[int] = []
        for ref in references:
            flat.extend(ref)
            flat.append(_SEP)
        self._flat = np.asarray(flat, dtype=np.int64)
        self.gamma = gamma
        self.max_pattern = max_pattern
        # Positions whose next element is a real token (an occurrence there has a continuation).
        has_next = np.zeros(len(flat), dtype=bool)
        if len(flat) > 1:
            has_next[:-1] = self._flat[1:] != _SEP
        self._by_token: dict[int, np.ndarray] = {}
        ends = np.nonzero(has_next & (self._flat != _SEP))[0]
        for tok in np.unique(self._flat[ends]):
            self._by_token[int(tok)] = ends[self._flat[ends] == tok]

    def draft(self, context: Sequence[int]) -> Draft:
        if not context:
            return EMPTY_DRAFT
        alive = self._by_token.get(int(context[-1]))
        if alive is None or len(alive) == 0:
            return EMPTY_DRAFT
        flat, m = self._flat, 1
        limit = min(len(context), self.max_pattern)
        while m < limit:
            prev = alive - m
            ok = prev >= 0
            ok[ok] = flat[prev[ok]] == context[-1 - m]
            if not ok.any():
                break
            alive, m = alive[ok], m + 1
        start = int(alive[0]) + 1
        out = []
        for tok in flat[start : start + self.gamma].tolist():
            if tok == _SEP:
                break
            out.append(tok)
        return Draft.linear(out, match_len=m, source="naive")
