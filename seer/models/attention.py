"""Attention over a paged KV cache: the per-step interface (compute: ``seer.models.paged_attention``).

The engine describes one forward step of a flattened, variable-length batch with an ``AttentionMetadata``.
Every layer of every model uses it unchanged, so anything derived from it (gather indices, masks) is built once
per step, lazily, and cached on the object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """One forward step over T new tokens from B sequences.

    Sequence i contributes ``query_lens[i]`` consecutive new tokens (in order in the flat batch). After the step
    it has ``seq_lens[i]`` tokens of KV: ``seq_lens[i] - query_lens[i]`` already cached plus the new ones.
    ``slot_mapping[t]`` is the flat slot (``block * block_size + offset``) where token t's K/V are written;
    ``block_tables[i]`` lists sequence i's blocks (padded with 0), so KV position p of sequence i lives at slot
    ``block_tables[i, p // block_size] * block_size + p % block_size``.

    ``tree_parents`` (optional) turns the new tokens of a sequence into a tree, for speculative verification of
    multi-path drafts: ``tree_parents[i][j]`` is the index (within sequence i's new tokens) of token j's parent,
    or -1 when its parent is the last cached token. A new token then attends to all cached tokens, its ancestors
    among the new tokens, and itself. ``None`` (or a sequence whose parents are j-1) means a causal chain.
    """

    slot_mapping: torch.Tensor
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor
    block_size: int
    tree_parents: list[list[int] | None] | None = None
    cache: dict = field(default_factory=dict, repr=False)  # per-step derived tensors, shared by all layers

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))
