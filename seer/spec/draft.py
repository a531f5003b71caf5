"""A draft as flat arrays, so one verifier handles single-path and tree drafts.

Why flat arrays: the engine verifies every request's draft in one forward pass. A draft of ``n`` tokens is a
tree hanging off the request's last token: node ``i`` has token ``token_ids[i]`` and parent ``parents[i]``
(``-1`` = the request's last context token, else an earlier index, so nodes are in topological order). A
single-path draft is the special case ``parents == [-1, 0, 1, ...]``. From ``parents`` the verifier derives the
position of each node (``depths``) and the tree attention mask (each node sees its ancestors and itself).

``probs[i]`` is the drafter's estimate of P(token i | its parent accepted) (from sibling frequencies);
``score`` is the expected number of accepted tokens, the sum of path probabilities, used to pick between
sources and to spend the verification budget; ``match_len`` is the length of the context match it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["Draft", "EMPTY_DRAFT"]


@dataclass(frozen=True)
class Draft:
    token_ids: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    score: float = 0.0
    match_len: int = 0
    source: str = ""
    depths: tuple[int, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.parents) != n or len(self.probs) != n:
            raise ValueError(
                f"draft arrays differ in length: {n} tokens, {len(self.parents)} parents, {len(self.probs)} probs"
            )
        depths: list[int] = []
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"draft node {i} has parent {p}: parents must precede their children")
            depths.append(1 if p < 0 else depths[p] + 1)
        object.__setattr__(self, "depths", tuple(depths))

    @classmethod
    def linear(cls, tokens: Sequence[int], probs: Sequence[float] | None = None, match_len: int = 0,
               source: str = "") -> "Draft":
        """A single-path draft; ``score`` is derived from ``probs`` (default: all 1)."""
        probs = tuple(probs) if probs is not None else (1.0,) * len(tokens)
        score, run = 0.0, 1.0
        for p in probs:
            run *= p
            score += run
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), probs, score, match_len, source)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_linear(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def num_leaves(self) -> int:
        has_child = set(self.parents)
        return sum(1 for i in range(len(self)) if i not in has_child)

    def path_probs(self) -> list[float]:
        """P(node i and all its ancestors accepted)."""
        out: list[float] = []
        for p, q in zip(self.parents, self.probs):
            out.append(q if p < 0 else out[p] * q)
        return out

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root down to node ``i``."""
        path = []
        while i >= 0:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def attention_mask(self) -> np.ndarray:
        """``mask[i, j]`` is True iff node j is node i or one of its ancestors (tree attention among drafts)."""
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    def accept_greedy(self, target: Sequence[int]) -> list[int]:
        """Longest accepted path when the target emits ``target`` (greedy semantics: a node is accepted iff its
        parent was accepted and its token equals the target token at its depth). Returns node indices."""
        accepted: list[int] = []
        parent = -1
        for depth, want in enumerate(target):
            nxt = -1
            for i in range(accepted[-1] + 1 if accepted else 0, len(self)):
                if self.parents[i] == parent and self.depths[i] == depth + 1 and self.token_ids[i] == want:
                    nxt = i
                    break
            if nxt < 0:
                break
            accepted.append(nxt)
            parent = nxt
        return accepted


EMPTY_DRAFT = Draft()
