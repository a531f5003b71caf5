"""The engine: scheduler + block manager + model runner behind ``add_request`` / ``step``.

Besides plain generation it offers what Seer's rollout needs from an instance: pausing a request and exporting
its tokens and KV (``export_request``), importing such a request on another instance and continuing with no
recomputation (``import_request``), forced-token replay, draft tokens for verification, and weight updates with
a version number.

Engines in one process may share one copy of the weights (``weights_from``): instances take turns on the
device, so one model serves them all, and eight in-process instances of a model then hold its weights once, not
eight times. Such engines change weights together (``InProcessBackend.update_weights``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from seer.engine.block_manager import BlockManager
from seer.engine.config import EngineConfig
from seer.engine.model_runner import ModelRunner
from seer.engine.request import Request
from seer.engine.scheduler import RequestRejected, Scheduler, SchedulerOutput, StepResult
from seer.engine.speculator import Speculator
from seer.engine.step import run_step
from seer.models import attn_kernel, rms_norm
from seer.models.config import ModelConfig
from seer.models.loader import load_model, load_weights
from seer.models.packed_linear import prepack_linears
from seer.sampling_params import SamplingParams
from seer.utils.malloc import keep_freed_memory


@dataclass
class ExportedRequest:
    """A paused request: everything another instance needs to continue it exactly."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    params: SamplingParams
    group_id: str | None
    forced_token_ids: list[int] | None
    num_computed_tokens: int
    kv: torch.Tensor | None  # [layers, 2, num_computed_tokens, kv_heads, head_dim] on CPU, or None (recompute)
    weight_version: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def kv_bytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()


class LLMEngine:
    config: EngineConfig
    model: nn.Module
    model_config: ModelConfig

    def __init__(self, config: EngineConfig, weights_from: "LLMEngine | None" = None) -> None:
        """``weights_from``: an engine of the same model, dtype and device whose loaded weights this one uses."""
        if not config.model:
            raise ValueError("EngineConfig.model is empty: give the model's directory")
        if weights_from is not None:
            theirs = weights_from.config
            if (theirs.model, theirs.torch_dtype, theirs.device) != (config.model, config.torch_dtype, config.device):
                raise ValueError(f"weights_from holds {theirs.model} ({theirs.dtype} on {theirs.device}); this "
                                 f"engine wants {config.model} ({config.dtype} on {config.device})")
        self.config = config
        if config.device == "cpu":
            keep_freed_memory()  # each step's big temporaries reuse pages instead of faulting them in again
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if weights_from is not None:
            self.model, self.model_config = weights_from.model, weights_from.model_config
        else:
            self.model, self.model_config = load_model(config.model, dtype=config.torch_dtype, device=config.device)
            prepack_linears(self.model)  # CPU bf16/fp32; re-packs itself after weight updates
        if config.device == "cpu":  # build the C kernels now (cached per CPU), never inside a timed first step
            attn_kernel.kernel_available()
            rms_norm.kernel_available()
        mc = self.model_config
        num_blocks = config.resolve_num_blocks(mc.kv_bytes_per_token(config.torch_dtype))
        max_len = config.model_len(mc.max_position_embeddings)
        self.scheduler = Scheduler(config.scheduler_config(max_len),
                                   BlockManager(num_blocks, config.block_size, config.enable_prefix_caching))
        self.runner = ModelRunner(self.model, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim,
                                  num_blocks, config.block_size, config.torch_dtype, config.device, config.seed)
        self.eos_token_ids = tuple(mc.eos_token_ids)
        self.weight_version = 0
        self.kv_bytes_moved = 0
        self._ids = itertools.count()
        self.busy_s = 0.0
        self.speculator: Speculator | None = None

    def enable_speculation(self, speculator: "Speculator | None") -> None:
        """Turn grouped speculative decoding on (or off with None) for the following steps."""
        self.speculator = speculator

    # ------------------------------------------------------------------ properties
    @property
    def max_model_len(self) -> int:
        return self.scheduler.config.max_model_len

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.block_manager

    @property
    def stats(self):
        return self.scheduler.stats

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # ------------------------------------------------------------------ requests
    def make_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                     group_id: str | None = None, forced_token_ids: list[int] | None = None) -> Request:
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestRejected(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        if forced_token_ids is not None and any(not 0 <= t < vocab for t in forced_token_ids):
            raise RequestRejected("forced token ids must lie inside the vocabulary")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        return Request(rid, list(prompt_token_ids), params, eos_token_ids=self.eos_token_ids, group_id=group_id,
                       forced_token_ids=None if forced_token_ids is None else list(forced_token_ids))

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    group_id: str | None = None, forced_token_ids: list[int] | None = None) -> Request:
        """Queue one request; raises ``RequestRejected``/``ValueError`` at once for one that cannot run."""
        params.validate()
        req = self.make_request(prompt_token_ids, params, request_id, group_id, forced_token_ids)
        self.scheduler.add_request(req)
        return req

    def abort(self, request_id: str) -> Request | None:
        return self.scheduler.abort(request_id)

    def execute(self, out: SchedulerOutput) -> dict[str, StepResult]:
        """Run one scheduled step's forward pass (its time counts in ``busy_s``)."""
        t0 = time.perf_counter()
        results = self.runner.execute(out, self.scheduler.requests)
        self.busy_s += time.perf_counter() - t0
        return results

    def step(self) -> list[Request]:
        """Run one scheduling step and forward pass; returns the requests that finished."""
        return run_step(self.scheduler, lambda out: (self.execute(out), None), self.speculator).finished

    def run_until_done(self) -> list[Request]:
        done: list[Request] = []
        while self.has_unfinished():
            done += self.step()
        return done

    # ------------------------------------------------------------------ migration
    def export_request(self, request_id: str, with_kv: bool = True) -> ExportedRequest:
        """Remove a request between steps and hand back its tokens (and KV for its computed tokens)."""
        req = self.scheduler.requests.get(request_id)
        if req is None:
            raise KeyError(f"unknown or finished request {request_id!r}")
        n = req.num_computed_tokens
        kv = self.runner.read_kv(req, n).cpu() if (with_kv and n > 0) else None
        exported = ExportedRequest(req.request_id, list(req.prompt_token_ids), list(req.output_token_ids),
                                   list(req.output_logprobs), req.params, req.group_id,
                                   req.forced_token_ids, n if kv is not None else 0, kv, self.weight_version)
        self.scheduler.abort(request_id)
        self.kv_bytes_moved += exported.kv_bytes
        return exported

    def import_request(self, exp: ExportedRequest, params: SamplingParams | None = None) -> Request:
        """Continue an exported request here; its KV is written into fresh blocks (no recomputation)."""
        if exp.kv is not None and exp.weight_version != self.weight_version:
            raise ValueError(f"request {exp.request_id} was computed with weights v{exp.weight_version}, "
                             f"this engine has v{self.weight_version}")
        if exp.request_id in self.scheduler.requests:
            raise RequestRejected(f"duplicate request id {exp.request_id}")
        req = self.make_request(exp.prompt_token_ids, params or exp.params, exp.request_id, exp.group_id,
                                exp.forced_token_ids)
        req.output_token_ids = list(exp.output_token_ids)
        req.output_logprobs = list(exp.output_logprobs)
        self.scheduler.validate(req)
        if exp.kv is not None and exp.num_computed_tokens > 0:
            if not self.block_manager.allocate(req, exp.num_computed_tokens):
                raise RequestRejected(f"request {exp.request_id}: no free KV blocks to import "
                                      f"{exp.num_computed_tokens} tokens")
            self.runner.write_kv(req, exp.kv)
            req.num_computed_tokens = exp.num_computed_tokens
            self.block_manager.cache_full_blocks(req)
            self.kv_bytes_moved += exp.kv_bytes
        self.scheduler.add_request(req)
        return req

    # ------------------------------------------------------------------ weights
    def update_weights(self, source: str | Path | dict, version: int | None = None) -> int:
        """Load new weights (directory or state dict); cached KV of old weights is dropped."""
        self._require_idle("update_weights")
        load_weights(self.model, source)
        return self.weights_changed(version)

    def weights_changed(self, version: int | None = None) -> int:
        """The weights this engine uses changed (another engine sharing them loaded new ones): cached KV of the
        old weights is dropped and the version moves on."""
        self._require_idle("weights changed")
        self.block_manager.reset_prefix_cache()
        self.weight_version = self.weight_version + 1 if version is None else version
        return self.weight_version

    def _require_idle(self, action: str) -> None:
        if self.scheduler.has_unfinished:
            raise RuntimeError(f"{action} while requests are running would mix weight versions")
