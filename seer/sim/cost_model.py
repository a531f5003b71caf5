"""Roofline price of one engine step: what a ``SchedulerOutput`` would cost on a given instance.

Why a roofline: a step streams the (touched) weights and every scheduled sequence's KV cache from HBM and does
2 x active-parameter FLOPs per token plus attention FLOPs per query-context pair. Whichever of compute and memory
is slower bounds the step; tensor-parallel all-reduces and a fixed per-step overhead (kernel launches, host-side
scheduling, sampling) add on top:

    step = max(flops / (gpus * peak * compute_eff), bytes / (hbm_bw * memory_eff)) + all_reduce + overhead

Prefill, decode and draft verification are the same thing to this formula (tokens whose KV is computed this step,
each attending to its context), which is exactly how the scheduler sees them (vLLM v1 style: no phases). KV moved
to or from the global pool costs bytes over the pool link. ``calibrate.py`` fits the efficiencies and overheads
to measured steps.

Token quantum: the simulator may run the scheduler on coarse tokens, one simulated token standing for ``q`` real
ones (see ``sim_instance.py``). A simulated step then stands for ``q`` real steps, each computing as many real
tokens per sequence as the simulated step computes simulated tokens, so its price is ``q`` times the price of one
such real step at the real contexts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from seer.engine.scheduler import SchedulerOutput
from seer.sim.hardware import InstanceSpec


@dataclass(frozen=True)
class CostConstants:
    """What the roofline cannot know; fitted by ``calibrate`` (efficiencies, overheads) or given (pool link)."""

    compute_efficiency: float = 0.5     # achieved fraction of peak FLOP/s
    memory_efficiency: float = 0.8      # achieved fraction of HBM bandwidth
    step_overhead_s: float = 0.004      # fixed per step
    per_seq_overhead_s: float = 0.0     # per scheduled sequence per step
    pool_bandwidth: float = 50e9        # bytes/s per GPU to/from the global KV pool (a 400 Gb/s RDMA NIC each)
    pool_latency_s: float = 1e-4        # per transfer
    # Drafting, per request that drafts, added to its instance's step. 0 for the GPU presets: there the draft
    # server runs on host CPUs while the accelerator computes, as in the paper; a CPU engine pays it in line.
    draft_s_per_request: float = 0.0

    def __post_init__(self) -> None:
        if self.compute_efficiency <= 0 or self.memory_efficiency <= 0:
            raise ValueError("compute_efficiency and memory_efficiency must be > 0 (fractions of the profile's "
                             "nominal peaks; above 1 only if the profile understates the hardware)")
        if min(self.step_overhead_s, self.per_seq_overhead_s, self.pool_latency_s, self.draft_s_per_request) < 0:
            raise ValueError("overheads and latencies must be >= 0")
        if self.pool_bandwidth <= 0:
            raise ValueError("pool_bandwidth must be > 0")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class StepSummary:
    """One real engine step as the roofline sees it."""

    num_seqs: int
    num_tokens: float        # tokens computed (prompt, decode and draft tokens)
    context_tokens: float    # sum over scheduled sequences of the KV context read
    attn_pairs: float        # sum over computed tokens of the context each attends to

    @classmethod
    def decode(cls, num_seqs: int, context_tokens: float, tokens_per_seq: float = 1.0) -> "StepSummary":
        """A batch of sequences each computing ``tokens_per_seq`` tokens (decode, or decode + drafts)."""
        return cls(num_seqs, num_seqs * tokens_per_seq, context_tokens, context_tokens * tokens_per_seq)


class CostModel:
    """Prices steps of one instance; stateless apart from precomputed rates."""

    def __init__(self, instance: InstanceSpec, constants: CostConstants | None = None) -> None:
        self.instance = instance
        self.constants = constants or CostConstants()
        c, acc, m, g = self.constants, instance.accelerator, instance.model, instance.gpus
        self._flops_rate = g * acc.peak_flops * c.compute_efficiency
        self._mem_rate = acc.hbm_bandwidth * c.memory_efficiency           # per GPU; GPUs read in parallel
        self._flops_per_token = 2.0 * m.active_params
        self._attn_flops = m.attn_flops_per_pair
        self._kv_bytes_gpu = m.kv_bytes_per_token / instance.effective_kv_shards
        self._comm_s_per_token = 0.0
        if g > 1:  # two all-reduces of the hidden state per layer, ring: 2 (g-1)/g of the bytes per GPU
            volume = 2 * m.num_layers * m.hidden_size * 2.0 * 2.0 * (g - 1) / g
            self._comm_s_per_token = volume / acc.link_bandwidth
        self._fixed_s = c.step_overhead_s
        self._per_seq_s = c.per_seq_overhead_s
        # weight bytes by token count: an MoE's expert-hit formula is a pow, and the draft budget prices a
        # step at every candidate token count (millions of times in a large simulation) over few distinct counts
        self._weights: dict[float, float] = {}

    # ------------------------------------------------------------------ pricing
    def components(self, s: StepSummary) -> tuple[float, float, float]:
        """(compute seconds, memory seconds, communication seconds) of one step, overheads excluded."""
        return self._components(s.num_tokens, s.context_tokens, s.attn_pairs)

    def _components(self, num_tokens: float, context_tokens: float, attn_pairs: float) -> tuple[float, float, float]:
        flops = self._flops_per_token * num_tokens + self._attn_flops * attn_pairs
        weights = self._weights.get(num_tokens)
        if weights is None:
            weights = self._weights[num_tokens] = self.instance.model.weight_bytes_read(num_tokens) / self.instance.gpus
        kv = self._kv_bytes_gpu * (context_tokens + num_tokens)
        return flops / self._flops_rate, (weights + kv) / self._mem_rate, self._comm_s_per_token * num_tokens

    def step_time(self, s: StepSummary) -> float:
        return self.decode_time(s.num_seqs, s.num_tokens, s.context_tokens, s.attn_pairs)

    def decode_time(self, num_seqs: int, num_tokens: float, context_tokens: float, attn_pairs: float) -> float:
        """``step_time`` of the step these four numbers summarise, without building its ``StepSummary`` (the
        draft budget prices candidate steps in its inner loop)."""
        if num_seqs <= 0:
            return 0.0
        compute, memory, comm = self._components(num_tokens, context_tokens, attn_pairs)
        return max(compute, memory) + comm + self._fixed_s + self._per_seq_s * num_seqs

    @staticmethod
    def summarize(out: SchedulerOutput, quantum: int = 1) -> StepSummary:
        """The real step a (possibly coarse) ``SchedulerOutput`` stands for (see the module docstring)."""
        tokens = 0
        ctx = 0.0
        pairs = 0.0
        for c in out.chunks:
            n = c.num_new_tokens
            mid = c.start + 0.5 * n
            tokens += n
            ctx += mid
            pairs += n * mid
        return StepSummary(len(out.chunks), tokens, ctx * quantum, pairs * quantum)

    def price(self, out: SchedulerOutput, quantum: int = 1) -> float:
        """Seconds the step(s) behind ``out`` take on this instance."""
        if not out.chunks:
            return 0.0
        return quantum * self.step_time(self.summarize(out, quantum))

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` of KV between this instance and the global pool."""
        if nbytes <= 0:
            return 0.0
        return self.constants.pool_latency_s + nbytes / (self.constants.pool_bandwidth * self.instance.gpus)

    def idle_time(self) -> float:
        """Seconds a step that scheduled nothing takes: one scheduler tick (never host wall time)."""
        return max(self.constants.step_overhead_s, 1e-6)

    def draft_time(self, requests: int) -> float:
        """Seconds of drafting charged to a step in which ``requests`` requests drafted."""
        return self.constants.draft_s_per_request * requests

    def kv_bytes(self, tokens: float) -> float:
        """Bytes of one replica of ``tokens`` tokens of KV (what the pool stores)."""
        return tokens * self.instance.model.kv_bytes_per_token

    def describe(self) -> dict:
        inst = self.instance
        return {"accelerator": inst.accelerator.name, "model": inst.model.name, "gpus_per_instance": inst.gpus,
                "kv_capacity_tokens": inst.kv_capacity_tokens, "kv_bytes_per_token": inst.model.kv_bytes_per_token,
                "constants": self.constants.to_dict()}
