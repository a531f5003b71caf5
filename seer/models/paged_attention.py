"""Paged attention entry point used by every attention layer.

One call per layer: write the step's new K/V into the paged cache at ``meta.slot_mapping``, then attend. The
step's plan (grouping, index tensors, tree masks) comes from ``attn_plan`` and is built on the first layer only.
Short queries use the C kernel on CPU (``attn_kernel``) or the bucketed PyTorch fallback; long queries use SDPA.

Cache layout (the engine allocates it): per layer ``k_cache``/``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, in the model's dtype.
"""

from __future__ import annotations

import torch

from seer.models import attn_kernel
from seer.models.attention import AttentionMetadata
from seer.models.attn_plan import get_plan
from seer.models.attn_torch import attend_long, attend_short_torch
from seer.models.config import ModelConfig

KERNEL_KEY = "seer.use_kernel"  # set False in meta.cache to force the PyTorch path
_DECIDED_KEY = "seer.kernel_decided"


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int = 16,
                       dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed per-layer (k_cache, v_cache), views of one [layers, 2, blocks, block_size, kv_heads, head_dim]
    tensor (so a block of every layer can be exported with one index op on ``caches[0][0]._base``).

    block_size 16 is the kernel's sweet spot (it scores 16 keys per tile); any size works.
    """
    shape = (config.num_hidden_layers, 2, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    storage = torch.zeros(shape, dtype=dtype, device=device)
    return [(storage[i, 0], storage[i, 1]) for i in range(config.num_hidden_layers)]


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' k/v [T, Hkv, D] at their flat slots."""
    if k_cache.dtype != k.dtype:
        raise TypeError(f"KV cache dtype {k_cache.dtype} differs from the model dtype {k.dtype}; allocate the "
                        "cache in the model's dtype")
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("KV caches must be contiguous [num_blocks, block_size, num_kv_heads, head_dim] tensors")
    T = k.shape[0]
    slots = slot_mapping.to(device=k.device, dtype=torch.int64)
    k_cache.view(-1, k_cache.shape[2], k_cache.shape[3]).index_copy_(0, slots, k.reshape(T, *k_cache.shape[2:]))
    v_cache.view(-1, v_cache.shape[2], v_cache.shape[3]).index_copy_(0, slots, v.reshape(T, *v_cache.shape[2:]))


def _use_kernel(meta: AttentionMetadata, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Kernel unless the caller set ``meta.cache[KERNEL_KEY] = False`` or it cannot run here."""
    decided = meta.cache.get(_DECIDED_KEY)
    if decided is None:
        decided = meta.cache.get(KERNEL_KEY) is not False and attn_kernel.kernel_supports(q, k_cache)
        meta.cache[_DECIDED_KEY] = decided
    return bool(decided)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal (or tree) attention of the step's new tokens over cache + themselves.

    q [T, H, D], k/v [T, Hkv, D] (new tokens, RoPE applied) -> [T, H, D]. Writes k/v into the caches first.
    Set ``meta.cache["seer.use_kernel"] = False`` before the first layer to force the PyTorch path.
    """
    if q.requires_grad:
        raise RuntimeError("the paged forward is inference-only (the KV cache is written in place); use "
                           "forward_dense for gradients, or run under torch.inference_mode()")
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    plan = get_plan(meta, q.device)
    q = q.contiguous()
    out = torch.empty_like(q)
    if plan.short is not None:
        g = plan.short
        if _use_kernel(meta, q, k_cache):
            attn_kernel.run_kernel(q, out, k_cache, v_cache, g.block_tables, g.q_start, g.q_len, g.seq_len,
                                   g.allowed, scale)
        else:
            attend_short_torch(q, out, k_cache, v_cache, g, scale)
    for seq in plan.long:
        sl = slice(seq.start, seq.start + seq.q_len)
        out[sl] = attend_long(q[sl], k[sl], v[sl], k_cache, v_cache, seq, scale)
    return out
