"""A simulated engine instance: the engine's own scheduler and block manager, priced by a cost model.

Why this shape: ``ScheduledInstance`` already holds everything an instance decides (admission, chunking,
preemption, pausing, resident KV, pool moves). A simulated instance only replaces the model: ``execute`` emits
the recorded tokens (forced-token replay, so every policy produces the same responses) and returns the cost
model's price of the ``SchedulerOutput`` as the step's duration. Build one from any ``Scheduler`` and
``CostModel`` (``SimInstance(iid, scheduler, cost)``), so the same scheduler configuration can be paired with a
real engine instance on the same trace and their decisions compared step by step.

Token quantum ``q``: at cluster scale (a billion tokens per rollout) stepping the scheduler per real token is too
slow for Python, so a simulated token may stand for ``q`` real ones: lengths, prompts and chunks are divided by
``q``, a KV block holds ``block_size`` real tokens (``block_size / q`` simulated, at least one), and a simulated
step stands for ``q`` real steps (``CostModel.summarize``). Decisions then happen at q-token granularity; at
``q = 1`` the simulator is step-exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from seer.engine.block_manager import BlockManager
from seer.engine.config import EngineConfig, verl_rollout_engine
from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.rollout.instances.base import ChunkStart, StepReport
from seer.rollout.instances.scheduled import ScheduledInstance
from seer.sim.cost_model import CostModel, StepSummary
from seer.sim.pool import SimKVPool

_ONE_LOGPROB = [0.0]


def sim_block_size(block_size: int, quantum: int) -> int:
    """Block size in simulated tokens: ``block_size / quantum`` (must divide), or 1 block per simulated token."""
    if block_size < 1 or quantum < 1:
        raise ValueError(f"block_size and quantum must be >= 1, got {block_size}, {quantum}")
    if quantum >= block_size:
        return 1
    if block_size % quantum:
        raise ValueError(f"token quantum {quantum} must divide the block size {block_size} (or exceed it)")
    return block_size // quantum


def simulated_engine(engine: EngineConfig, kv_capacity_tokens: int, quantum: int) -> EngineConfig:
    """``engine`` in simulated tokens: blocks of ``sim_block_size``, as many as ``kv_capacity_tokens`` real tokens
    fill."""
    block = sim_block_size(engine.block_size, quantum)
    blocks = kv_capacity_tokens // (block * quantum)
    if blocks < 1:
        raise ValueError(f"instance KV capacity {kv_capacity_tokens} tokens holds no block")
    return replace(engine, block_size=block, num_kv_blocks=blocks)


@dataclass
class Timeline:
    """Per step of one instance: start time, duration, running requests, fraction of KV blocks in use."""

    start: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    kv_frac: list[float] = field(default_factory=list)

    def add(self, start: float, duration: float, running: int, kv_frac: float) -> None:
        self.start.append(start)
        self.duration.append(duration)
        self.running.append(running)
        self.kv_frac.append(kv_frac)


class SimInstance(ScheduledInstance):
    def __init__(self, instance_id: int, scheduler: Scheduler, cost: CostModel, *, quantum: int = 1,
                 pool: SimKVPool | None = None, speculator: Any = None,
                 record: bool = True, check: bool = False,
                 price_drafts: bool = True, eos_token_ids: tuple[int, ...] = ()) -> None:
        """``speculator``: the engine's ``seer.engine.speculator.Speculator`` (drafts from the draft server,
        verified here against the recorded tokens) or a ``ModelSpeculator`` (fitted acceptance); shared by all
        instances of a run. ``price_drafts``: the engine speculator's adaptive policy sees the cost model's
        ``T(B, n)`` at this step's batch and contexts; False keeps the verify profile it was built with, as an
        engine instance's does (a replay of a measured run). ``eos_token_ids``: the replayed model's, so a recorded
        token that is one ends its response here as it did on the engine."""
        super().__init__(instance_id, scheduler, eos_token_ids, speculator)
        if quantum < 1:
            raise ValueError(f"token quantum must be >= 1, got {quantum}")
        self.cost = cost
        self.quantum = quantum
        self.pool = pool if pool is not None else SimKVPool()
        self.clock: Callable[[], float] | None = None  # the virtual now, once a virtual-time loop runs this
        self.check = check
        self.timeline = Timeline() if record else None
        self._local_now = 0.0
        self._model_accept = getattr(speculator, "accepted", None)   # ModelSpeculator: no tokens to compare
        self._policy = getattr(speculator, "policy", None) if price_drafts else None  # engine Speculator's

    @classmethod
    def build(cls, instance_id: int, cost: CostModel, *, max_model_len: int, quantum: int = 1,
              engine: EngineConfig | None = None, **kwargs: object) -> "SimInstance":
        """An instance of ``engine`` (veRL's vLLM settings by default) whose KV capacity comes from the cost
        model's instance profile (in real tokens)."""
        engine = simulated_engine(engine or verl_rollout_engine(), cost.instance.kv_capacity_tokens, quantum)
        scheduler = Scheduler(engine.scheduler_config(max_model_len),
                              BlockManager(engine.num_kv_blocks or 0, engine.block_size, engine.enable_prefix_caching))
        return cls(instance_id, scheduler, cost, quantum=quantum, **kwargs)  # type: ignore[arg-type]

    def join_virtual_time(self, clock: Callable[[], float]) -> None:
        super().join_virtual_time(clock)
        self.clock = clock

    # ------------------------------------------------------------------ Instance
    def start(self, chunk: ChunkStart) -> None:
        if chunk.spec.forced_token_ids is None:
            raise ValueError(f"request {chunk.spec.request_id}: a simulated instance replays recorded tokens; "
                             f"give every response forced_token_ids")
        super().start(chunk)

    def step(self) -> StepReport:
        start = self.clock() if self.clock is not None else self._local_now
        if self._policy is not None:
            self._price_verify_row()
        rep = super().step()
        self._local_now = start + rep.duration_s
        if self.timeline is not None:
            bm = self.scheduler.block_manager
            used = 1.0 - bm.num_free_blocks / bm.num_blocks
            self.timeline.add(start, rep.duration_s, len(self.scheduler.running), used)
        if self.check:
            self.check_integrity()
        return rep

    def idle_duration(self, elapsed_s: float) -> float:
        """A step that scheduled nothing costs one scheduler tick of virtual time (never host wall time)."""
        return self.cost.idle_time()

    def draft_cost(self, elapsed_s: float, drafted: int) -> float:
        return self.cost.draft_time(drafted)

    def kv_cost(self, elapsed_s: float, nbytes: int) -> float:
        return self.cost.transfer_time(nbytes)

    # ------------------------------------------------------------------ ScheduledInstance hooks
    def _price_verify_row(self) -> None:
        """Give the engine's adaptive policy ``T(B, n)`` for this instance's decoding batch at its contexts."""
        from seer.spec.policy import VerifyCostModel

        ready = [r for r in self.scheduler.running if r.num_computed_tokens == r.num_tokens - 1]
        if not ready:
            return
        seqs = len(ready)
        ctx = self.quantum * sum(r.num_computed_tokens + 0.5 for r in ready)
        assert self.speculator is not None and self._policy is not None  # step() calls this only then
        gmax = self.speculator.config.gamma_max
        row = [self.cost.step_time(StepSummary(seqs, seqs * n, ctx, ctx * n)) for n in range(1, gmax + 2)]
        self._policy.cost = VerifyCostModel([seqs], list(range(1, gmax + 2)), [row])

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, StepResult], float]:
        results: dict[str, StepResult] = {}
        reqs = self.scheduler.requests
        spec = self.speculator
        for c in out.chunks:
            if not c.samples:
                continue
            req = reqs[c.request_id]
            pos = len(req.output_token_ids)
            if spec is None:  # hot path: one recorded token, a shared (never mutated) logprob list
                results[c.request_id] = StepResult([req.forced_token_ids[pos]], _ONE_LOGPROB)  # type: ignore[index]
                continue
            a = self._accepted(req, c.num_spec_tokens) if c.num_spec_tokens else 0
            toks = req.forced_token_ids[pos:pos + a + 1]  # type: ignore[index]
            results[c.request_id] = StepResult(toks, [0.0] * len(toks), a)
        return results, self.cost.price(out, self.quantum)

    def _accepted(self, req: Request, num_spec: int) -> int:
        """Drafts accepted: the acceptance model's draw, or greedy verification against the recording (a draft
        token is accepted iff it equals the recorded token at its position, so none past the recording's end, as
        the engine verifies; linear drafts)."""
        if self._model_accept is not None:
            return self._model_accept(req, num_spec)
        if req.spec_parents is not None:
            raise ValueError("the simulator verifies linear drafts only (k_branches = 1)")
        forced = req.forced_token_ids or []
        pos = req.num_output_tokens
        drafts = req.spec_token_ids[:num_spec]
        a = 0
        while a < len(drafts) and pos + a < len(forced) and drafts[a] == forced[pos + a]:
            a += 1
        return a

    def save_kv(self, req: Request) -> int:
        tokens = req.num_computed_tokens
        nbytes = int(self.cost.kv_bytes(tokens * self.quantum))
        self.pool.put(int(req.request_id), tokens, nbytes)
        return nbytes

    def load_kv(self, req: Request, request_id: int) -> tuple[int, str]:
        tokens = self.pool.pop(request_id)
        if tokens <= 0:
            return 0, "pool_miss"
        nbytes = int(self.cost.kv_bytes(max(0, tokens - req.num_computed_tokens) * self.quantum))
        self.pool.record_get(nbytes)
        self.counters["kv_bytes_loaded"] += nbytes
        return tokens, ""

    def discard_kv(self, request_id: int) -> None:
        self.pool.pop(request_id)

    # ------------------------------------------------------------------ checks
    def check_integrity(self) -> None:
        """The scheduler and block manager are consistent and KV use never exceeds the instance's capacity."""
        super().check_integrity()
        bm = self.scheduler.block_manager
        assert 0 <= bm.num_free_blocks <= bm.num_blocks, "KV blocks in use exceed the instance's capacity"
        held = {b for r in self.scheduler.requests.values() for b in r.block_ids}
        assert len(held) <= bm.num_blocks - bm.num_free_blocks, "requests hold blocks the manager counts as free"
        self.pool.check_integrity()
        for obj in (self.speculator, getattr(self.speculator, "server", None),
                    getattr(self.speculator, "policy", None)):
            check = getattr(obj, "check_integrity", None)
            if check is not None:
                check()
