"""Attention in plain PyTorch: prefill over the paged cache, the decode fallback, and dense causal attention.

These paths run wherever the C decode kernel does not: long queries (prefill chunks, where SDPA's blocked
matmuls are the efficient choice), CUDA, dtypes the kernel lacks, or machines without a compiler. GQA is handled
by folding the G query heads that share a kv head into the query-row axis (decode) or by repeating kv heads
(prefill), since ``enable_gqa`` falls back to a slow path on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seer.models.attn_plan import LongSeq, ShortGroup

_BUCKET_SLACK = 1.25  # a decode bucket may pad its total key count by at most this factor
_BUCKET_MIN = 4


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Rows of whole blocks: ``cache`` [NB, bs, Hkv, D], ids [...,nb] -> [..., nb * bs, Hkv, D]."""
    nb, bs = cache.shape[0], cache.shape[1]
    rows = cache.view(nb, -1).index_select(0, block_ids.reshape(-1))
    return rows.view(*block_ids.shape[:-1], block_ids.shape[-1] * bs, *cache.shape[2:])


def attend_long(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, seq: LongSeq, scale: float) -> torch.Tensor:
    """One long-query sequence: q [Q, H, D] (its new tokens) -> [Q, H, D]."""
    H, hkv = q.shape[1], k_cache.shape[2]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, Q, D]
    if seq.ctx_len == 0 and seq.visible_new is None:  # fresh prompt: attend to the new keys only
        k, v, mask, causal = k_new, v_new, None, True
    else:
        k = gather_blocks(k_cache, seq.block_ids)[: seq.seq_len]
        v = gather_blocks(v_cache, seq.block_ids)[: seq.seq_len]
        new = seq.visible_new
        if new is None:
            new = torch.ones(seq.q_len, seq.q_len, dtype=torch.bool, device=q.device).tril()
        cached = torch.ones(seq.q_len, seq.ctx_len, dtype=torch.bool, device=q.device)
        mask, causal = torch.cat([cached, new], dim=1), False
    kh, vh = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    if hkv != H:
        kh, vh = kh.repeat_interleave(H // hkv, dim=1), vh.repeat_interleave(H // hkv, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal, scale=scale)
    return out[0].transpose(0, 1)


def _buckets(group: ShortGroup, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Split short sequences into (same q_len, similar seq_len) buckets: (token idx, block ids, mask) each."""
    q_len, seq_len = group.q_len.tolist(), group.seq_len.tolist()
    q_start = group.q_start.tolist()
    order = sorted(range(len(q_len)), key=lambda r: (q_len[r], seq_len[r]))
    runs: list[list[int]] = []
    for r in order:
        cur = runs[-1] if runs else None
        if cur and q_len[cur[0]] == q_len[r]:
            total = sum(seq_len[x] for x in cur) + seq_len[r]
            if len(cur) < _BUCKET_MIN or (len(cur) + 1) * seq_len[r] <= _BUCKET_SLACK * total:
                cur.append(r)
                continue
        runs.append([r])
    device = group.q_len.device
    out = []
    for rows in runs:
        q, lmax = q_len[rows[0]], max(seq_len[r] for r in rows)
        nb = -(-lmax // block_size)
        ridx = torch.tensor(rows, dtype=torch.int64, device=device)
        tok = torch.tensor([[q_start[r] + j for j in range(q)] for r in rows], dtype=torch.int64, device=device)
        pos = torch.arange(nb * block_size, device=device)
        lens = group.seq_len.index_select(0, ridx)
        ctx = lens - q
        mask = (pos[None, None, :] < ctx[:, None, None]).expand(len(rows), q, -1).clone()
        new_pos = pos[None, None, :] - ctx[:, None, None]  # index among the new tokens
        j = torch.arange(q, device=device)[None, :, None]
        if group.allowed is None:
            new_vis = (new_pos >= 0) & (new_pos <= j)
        else:
            bits = group.allowed.index_select(0, tok.reshape(-1)).view(len(rows), q, 1)
            new_vis = (new_pos >= 0) & (new_pos < q) & (((bits >> new_pos.clamp(0, 62)) & 1) == 1)
        mask |= new_vis
        out.append((tok, group.block_tables.index_select(0, ridx)[:, :nb], mask))
    return out


def attend_short_torch(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       group: ShortGroup, scale: float) -> None:
    """Bucketed gather + SDPA for short queries; writes rows of ``out`` [T, H, D]."""
    H, D = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    G = H // hkv
    buckets = group.fallback.get(G)
    if buckets is None:
        buckets = [(tok, blk, mask.repeat_interleave(G, dim=1).unsqueeze(1))
                   for tok, blk, mask in _buckets(group, k_cache.shape[1])]
        group.fallback[G] = buckets
    for tok, blk, mask in buckets:
        n, Q = tok.shape
        k = gather_blocks(k_cache, blk).permute(0, 2, 1, 3)  # [n, Hkv, Lp, D]
        v = gather_blocks(v_cache, blk).permute(0, 2, 1, 3)
        qb = q.index_select(0, tok.reshape(-1)).view(n, Q, hkv, G, D).permute(0, 2, 1, 3, 4)
        o = F.scaled_dot_product_attention(qb.reshape(n, hkv, Q * G, D), k, v, attn_mask=mask, scale=scale)
        o = o.view(n, hkv, Q, G, D).permute(0, 2, 1, 3, 4).reshape(n * Q, H, D)
        out.index_copy_(0, tok.reshape(-1), o)


def dense_mask(attention_mask: torch.Tensor | None, length: int, device: torch.device) -> torch.Tensor | None:
    """bool [B, 1, L, L]: causal, padding keys hidden, every row keeps its diagonal (so no NaN rows); None when
    there is no padding (plain causal attention, which SDPA runs faster with ``is_causal``)."""
    if attention_mask is None:
        return None
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    keys = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return (causal & keys) | eye


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float) -> torch.Tensor:
    """q [B, H, L, D], k/v [B, Hkv, L, D] -> [B, H, L, D]; causal, plus ``mask`` if given; autograd-capable."""
    H, hkv = q.shape[1], k.shape[1]
    if hkv != H:
        k, v = k.repeat_interleave(H // hkv, dim=1), v.repeat_interleave(H // hkv, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)
