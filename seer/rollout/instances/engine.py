"""A rollout instance running the real engine: the scheduler-backed instance with a model behind it.

KV leaving the instance is read from the paged cache into a contiguous ``[layers, 2, tokens, kv_heads,
head_dim]`` tensor and stored in the global pool as raw bytes (bf16 has no numpy dtype, so the tensor travels as
uint8 with its dtype and shape in the entry's metadata); loading writes it into freshly allocated blocks, so the
request continues with no recomputation. A step's duration is its measured wall time (scheduling, forward,
update, drafting, and the KV this instance moved since its last step), unless a cost model is given: then it
prices compute, drafting and transfers alike, so decisions are reproducible and comparable with the simulator's.
"""

from __future__ import annotations

import numpy as np
import torch

from seer.engine.llm_engine import LLMEngine
from seer.engine.request import Request
from seer.engine.scheduler import SchedulerOutput, StepResult
from seer.engine.speculator import Speculator
from seer.rollout.instances.scheduled import ScheduledInstance, StepPricer
from seer.rollout.kv_pool import KVPool

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
                 cost_model: StepPricer | None = None) -> None:
        super().__init__(instance_id, engine.scheduler, engine.eos_token_ids, speculator)
        self.engine = engine
        self.pool = pool
        self.cost_model = cost_model

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, StepResult], float | None]:
        price = self.cost_model.price(out) if self.cost_model is not None else None
        return self.engine.execute(out), price

    def idle_duration(self, elapsed_s: float) -> float:
        return elapsed_s if self.cost_model is None else self.cost_model.idle_time()

    def draft_cost(self, elapsed_s: float, drafted: int) -> float:
        return elapsed_s if self.cost_model is None else self.cost_model.draft_time(drafted)

    def kv_cost(self, elapsed_s: float, nbytes: int) -> float:
        return elapsed_s if self.cost_model is None else self.cost_model.transfer_time(nbytes)

    def save_kv(self, req: Request) -> int:
        payload, meta = kv_to_bytes(self.engine.runner.read_kv(req, req.num_computed_tokens))
        meta["tokens"] = req.num_computed_tokens
        meta["weight_version"] = self.engine.weight_version
        self.pool.put(int(req.request_id), payload, meta)
        return int(payload.nbytes)

    def load_kv(self, req: Request, request_id: int) -> tuple[int, str]:
        if not self.pool.contains(request_id):
            return 0, "pool_miss"
        payload, meta = self.pool.pop(request_id)
        if meta.get("weight_version") != self.engine.weight_version:
            return 0, "weight_version"  # KV of other weights is useless: recompute
        start = req.num_computed_tokens
        kv = kv_from_bytes(payload, meta)[:, :, start:]
        self.engine.runner.write_kv(req, kv, start)
        self.counters["kv_bytes_loaded"] += int(kv.numel() * kv.element_size())
        return int(meta["tokens"]), ""

    def discard_kv(self, request_id: int) -> None:
        self.pool.drop(request_id)

    def update_weights(self, source, version: int | None = None) -> int:
        for rid in self.resident():
            self.release(rid)
        return self.engine.update_weights(source, version)
