"""Rotary position embeddings with precomputed cos/sin tables.

Positions are looked up in a float32 table built once (to ``max_position_embeddings``, grown on demand), so a
decode step costs one gather instead of recomputing trigonometry in every layer; the model gathers once per step
and every layer reuses the result. The math follows HF's ``rotate_half`` convention (the two halves of a head
are the real/imaginary parts) and its rounding: the table is float32, cast to the activation dtype, and
``x * cos + rotate_half(x) * sin`` is evaluated as ``[x1*c - x2*s, x2*c + x1*s]``, which rounds identically.
"""

from __future__ import annotations

import math

import torch

from seer.models.config import ModelConfig, RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, with linear or llama3 scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaling(inv_freq, rope, max_position_embeddings)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, rope: RopeConfig, max_pos: int) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, interpolate smoothly in between."""
    old_len = rope.original_max_position_embeddings or max_pos
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


_INITIAL_LENGTH = 8192  # long-context models (128k positions) start small and grow by doubling


class RotaryTables:
    """float32 cos/sin half-tables [length, head_dim // 2], built to min(max_position_embeddings, 8192) and
    doubled on demand (positions past max_position_embeddings are allowed, as in HF).

    Deliberately not a module buffer: ``model.to(bfloat16)`` must not round the float32 tables. Built on CPU
    (explicitly, so a model constructed under ``torch.device("meta")`` still gets real tables); the model moves
    them to the device of its inputs on first use.
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        self.inv_freq = inverse_frequencies(config.rope, config.head_dim, config.max_position_embeddings)
        self.inv_freq = self.inv_freq.to(device)
        self.cos = torch.empty(0, config.head_dim // 2, device=device)
        self.sin = torch.empty(0, config.head_dim // 2, device=device)
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._build(min(config.max_position_embeddings, _INITIAL_LENGTH))

    def _build(self, length: int) -> None:
        pos = torch.arange(length, dtype=torch.int64, device=self.inv_freq.device).to(torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        self.cos, self.sin = freqs.cos(), freqs.sin()
        self._cast = {}

    def to(self, device: torch.device | str) -> "RotaryTables":
        self.inv_freq = self.inv_freq.to(device)
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        self._cast = {}
        return self

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` (any shape) as ``dtype``, shape ``positions.shape + (head_dim // 2,)``."""
        if positions.numel() and int(positions.max()) >= self.cos.shape[0]:
            self._build(max(int(positions.max()) + 1, 2 * self.cos.shape[0]))
        if dtype not in self._cast:  # cast the whole table once per dtype (fp32 -> bf16 rounds like HF)
            self._cast[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        cos, sin = self._cast[dtype]
        return cos[positions], sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., heads, head_dim] by half-tables ``cos``/``sin`` [..., head_dim // 2] (broadcast on heads).

    Returns a new tensor; autograd-safe.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
