"""Per-token logprobs of sampled responses under a model, recomputed with a plain training forward.

The trainer must score a response under exactly the distribution the engine sampled it from, or the PPO ratio is
biased from the first step: the engine's logprobs are taken under the temperature-scaled softmax before top-p /
top-k filtering (see ``SamplingParams``), so we divide the logits by the same temperature. The forward is the
model's ``forward_dense`` (the same weights and layers the engine runs, without the paged KV cache), on
right-padded [B, L] batches of prompt + response; only the hidden states that predict response tokens go through
the LM head, which keeps the [tokens, vocab] logits to the response tokens.

Results are flat over the response tokens of the batch, sequence after sequence (the layout ``loss`` expects).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seer.utils.fast_exp import fast_exp


@dataclass(frozen=True)
class TokenLogprobs:
    """Flat [T] logprobs (and entropies when asked) of the response tokens of a batch, in sequence order."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    lengths: tuple[int, ...]

    def split(self) -> list[torch.Tensor]:
        return list(self.logprobs.split(list(self.lengths)))


def pad_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and attention mask [B, L] of prompt + response sequences."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _prediction_rows(prompt_lens: Sequence[int], response_lens: Sequence[int], width: int) -> torch.Tensor:
    """Flat indices into [B * L] of the positions whose next token is a response token."""
    rows = []
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        start = b * width + p - 1
        rows.append(torch.arange(start, start + r))
    return torch.cat(rows)


def response_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                      responses: Sequence[Sequence[int]], temperature: float = 1.0, with_entropy: bool = False
                      ) -> TokenLogprobs:
    """Logprobs [T] of each response token given its prompt and preceding tokens; autograd flows through.

    ``temperature`` must be the rollout's (> 0). Every prompt and response needs at least one token.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to recompute sampling logprobs, got {temperature}")
    if any(len(p) == 0 for p in prompts) or any(len(r) == 0 for r in responses):
        raise ValueError("every prompt and every response needs at least one token")
    device = next(model.parameters()).device
    ids, mask = pad_batch(prompts, responses)
    ids, mask = ids.to(device), mask.to(device)
    hidden = model.forward_dense(ids, mask)                                   # [B, L, H]
    B, L, H = hidden.shape
    rows = _prediction_rows([len(p) for p in prompts], [len(r) for r in responses], L).to(device)
    logits = model.compute_logits(hidden.reshape(B * L, H)[rows])             # [T, V] float32
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = torch.cat([torch.as_tensor(list(r), dtype=torch.long) for r in responses]).to(device)
    logp = logp_all.gather(1, targets[:, None]).squeeze(1)
    entropy = None
    if with_entropy:
        entropy = -(fast_exp(logp_all) * logp_all).sum(dim=-1)
    return TokenLogprobs(logp, entropy, tuple(len(r) for r in responses))


@torch.no_grad()
def response_logprobs_batched(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                              responses: Sequence[Sequence[int]], temperature: float, micro_batch_size: int
                              ) -> list[torch.Tensor]:
    """Per-response logprobs (no grad) in micro-batches: old or reference logprobs for a whole rollout."""
    out: list[torch.Tensor] = []
    for s in range(0, len(prompts), micro_batch_size):
        part = response_logprobs(model, prompts[s: s + micro_batch_size], responses[s: s + micro_batch_size],
                                 temperature)
        out.extend(t.float().cpu() for t in part.split())
    return out
