"""Llama / Qwen2 / Qwen3 decoder over a paged KV cache, plus a dense causal forward for training.

The three families are one design (pre-norm decoder, GQA attention with RoPE, gated SiLU MLP); they differ in
flags read from ``ModelConfig``: q/k/v bias (Qwen2), o_proj/MLP bias (some Llamas), per-head q/k RMSNorm
(Qwen3), explicit head_dim (Qwen3). Keeping one implementation means one place to optimise and test.

Two entry points share all weights:
* ``forward`` (inference): a flat batch of new tokens from many sequences, K/V written to and read from the
  paged cache described by ``AttentionMetadata`` (see ``paged_attention``).
* ``forward_dense`` (RL trainer, logprob recompute): [B, L] with left or right padding, no cache,
  autograd-capable.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from seer.models.attention import AttentionMetadata
from seer.models.attn_torch import dense_attention, dense_mask
from seer.models.config import ModelConfig
from seer.models.layers import GatedMLP, RMSNorm
from seer.models.paged_attention import paged_attention
from seer.models.rope import RotaryTables, apply_rotary

# attend(q [.., H, D], k [.., Hkv, D], v) -> [.., H, D]; bound per call to the paged or the dense path
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> q [..., H, D], k/v [..., Hkv, D] with RoPE applied to q and k."""
        lead = x.shape[:-1]
        qkv = self.qkv_proj(x)
        v = qkv[..., self.q_size + self.kv_size:].view(*lead, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(qkv[..., : self.q_size].view(*lead, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[..., self.q_size: self.q_size + self.kv_size]
                            .view(*lead, self.num_kv_heads, self.head_dim))
            return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v
        qk = qkv[..., : self.q_size + self.kv_size].view(*lead, self.num_heads + self.num_kv_heads, self.head_dim)
        qk = apply_rotary(qk, cos, sin)  # one rotation for q and k together
        return qk[..., : self.num_heads, :], qk[..., self.num_heads:, :], v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        o = attend(q, k, v)
        return self.o_proj(o.reshape(*x.shape[:-1], self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    """Embeddings, decoder layers and the final norm (HF's ``model.*``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """The Llama/Qwen2/Qwen3 causal LM; parameter names mirror HF except the fused qkv/gate_up projections."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.rope = RotaryTables(config)

    def tie_weights(self) -> None:
        """Share the embedding matrix with lm_head when the config says so (call again after ``to_empty``)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope.cos.device != positions.device:
            self.rope.to(positions.device)
        return self.rope.lookup(positions, dtype)

    def _run_layers(self, h: torch.Tensor, positions: torch.Tensor, attend_for: Callable[[int], AttendFn]
                    ) -> torch.Tensor:
        cos, sin = self._rope(positions, h.dtype)  # once per step, shared by all layers
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, attend_for(i))
        return self.model.norm(h)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Paged forward of T new tokens: input_ids/positions [T] -> hidden [T, hidden]."""
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.model.layers)} layers")
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must be "
                             "equal 1-D shapes")

        def attend_for(i: int) -> AttendFn:
            k_cache, v_cache = kv_caches[i]
            return lambda q, k, v: paged_attention(q, k, v, k_cache, v_cache, meta, self.model.layers[i]
                                                   .self_attn.scale)

        return self._run_layers(self.model.embed_tokens(input_ids), positions, attend_for)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()

    def forward_dense(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Plain causal forward, no cache: [B, L] -> hidden [B, L, hidden]; autograd-capable.

        With ``attention_mask`` (1 = token, 0 = padding; left or right), positions count real tokens only and
        padding is never attended to; hidden states at padding positions are meaningless but finite.
        """
        B, L = input_ids.shape
        if attention_mask is None:
            positions = torch.arange(L, device=input_ids.device).expand(B, L)
        else:
            m = attention_mask.to(device=input_ids.device, dtype=torch.int64)
            positions = (m.cumsum(-1) - 1).clamp(min=0)
        mask = dense_mask(attention_mask, L, input_ids.device)
        scale = self.config.head_dim ** -0.5

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            o = dense_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale)
            return o.transpose(1, 2)

        return self._run_layers(self.model.embed_tokens(input_ids), positions, lambda i: attend)
