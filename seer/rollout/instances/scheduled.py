"""An instance built on the engine's ``Scheduler``: the shared half of the real and the simulated instance.

Turning chunk starts into scheduler requests, pausing at chunk ends, resident KV, eviction to the pool and
chunk-end events are identical for the real engine and the simulator; only ``execute`` (run or price a
``SchedulerOutput``), the KV byte movers and the prices of drafting and KV movement differ. Keeping this in one
torch-free class is what makes the simulator's scheduling decisions the engine's. Request ids are the buffer's
ints; the scheduler sees ``str``.

Every cost is on the instance's clock. A step's duration is its compute (the forward, or on a wall clock the
whole schedule/forward/update), plus the drafting done before and after it, plus the KV moved to or from the
global pool since the previous step (an eviction asked for by the driver, an import at a chunk's start). KV
time is charged to the instance that moves the bytes, serially, at its next step; an instance left with only
such a charge runs a step for it, so no transfer goes unpaid. ``StepReport`` carries the split.

An import that cannot use the pool's KV (a miss, KV of other weights, no free blocks) recomputes the context;
the tokens are counted as re-prefill with the reason, never silently.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.engine.speculator import Speculator
from seer.engine.step import run_step
from seer.rollout.instances.base import ChunkEvent, ChunkStart, Instance, StepReport
from seer.rollout.types import InstanceState, KVSource


class StepPricer(Protocol):
    """Prices a step's compute, a KV transfer, a step's drafting and a step that scheduled nothing
    (``seer.sim.cost_model.CostModel``)."""

    def price(self, out: SchedulerOutput, quantum: int = 1) -> float: ...

    def transfer_time(self, nbytes: float) -> float: ...

    def draft_time(self, requests: int) -> float: ...

    def idle_time(self) -> float: ...


class ScheduledInstance(Instance):
    def __init__(self, instance_id: int, scheduler: Scheduler, eos_token_ids: tuple[int, ...] = (),
                 speculator: Speculator | None = None) -> None:
        self.instance_id = instance_id
        self.scheduler = scheduler
        self.speculator = speculator
        self.eos_token_ids = eos_token_ids
        self.chunk_base: dict[str, int] = {}   # output tokens at the start of the current chunk
        self._pending_kv_s = 0.0                 # KV moved since the last step, charged to the next one
        self._defer = False                      # virtual time: a step's outcome shows at its end
        self._hidden = (0, 0)                    # (KV blocks freed, requests ended) by the step in flight
        self._version = 0                        # bumped by every method that changes what state() reports
        self._state_at: tuple[int, ...] = ()     # ... and the (version, counts) its cached numbers were read at
        self._state_free = self._state_running = 0
        self.begin_rollout()

    def begin_rollout(self) -> None:
        """Counters restart: an engine, and a remote instance, outlive rollouts, and stats are per rollout."""
        self._version += 1
        self.counters = {"kv_bytes_loaded": 0, "kv_bytes_saved": 0, "chunks": 0}
        self._base = dataclasses.replace(self.scheduler.stats)
        self._preempt_seen = self.scheduler.stats.preemptions
        self._base_reasons = Counter(self.scheduler.reprefill_reasons)

    # ------------------------------------------------------------------ hooks for subclasses
    @abc.abstractmethod
    def execute(self, out: SchedulerOutput) -> tuple[dict[str, StepResult], float | None]:
        """Run (or price) one step; returns the results and the step's compute price in seconds, or None to
        charge the measured wall time of scheduling, running and updating the step."""

    @abc.abstractmethod
    def save_kv(self, req: Request) -> int:
        """Write a request's computed KV to the global pool; returns bytes written."""

    @abc.abstractmethod
    def load_kv(self, req: Request, request_id: int) -> tuple[int, str]:
        """Read a request's KV from the pool into its (already allocated) blocks from position
        ``req.num_computed_tokens`` on (the positions before it are a prompt prefix this instance has cached and
        its siblings read: they are neither moved nor written) and add the bytes read to the counters. Returns
        the tokens covered and, when that is 0 (the request then recomputes), the reason: ``pool_miss`` or
        ``weight_version``."""

    @abc.abstractmethod
    def discard_kv(self, request_id: int) -> None:
        """Drop a request's pool entry that will not be used (it recomputes here instead)."""

    def idle_duration(self, elapsed_s: float) -> float:
        """Duration of a step that scheduled nothing: the wall time it took (a simulator charges a fixed tick)."""
        return elapsed_s

    def draft_cost(self, elapsed_s: float, drafted: int) -> float:
        """Price of one step's drafting for ``drafted`` requests: its wall time (a cost model prices it)."""
        return elapsed_s

    def kv_cost(self, elapsed_s: float, nbytes: int) -> float:
        """Price of moving ``nbytes`` of KV to or from the pool: its wall time (a cost model prices it)."""
        return elapsed_s

    def charge_kv(self, elapsed_s: float, nbytes: int) -> None:
        """Charge a KV transfer to this instance's next step."""
        self._pending_kv_s += self.kv_cost(elapsed_s, nbytes)

    # ------------------------------------------------------------------ Instance
    def state(self) -> InstanceState:
        """Free KV blocks (less what waiting requests will take and what the step in flight freed but has not
        yet shown) and requests held. Cached between changes: a dispatch round asks every instance, and in a
        large simulation most have not changed since the last round. The cache key adds the scheduler's counts
        to this instance's version, so a change made around its methods is seen too."""
        sched = self.scheduler
        bm = sched.block_manager
        at = self._state_key()
        if at != self._state_at:
            self._state_free, self._state_running = self._count_state()
            self._state_at = at
        return InstanceState(self.instance_id, self._state_free, bm.block_size, running=self._state_running,
                             max_running=sched.config.max_num_seqs, total_blocks=bm.num_blocks)

    def _state_key(self) -> tuple[int, ...]:
        sched = self.scheduler
        return self._version, len(sched.waiting), len(sched.running), sched.block_manager.num_free_blocks

    def kv_balance(self) -> int:
        """Free blocks less those promised (``state``'s count before it stops at 0): negative where waiting chunks
        and next tokens were promised more than is free. A view that adds the blocks an eviction frees (a remote
        proxy) must start from this, or it offers blocks that are already owed."""
        sched = self.scheduler
        return sched.block_manager.num_free_blocks - self._hidden[0] - sched.pending_blocks()

    def _count_state(self) -> tuple[int, int]:
        """(free blocks, requests held) as ``state`` reports them, counted afresh."""
        sched = self.scheduler
        return max(0, self.kv_balance()), len(sched.running) + len(sched.waiting) + self._hidden[1]

    def check_integrity(self) -> None:
        """The scheduler is consistent, and a cached ``state`` still current equals a fresh count."""
        self.scheduler.check_integrity()
        if self._state_at == self._state_key():
            assert (self._state_free, self._state_running) == self._count_state(), "stale cached instance state"

    def _new_request(self, chunk: ChunkStart) -> Request:
        spec = chunk.spec
        req = Request(str(spec.request_id), list(spec.prompt_token_ids), spec.params, self.eos_token_ids,
                      group_id=str(spec.group_id),
                      forced_token_ids=None if spec.forced_token_ids is None else list(spec.forced_token_ids),
                      stop_after=spec.stop_after)
        req.output_token_ids = list(chunk.output_token_ids)
        req.output_logprobs = [0.0] * len(chunk.output_token_ids)
        req.probe = spec.index == 0
        return req

    def start(self, chunk: ChunkStart) -> None:
        self._version += 1
        rid = str(chunk.spec.request_id)
        ahead = chunk.reserve_tokens
        generated = len(chunk.output_token_ids)
        reserve = 0 if ahead is None else len(chunk.spec.prompt_token_ids) + generated + ahead
        if chunk.kv_source is KVSource.LOCAL:
            req = self.scheduler.resume(rid, chunk.chunk_end, reserve)
        else:
            req = self._new_request(chunk)
            req.chunk_end, req.reserve_tokens = chunk.chunk_end, reserve
            if chunk.kv_source is KVSource.POOL:
                self._import(req, chunk.spec.request_id)
            self.scheduler.add_request(req)
        req.pause_when_full = ahead is not None and generated + ahead < chunk.chunk_end
        req.remaining_hint, req.critical = chunk.remaining_hint, chunk.critical
        self.chunk_base[rid] = req.num_output_tokens
        self.counters["chunks"] += 1
        if self.speculator is not None and chunk.kv_source is not KVSource.LOCAL:
            self.speculator.track(req)

    def _import(self, req: Request, request_id: int) -> None:
        bm = self.scheduler.block_manager
        tokens = req.num_tokens - 1
        cached = bm.allocate_cached_prefix(req)  # its prompt's blocks, where this instance still holds them
        if not bm.allocate(req, tokens - cached):
            bm.detach_cached_prefix(req)
            self.discard_kv(request_id)
            self._fall_back(req, tokens, "no_free_blocks")
            return
        loaded, t0 = self.counters["kv_bytes_loaded"], time.perf_counter()
        covered, reason = self.load_kv(req, request_id)
        self.charge_kv(time.perf_counter() - t0, self.counters["kv_bytes_loaded"] - loaded)
        if covered <= 0:
            bm.detach_cached_prefix(req)
            self._fall_back(req, tokens, reason)
            return
        req.num_computed_tokens = max(covered, cached)
        bm.cache_full_blocks(req)

    @staticmethod
    def _fall_back(req: Request, tokens: int, reason: str) -> None:
        """The request recomputes ``tokens`` of context it had: the scheduler counts them as re-prefill (less
        any prompt prefix still cached here) under ``reason``."""
        req.max_computed_tokens = max(req.max_computed_tokens, tokens)
        req.reprefill_reason = reason

    def join_virtual_time(self, clock: Callable[[], float]) -> None:
        self._defer = True
        if isinstance(self.speculator, Speculator):
            self.speculator.hold = True

    def step_ended(self) -> None:
        self._version += 1
        self._hidden = (0, 0)
        if isinstance(self.speculator, Speculator):
            self.speculator.publish()

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished or self._pending_kv_s > 0

    def step(self) -> StepReport:
        self._version += 1
        st = run_step(self.scheduler, self.execute, self.speculator)
        if self._defer:
            self._hidden = (st.freed_blocks, len(st.finished))
        out, busy = st.out, self.scheduler.has_unfinished
        if out.is_empty:
            compute = self.idle_duration(st.compute_wall_s) if busy else 0.0
        else:
            compute = st.compute_wall_s if st.price_s is None else st.price_s
        draft = self.draft_cost(st.draft_wall_s, st.drafted) if self.speculator is not None else 0.0
        kv, self._pending_kv_s = self._pending_kv_s, 0.0
        preempt = self.scheduler.stats.preemptions - self._preempt_seen
        self._preempt_seen = self.scheduler.stats.preemptions
        trace = tuple((c.request_id, c.start, c.num_new_tokens, c.num_spec_tokens, c.shared_tokens) for c in out.chunks)
        new = [(int(rid), r.output_token_ids[st.tokens_before[rid]:]) for rid, r in st.scheduled.items()
               if r.num_output_tokens > st.tokens_before[rid]]
        return StepReport(compute + draft + kv, [self._event(r) for r in st.finished], out.num_batched_tokens,
                          len(self.scheduler.running), preempt, stalled=out.is_empty and busy, trace=trace,
                          new_tokens=new, draft_s=draft, kv_s=kv)

    def _event(self, req: Request) -> ChunkEvent:
        base = self.chunk_base.pop(req.request_id, 0)
        finished = req.is_finished
        return ChunkEvent(int(req.request_id), req.output_token_ids[base:], req.output_logprobs[base:], finished,
                          req.finish_reason, 0 if finished else req.num_computed_tokens)

    def resident(self) -> list[int]:
        return [int(rid) for rid in self.scheduler.paused]

    def resident_blocks(self, request_id: int) -> int:
        return len(self.scheduler.paused[str(request_id)].block_ids)

    def evict(self, request_id: int) -> int:
        req = self.scheduler.paused[str(request_id)]
        t0 = time.perf_counter()
        nbytes = self.save_kv(req)
        self.charge_kv(time.perf_counter() - t0, nbytes)
        self.counters["kv_bytes_saved"] += nbytes
        self.release(request_id)
        return nbytes

    def release(self, request_id: int) -> None:
        self._version += 1
        self.scheduler.abort(str(request_id))
        if self.speculator is not None:
            self.speculator.forget(str(request_id))

    def stats(self) -> dict:
        s, b = self.scheduler.stats, self._base
        delta = {f.name: getattr(s, f.name) - getattr(b, f.name) for f in dataclasses.fields(s)}
        return dict(self.counters, reprefill_reasons=self.reprefill_reasons(),
                    **{k: delta[k] for k in ("preemptions", "reprefill_tokens", "prompt_tokens_computed",
                                             "output_tokens", "spec_drafted", "spec_accepted", "spec_steps",
                                             "spec_bonus", "history_drafted", "history_accepted",
                                             "history_steps")})

    def reprefill_reasons(self) -> dict[str, int]:
        """Tokens this instance recomputed in this rollout, by reason (failed imports, preemption)."""
        return dict(self.scheduler.reprefill_reasons - self._base_reasons)
