"""The prices one real engine instance paid in a measured run: the simulator's cost model when it replays it.

Why a fit of the run and not the roofline: a replay must answer "given these decisions, what would the engine have
taken", so each step is priced as the engine's own steps were measured in that run (``LinearStepCost``, fitted on
every compute step of every policy: ``fixed + per_seq * B + per_token * N + per_pair * P + per_read * R``), a KV
transfer at the seconds per byte the run's transfers took, and drafting at the seconds per drafting request the
run's drafting took. The step shape is counted exactly as the fit counted it (``StepShape.from_trace``), so a run
priced by this model replays to the same makespan (``tests/sim/test_replay.py``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from seer.engine.scheduler import SchedulerOutput
from seer.rollout.step_cost import LinearStepCost, StepShape
from seer.sim.cost_model import CostModel
from seer.sim.hardware import InstanceSpec, get_accelerator, get_model


@dataclass(frozen=True)
class EnginePrices:
    """What the run's engine paid: per compute step (the fit), per KV byte moved, per drafting request."""

    step: LinearStepCost
    kv_bytes_per_token: int
    kv_s_per_byte: float = 0.0
    draft_s_per_request: float = 0.0
    idle_step_s: float = 1e-4   # a step that scheduled nothing: the host's scheduling tick

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}")
        if min(self.kv_s_per_byte, self.draft_s_per_request, self.idle_step_s) < 0:
            raise ValueError("prices must be >= 0")

    @classmethod
    def from_report(cls, sample: Mapping[str, Any], kv_bytes_per_token: int) -> "EnginePrices":
        """From one sample of a ``seer bench rollout`` report: its step fit, and the KV and drafting seconds
        over the bytes and drafting requests of every policy that ran (pooled: one machine, one price)."""
        fit = sample.get("bound", {}).get("step_fit")
        if not fit:
            raise ValueError("the report has no step fit (bound.step_fit): rerun it with this version of "
                             "`seer bench rollout`")
        rows = list(sample["policies"].values())
        kv_s = sum(sum(r.get("kv_s", ())) for r in rows)
        kv_bytes = sum(r.get("kv_bytes_moved", 0) for r in rows)
        draft_s = sum(sum(r.get("draft_s", ())) for r in rows if "spec" in r)
        drafting = sum(r["spec"].get("steps", 0) for r in rows if "spec" in r)
        return cls(LinearStepCost(**fit), kv_bytes_per_token,
                   kv_s_per_byte=kv_s / kv_bytes if kv_bytes else 0.0,
                   draft_s_per_request=draft_s / drafting if drafting else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FittedCost(CostModel):
    """A ``CostModel`` that prices steps, transfers and drafting at ``EnginePrices`` (one real token per
    simulated token: a replay is step-exact)."""

    def __init__(self, prices: EnginePrices, instance: InstanceSpec | None = None) -> None:
        super().__init__(instance or InstanceSpec(get_accelerator("cpu-2core"), get_model("smollm2-135m"), 1))
        self.prices = prices

    def decode_time(self, num_seqs: int, num_tokens: float, context_tokens: float, attn_pairs: float) -> float:
        """``context_tokens``: the KV the sequences read (each once, however many tokens it computes)."""
        return self.prices.step.step_time(num_seqs, num_tokens, attn_pairs, reads=context_tokens) \
            if num_seqs > 0 else 0.0

    def price(self, out: SchedulerOutput, quantum: int = 1) -> float:
        """The step as the fit measured steps (``StepShape.from_trace`` of the same chunks)."""
        if quantum != 1:
            raise ValueError("engine prices replay real tokens (token quantum 1)")
        if not out.chunks:
            return 0.0
        trace = [(None, c.start, c.num_new_tokens, 0, c.shared_tokens) for c in out.chunks]
        return self.prices.step.of(StepShape.from_trace(trace, 0.0))

    def transfer_time(self, nbytes: float) -> float:
        return nbytes * self.prices.kv_s_per_byte if nbytes > 0 else 0.0

    def draft_time(self, requests: int) -> float:
        return self.prices.draft_s_per_request * requests

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.prices.kv_bytes_per_token

    def idle_time(self) -> float:
        return self.prices.idle_step_s

    def describe(self) -> dict:
        return {"model": "engine prices", **self.prices.to_dict()}
