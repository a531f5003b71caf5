"""The C paged-attention kernel against the PyTorch path on batches shaped like RL decoding: groups of siblings
whose block tables start with the same (prefix-cached) blocks, which the bf16 kernel attends once per group.

Covers: groups larger than the kernel's group cap, a member sharing fewer blocks than the rest, members with
different context lengths, tree verification (q_len > 1) inside a group, partial tiles (block sizes 8 and 32),
every specialised head size, and two threads claiming groups concurrently.
"""

from __future__ import annotations

import pytest
import torch

from seer.models import attn_kernel
from seer.models.attention import AttentionMetadata
from seer.models.paged_attention import paged_attention


@pytest.fixture(autouse=True)
def _need_kernel():
    if not attn_kernel.kernel_available():
        pytest.skip("C attention kernel unavailable")


def _grouped_step(dtype: torch.dtype, D: int, bs: int, H: int = 6, hkv: int = 2, seed: int = 0):
    """Sequences in sibling groups sharing `shared` prompt blocks: (q, k, v, k_cache, v_cache, meta factory)."""
    gen = torch.Generator().manual_seed(seed)
    # (group size, shared blocks, [(q_len, seq_len, tree parents or None) per member])
    groups = [
        (20, 3, [(1, 3 * bs + 5 + (i % 7) * 3, None) for i in range(20)]),  # > the kernel's group cap of 16
        (4, 2, [(1, 2 * bs + 1, None), (3, 3 * bs + 4, [-1, 0, 0]), (1, 2 * bs + 9, None),
                (5, 4 * bs + 2, [-1, -1, 1, 0, 2])]),  # tree verification inside a group
        (3, 1, [(1, 3 * bs, None), (1, bs + 1, None), (2, 2 * bs + 7, None)]),
        (1, 0, [(1, 2 * bs + 3, None)]),  # a lone sequence
        # no cached context; the last node is a second root: for bs 8 its row sees nothing in the first tile
        (1, 0, [(10, 10, [-1, 0, 1, 2, 3, 4, 5, 6, 7, -1])]),
    ]
    tables, qlens, seqlens, trees, slots = [], [], [], [], []
    width = max(-(-L // bs) for _, _, members in groups for _, L, _ in members)
    free = iter(torch.randperm(4096, generator=gen).tolist())
    for _, shared, members in groups:
        prefix = [next(free) for _ in range(shared)]
        for j, (q_len, L, tree) in enumerate(members):
            assert L - q_len >= shared * bs  # new tokens never land in a shared block
            row = prefix + [next(free) for _ in range(-(-L // bs) - shared)]
            if j == 2 and shared > 1:  # this member shares only the first block: it must not join the group
                row[1] = next(free)
            tables.append(row + [0] * (width - len(row)))
            qlens.append(q_len)
            seqlens.append(L)
            trees.append(tree)
            slots += [row[p // bs] * bs + p % bs for p in range(L - q_len, L)]
    T = sum(qlens)
    q = torch.randn(T, H, D, generator=gen).to(dtype)
    k, v = torch.randn(T, hkv, D, generator=gen).to(dtype), torch.randn(T, hkv, D, generator=gen).to(dtype)
    kc = torch.randn(4096, bs, hkv, D, generator=gen).to(dtype)
    vc = torch.randn(4096, bs, hkv, D, generator=gen).to(dtype)
    table = torch.tensor(tables)

    def meta():
        return AttentionMetadata(slot_mapping=torch.tensor(slots), query_lens=qlens, seq_lens=seqlens,
                                 block_tables=table, block_size=bs, tree_parents=trees)
    return q, k, v, kc, vc, meta


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D,bs", [(64, 16), (128, 16), (32, 16), (64, 8), (64, 32), (48, 8)])
def test_shared_prefix_groups_agree_with_torch_path(dtype, D, bs, threads):
    q, k, v, kc, vc, meta = _grouped_step(dtype, D, bs)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = []
        for use_kernel in (True, False):
            m = meta()
            m.cache["seer.use_kernel"] = use_kernel
            outs.append(paged_attention(q, k, v, kc.clone(), vc.clone(), m, D ** -0.5).float())
    finally:
        torch.set_num_threads(before)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (outs[0] - outs[1]).abs().max() < tol


def test_large_scores_are_stable():
    """Scores far apart (sharp attention) must not overflow the lazily rescaled softmax."""
    q, k, v, kc, vc, meta = _grouped_step(torch.bfloat16, 64, 16, seed=1)
    q = q * 40  # |score| up to ~hundreds: exp overflows without max subtraction
    outs = []
    for use_kernel in (True, False):
        m = meta()
        m.cache["seer.use_kernel"] = use_kernel
        outs.append(paged_attention(q, k, v, kc.clone(), vc.clone(), m, 0.125).float())
    assert torch.isfinite(outs[0]).all()
    assert (outs[0] - outs[1]).abs().max() < 3e-2
