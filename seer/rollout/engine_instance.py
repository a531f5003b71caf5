"""A rollout instance running the real engine: the scheduler-backed instance with a model behind it.

KV leaving the instance is read from the paged cache into a contiguous ``[layers, 2, tokens, kv_heads,
head_dim]`` tensor and stored in the global pool as raw bytes (bf16 has no numpy dtype, so the tensor travels as
uint8 with its dtype and shape in the entry's metadata); loading writes it into freshly allocated blocks, so the
request continues with no recomputation. A step's duration is its measured wall time, unless a cost model is
given (then decisions are reproducible and comparable with the simulator's).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from seer.engine.llm_engine import LLMEngine
from seer.engine.request import Request
from seer.engine.scheduler import SchedulerOutput, StepResult
from seer.engine.speculator import Speculator
from seer.rollout.kv_pool import KVPool
from seer.rollout.scheduled_instance import ScheduledInstance

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16)}


def kv_to_bytes(kv: torch.Tensor) -> tuple[np.ndarray, dict]:
    kv = kv.contiguous().cpu()
    return kv.view(torch.uint8).numpy().reshape(-1), {"dtype": str(kv.dtype), "shape": list(kv.shape)}


def kv_from_bytes(payload, meta: dict) -> torch.Tensor:
    raw = torch.from_numpy(np.frombuffer(bytes(payload) if not isinstance(payload, np.ndarray) else payload,
                                         dtype=np.uint8).copy())
    return raw.view(_DTYPES[meta["dtype"]]).reshape(meta["shape"])


class EngineInstance(ScheduledInstance):
    def __init__(self, instance_id: int, engine: LLMEngine, pool: KVPool, speculator: Speculator | None = None,
                 cost_model: Callable[[SchedulerOutput, dict[str, Request]], float] | None = None) -> None:
        super().__init__(instance_id, engine.scheduler, engine.eos_token_ids, speculator)
        self.engine = engine
        self.pool = pool
        self.cost_model = cost_model

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, StepResult], float]:
        reqs = self.scheduler.requests
        price = self.cost_model(out, reqs) if self.cost_model is not None else None
        t0 = time.perf_counter()
        results = self.engine.runner.execute(out, reqs)
        elapsed = time.perf_counter() - t0
        self.engine.busy_s += elapsed
        return results, elapsed if price is None else price

    def save_kv(self, req: Request) -> int:
        payload, meta = kv_to_bytes(self.engine.runner.read_kv(req, req.num_computed_tokens))
        meta["tokens"] = req.num_computed_tokens
        meta["weight_version"] = self.engine.weight_version
        self.pool.put(int(req.request_id), payload, meta)
        return int(payload.nbytes)

    def load_kv(self, req: Request, request_id: int) -> int:
        if not self.pool.contains(request_id):
            return 0
        payload, meta = self.pool.pop(request_id)
        if meta.get("weight_version") != self.engine.weight_version:
            return 0  # KV of other weights is useless: recompute
        kv = kv_from_bytes(payload, meta)
        self.engine.runner.write_kv(req, kv)
        self.counters["kv_bytes_loaded"] += int(kv.numel() * kv.element_size())
        return int(meta["tokens"])

    def update_weights(self, source, version: int | None = None) -> int:
        for rid in self.resident():
            self.release(rid)
        return self.engine.update_weights(source, version)
