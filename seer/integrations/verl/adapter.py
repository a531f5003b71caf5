"""``SeerServerAdapter``: verl's ``BaseRollout`` for ``actor_rollout_ref.rollout.name=seer`` (imports verl).

verl builds one ``BaseRollout`` per training worker (``get_rollout_class(rollout.name, "async")``) and, at every
weight sync, calls ``await rollout.update_weights(per_tensor_generator, peft_config=..., base_sync_done=...)``
inside the FSDP/Megatron worker. The generator gathers full tensors (a collective), so every rank drains it;
only global rank 0 keeps a CPU copy and pushes it to Seer through the configured client (HTTP: written as
safetensors under ``weights_dir`` then ``/update_weights``; Ray: the named Seer actor). Seer runs on its own
devices, so ``resume``/``release`` (verl's sleep/wake of a colocated engine) have nothing to do.

``generate_sequences`` implements verl's token-form contract with the same code the manager uses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable

import torch
from verl.workers.rollout.base import BaseRollout

from seer.integrations.verl.batching import cfg_get, seer_options

logger = logging.getLogger(__name__)


async def collect_state_dict(weights: Iterable | AsyncIterator, keep: bool, dtype: torch.dtype | None = None
                             ) -> dict[str, torch.Tensor]:
    """Drain verl's (sync or async) ``(name, tensor)`` generator; CPU copies when ``keep``, floating tensors
    cast to ``dtype`` (the rollout dtype: half the bytes of fp32 master weights to move)."""
    state: dict[str, torch.Tensor] = {}

    def take(name: str, tensor: torch.Tensor) -> None:
        if keep:
            t = tensor.detach()
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
                state[name] = t if t.device.type == "cpu" else t.to("cpu")
                return
            state[name] = t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()

    if hasattr(weights, "__aiter__"):
        async for name, tensor in weights:
            take(name, tensor)
    else:
        for name, tensor in weights:
            take(name, tensor)
    return state


class SeerServerAdapter(BaseRollout):
    """verl's per-worker rollout handle when Seer is the rollout backend."""

    def __init__(self, config, model_config, device_mesh, *, client=None) -> None:
        super().__init__(config, model_config, device_mesh)
        self.options = seer_options(self.config)
        self.rank = int(os.environ.get("RANK", "0"))
        self._client = client
        self.weight_version: int | None = None
        self.sleep_level = 1  # read by verl's LoRA path; Seer keeps no colocated weights to drop

    @property
    def client(self):
        if self._client is None:
            from seer.integrations.verl.client import make_client
            self._client = make_client(self.options, model_path=cfg_get(self.model_config, "local_path")
                                       or cfg_get(self.model_config, "path"))
        return self._client

    @property
    def push_dtype(self) -> torch.dtype | None:
        """``custom.seer.push_dtype`` (default: verl's ``rollout.dtype``); 'none' keeps the trainer's dtype."""
        name = self.options.get("push_dtype", cfg_get(self.config, "dtype", "bfloat16"))
        if name in (None, "none", "None"):
            return None
        dtypes = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
                  "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
        if str(name) not in dtypes:
            raise ValueError(f"push_dtype must be one of {sorted(dtypes)} or none, got {name!r}")
        return dtypes[str(name)]

    @property
    def is_pusher(self) -> bool:
        return self.rank == 0

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs) -> int | None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"Seer takes full named tensors (checkpoint_engine.backend=naive); got "
                                      f"wire_format={wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("Seer loads full weights only; LoRA adapter sync is not supported")
        state = await collect_state_dict(weights, keep=self.is_pusher, dtype=self.push_dtype)
        if not self.is_pusher:
            return None
        self.weight_version = self.client.update_weights(state)
        logger.info("pushed %d tensors to Seer: weight version %s", len(state), self.weight_version)
        return self.weight_version

    def generate_sequences(self, prompts):
        from seer.integrations.verl.rollout import SeerVerlRollout

        return SeerVerlRollout(self.client, self.config, seed=self.options.get("seed")).generate_sequences(prompts)
