"""GRPO advantages: each response is scored against its own siblings, no value model.

For a group of G responses to one prompt with rewards r_1..r_G, response i gets
``A_i = (r_i - mean(r)) / (std(r) + eps)`` (``std`` unbiased, as verl computes it), or ``r_i - mean(r)`` without
the division (Dr. GRPO's ``norm_adv_by_std=False``). Every token of the response shares A_i.

A group whose rewards are all equal (all right or all wrong) has zero advantage everywhere: it adds nothing to the
policy gradient but still counts in the token-mean denominator, diluting the groups that do carry signal.
DAPO's dynamic sampling drops such groups; we drop them from the batch (without re-sampling replacements, which
would break the fixed-size synchronous iteration) and report how many were dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupAdvantages:
    """Per-response advantages of a batch of groups; ``keep[g]`` says whether group g trains."""

    advantages: list[list[float]]
    keep: list[bool]

    @property
    def num_dropped(self) -> int:
        return sum(not k for k in self.keep)

    def kept_pairs(self) -> list[tuple[int, int, float]]:
        """(group, index, advantage) of every response in a kept group."""
        return [(g, i, a) for g, (adv, k) in enumerate(zip(self.advantages, self.keep)) if k
                for i, a in enumerate(adv)]


def group_advantages(rewards: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Rewards [N, G] -> advantages [N, G] (float64 arithmetic, float32 result).

    With G == 1 there is no sibling to compare with: the advantage is 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)
    centred = r - r.mean(dim=1, keepdim=True)
    if r.shape[1] < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    if norm_by_std:
        centred = centred / (r.std(dim=1, unbiased=True, keepdim=True) + eps)
    return centred.to(torch.float32)


def uniform_groups(rewards: torch.Tensor, atol: float = 1e-9) -> torch.Tensor:
    """[N] bool: groups whose rewards are all equal (within ``atol``)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= atol


def grpo_advantages(rewards: Sequence[Sequence[float]], norm_by_std: bool = True, eps: float = 1e-6,
                    drop_uniform: bool = True) -> GroupAdvantages:
    """Group rewards (one list per prompt, possibly of different sizes) -> advantages and kept groups."""
    advantages: list[list[float]] = []
    keep: list[bool] = []
    for group in rewards:
        if len(group) == 0:
            raise ValueError("a group with no responses has no advantages")
        t = torch.tensor([list(group)], dtype=torch.float64)
        advantages.append(group_advantages(t, norm_by_std, eps)[0].tolist())
        keep.append(not (drop_uniform and bool(uniform_groups(t)[0])))
    return GroupAdvantages(advantages, keep)
