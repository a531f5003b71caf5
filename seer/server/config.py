"""Settings of the HTTP server and the limits a request is checked against before it may join a batch.

Why checked up front: the server runs every request of a batching window in one rollout, so one request that
can never complete (prompt beyond the context, more KV than an instance holds, a token id outside the
vocabulary) would fail the whole batch, other clients included. Such requests are rejected at the door with an
OpenAI-style 400 instead; the limits are read once from the coordinator's instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_CHUNK_TOKENS = 32  # smaller than a batch rollout's 128: results stream (and aborts land) per chunk


@dataclass(frozen=True)
class ServerConfig:
    """How the server batches, what it accepts, and under which name it serves the model.

    ``batch_window_s``: a batch closes once no request has arrived for this long (or ``batch_max_wait_s`` after
    its first one); requests arriving meanwhile, or while a rollout runs, go into the same rollout, so separate
    requests for one prompt form one group and the context-aware scheduler sees the whole batch.
    ``chunk_tokens``: the rollout's chunk size; streamed tokens and client aborts take effect at chunk ends,
    so it is smaller than the batch default. (Under the ``verl`` policy responses are not chunked: a stream
    gets each response whole at its end, and an abort cannot cut a response short.)
    """

    model_name: str
    api_key: str | None = None
    batch_window_s: float = 0.02
    batch_max_wait_s: float = 0.5
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    policy: str | None = None               # None: the coordinator's policy
    max_body_bytes: int = 8 * 2**20
    max_n: int = 1024                       # samples per prompt
    max_prompts: int = 4096                 # prompts (groups) per request
    max_logprobs: int = 20

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.batch_window_s < 0 or self.batch_max_wait_s < self.batch_window_s:
            raise ValueError(f"need 0 <= batch_window_s <= batch_max_wait_s, got {self.batch_window_s}, "
                             f"{self.batch_max_wait_s}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        for name in ("max_body_bytes", "max_n", "max_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank (omit it to serve without a key)")


@dataclass(frozen=True)
class ModelLimits:
    """What one response may need: context length, vocabulary, and the KV tokens of one instance."""

    max_model_len: int
    vocab_size: int
    kv_tokens: int               # KV capacity of one instance in tokens

    @classmethod
    def of(cls, coordinator: Any) -> "ModelLimits":
        """Read the limits from the coordinator's instances (in process) or from the model and the config. Draft
        tokens need no KV beyond the response's own: they stay inside its budget (engine/speculator.py)."""
        cfg = coordinator.config
        engines = getattr(coordinator.backend, "engines", None)
        if engines:
            engine = engines[0]
            bm = engine.block_manager
            return cls(engine.max_model_len, engine.model_config.vocab_size, bm.num_blocks * bm.block_size)
        from seer.models.config import ModelConfig

        mc = ModelConfig.from_dir(coordinator.model)
        ec = cfg.instance_engine(coordinator.model)
        blocks = ec.resolve_num_blocks(mc.kv_bytes_per_token(ec.torch_dtype))
        return cls(ec.model_len(mc.max_position_embeddings), mc.vocab_size, blocks * ec.block_size)
