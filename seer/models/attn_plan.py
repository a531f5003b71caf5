"""Per-step attention plan: how one ``AttentionMetadata`` batch is split and indexed, built once per step.

Every layer attends over the same sequences, so the grouping and index tensors are derived once (lazily, on
the first layer) and cached in ``meta.cache``. Sequences are split by query length:

* short (``q_len <= SHORT_QUERY_MAX``: decode, speculative verify, small chunks) go to the paged kernel (or its
  bucketed PyTorch fallback). They are ordered by their first KV block, so the G siblings of a group, which
  share their prompt blocks, are processed back to back and the shared blocks are read from cache, not DRAM.
* long (prefill chunks) are attended one sequence at a time with SDPA, which is compute-efficient there.

Tree verification: ``allowed[t]`` is a bitmask over the new tokens of t's sequence (bit m set when t may see
new token m): ancestors-or-self for a tree, ``0..j`` for a chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seer.models.attention import AttentionMetadata

SHORT_QUERY_MAX = 16  # query lengths up to this use the decode kernel (must stay <= 62 for the int64 bitmask)
PLAN_KEY = "seer.attn_plan"


@dataclass
class LongSeq:
    """One long-query sequence: its new tokens are q[start : start + q_len]."""

    index: int
    start: int
    q_len: int
    seq_len: int
    block_ids: torch.Tensor  # int64 [ceil(seq_len / block_size)]
    visible_new: torch.Tensor | None  # bool [q_len, q_len] for trees; None = causal chain

    @property
    def ctx_len(self) -> int:
        return self.seq_len - self.q_len


@dataclass
class ShortGroup:
    """All short-query sequences, as the kernel wants them (int64, contiguous, sorted by first block)."""

    seq_ids: list[int]
    q_start: torch.Tensor
    q_len: torch.Tensor
    seq_len: torch.Tensor
    block_tables: torch.Tensor  # [n, max_blocks_needed]
    allowed: torch.Tensor | None  # int64 [T] bitmasks, None when every short sequence is a causal chain
    fallback: dict = field(default_factory=dict)  # lazily built PyTorch-path buckets


@dataclass
class StepPlan:
    num_tokens: int
    short: ShortGroup | None
    long: list[LongSeq]


def ancestor_masks(parents: list[int] | None, q_len: int) -> list[int]:
    """Bitmask per new token: itself plus its ancestors among the new tokens (a chain when parents is None)."""
    if parents is None:
        return [(1 << (j + 1)) - 1 for j in range(q_len)]
    if len(parents) != q_len:
        raise ValueError(f"tree_parents has {len(parents)} entries for a sequence with {q_len} new tokens")
    masks: list[int] = []
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"tree_parents[{j}] = {parent}: a parent must precede its child (-1 = cached token)")
        masks.append((masks[parent] if parent >= 0 else 0) | (1 << j))
    return masks


def _visible_matrix(parents: list[int], q_len: int, device: torch.device) -> torch.Tensor:
    """bool [q_len, q_len]: row j marks j's ancestors among the new tokens and j itself (any tree size)."""
    if len(parents) != q_len:
        raise ValueError(f"tree_parents has {len(parents)} entries for a sequence with {q_len} new tokens")
    vis = torch.zeros(q_len, q_len, dtype=torch.bool)
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"tree_parents[{j}] = {parent}: a parent must precede its child (-1 = cached token)")
        if parent >= 0:
            vis[j] = vis[parent]
        vis[j, j] = True
    return vis.to(device)


def _validate(meta: AttentionMetadata) -> None:
    if len(meta.seq_lens) != len(meta.query_lens):
        raise ValueError(f"seq_lens has {len(meta.seq_lens)} entries, query_lens {len(meta.query_lens)}")
    for i, (q, s) in enumerate(zip(meta.query_lens, meta.seq_lens)):
        if q < 1 or s < q:
            raise ValueError(f"sequence {i}: query_len {q} and seq_len {s} (need 1 <= query_len <= seq_len)")
        if -(-s // meta.block_size) > meta.block_tables.shape[1]:
            raise ValueError(f"sequence {i}: seq_len {s} needs more blocks than block_tables has columns "
                             f"({meta.block_tables.shape[1]} x {meta.block_size})")
    if meta.slot_mapping.numel() != meta.num_tokens:
        raise ValueError(f"slot_mapping has {meta.slot_mapping.numel()} entries for {meta.num_tokens} tokens")
    if meta.tree_parents is not None and len(meta.tree_parents) != meta.num_seqs:
        raise ValueError("tree_parents must have one entry (list or None) per sequence")


def build_plan(meta: AttentionMetadata, device: torch.device) -> StepPlan:
    _validate(meta)
    bs = meta.block_size
    tables = meta.block_tables.to(device=device, dtype=torch.int64)
    trees = meta.tree_parents or [None] * meta.num_seqs
    starts, t = [], 0
    for q in meta.query_lens:
        starts.append(t)
        t += q
    short_ids = [i for i, q in enumerate(meta.query_lens) if q <= SHORT_QUERY_MAX]
    long_seqs = []
    for i, q in enumerate(meta.query_lens):
        if q > SHORT_QUERY_MAX:
            s = meta.seq_lens[i]
            vis = None if trees[i] is None else _visible_matrix(trees[i], q, device)
            long_seqs.append(LongSeq(i, starts[i], q, s, tables[i, : -(-s // bs)], vis))
    short = None
    if short_ids:
        first_block = meta.block_tables[:, 0].tolist()
        short_ids.sort(key=lambda i: first_block[i])  # stable: siblings sharing prompt blocks become adjacent
        short = _short_group(meta, short_ids, starts, tables, trees, device)
    return StepPlan(num_tokens=t, short=short, long=long_seqs)


def _short_group(meta: AttentionMetadata, ids: list[int], starts: list[int], tables: torch.Tensor,
                 trees: list, device: torch.device) -> ShortGroup:
    max_blocks = max(-(-meta.seq_lens[i] // meta.block_size) for i in ids)
    allowed = None
    if any(trees[i] is not None for i in ids):
        bits = [0] * meta.num_tokens
        for i in ids:
            for j, m in enumerate(ancestor_masks(trees[i], meta.query_lens[i])):
                bits[starts[i] + j] = m
        allowed = torch.tensor(bits, dtype=torch.int64, device=device)
    idx = torch.tensor(ids, dtype=torch.int64, device=device)
    return ShortGroup(
        seq_ids=ids,
        q_start=torch.tensor([starts[i] for i in ids], dtype=torch.int64, device=device),
        q_len=torch.tensor([meta.query_lens[i] for i in ids], dtype=torch.int64, device=device),
        seq_len=torch.tensor([meta.seq_lens[i] for i in ids], dtype=torch.int64, device=device),
        block_tables=tables.index_select(0, idx)[:, :max_blocks].contiguous(),
        allowed=allowed,
    )


def get_plan(meta: AttentionMetadata, device: torch.device) -> StepPlan:
    """The cached plan of this step (built on the first layer's call)."""
    plan = meta.cache.get(PLAN_KEY)
    if plan is None:
        plan = build_plan(meta, device)
        meta.cache[PLAN_KEY] = plan
    return plan
