"""Training samples from one rollout: (prompt, response, old logprobs, advantage) per response of a kept group.

Old logprobs default to the engine's own (taken under the temperature-scaled distribution the response was
sampled from); ``recompute`` replaces them with a trainer forward before the update, as verl does by default,
which makes the first minibatch's ratio exactly 1 even when the engine runs in bfloat16. Minibatches are a
seeded permutation of the samples, so an update is a pure function of (samples, seed, iteration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from seer.rl.advantages import GroupAdvantages


@dataclass(frozen=True)
class Sample:
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    old_logprobs: torch.Tensor          # [len(response)] float32
    advantage: float
    group: int
    ref_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.response:
            raise ValueError("a training sample needs at least one response token")
        if self.old_logprobs.shape != (len(self.response),):
            raise ValueError(f"old_logprobs has shape {tuple(self.old_logprobs.shape)} for a response of "
                             f"{len(self.response)} tokens")

    @property
    def num_tokens(self) -> int:
        return len(self.response)


def build_samples(records: Sequence[dict], advantages: GroupAdvantages) -> list[Sample]:
    """Samples of every non-empty response whose group is kept (records from ``RolloutOutput.records()``)."""
    samples = []
    for rec in records:
        g, i = rec["group_id"], rec["index"]
        if not advantages.keep[g] or not rec["token_ids"]:
            continue
        samples.append(Sample(tuple(rec["prompt_token_ids"]), tuple(rec["token_ids"]),
                              torch.tensor(rec["logprobs"], dtype=torch.float32), advantages.advantages[g][i], g))
    return samples


def with_logprobs(samples: Sequence[Sample], old: Sequence[torch.Tensor] | None = None,
                  ref: Sequence[torch.Tensor] | None = None) -> list[Sample]:
    """Samples with recomputed old logprobs and/or reference logprobs attached."""
    out = []
    for k, s in enumerate(samples):
        s = s if old is None else replace(s, old_logprobs=old[k])
        out.append(s if ref is None else replace(s, ref_logprobs=ref[k]))
    return out


def minibatches(n: int, count: int, seed: int) -> list[list[int]]:
    """A seeded permutation of range(n) cut into ``count`` near-equal non-empty parts."""
    if n == 0:
        return []
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    count = min(count, n)
    bounds = [round(k * n / count) for k in range(count + 1)]
    return [order[bounds[k]: bounds[k + 1]] for k in range(count)]


def micro_batches(indices: Sequence[int], size: int) -> list[list[int]]:
    return [list(indices[s: s + size]) for s in range(0, len(indices), size)]


def flat(samples: Sequence[Sample], field: str) -> torch.Tensor:
    """Concatenate a per-token field (old_logprobs, ref_logprobs) or broadcast ``advantage`` over tokens."""
    if field == "advantage":
        return torch.cat([torch.full((s.num_tokens,), s.advantage, dtype=torch.float32) for s in samples])
    parts = [getattr(s, field) for s in samples]
    if any(p is None for p in parts):
        raise ValueError(f"some samples have no {field}")
    return torch.cat(parts)
