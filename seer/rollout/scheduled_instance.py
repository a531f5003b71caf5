"""An instance built on the engine's ``Scheduler``: the shared half of the real and the simulated instance.

Turning chunk starts into scheduler requests, pausing at chunk ends, resident KV, eviction to the pool and
chunk-end events are identical for the real engine and the simulator; only ``execute`` (run or price a
``SchedulerOutput``) and the KV byte movers differ. Keeping this in one torch-free class is what makes the
simulator's scheduling decisions the engine's. Request ids are the buffer's ints; the scheduler sees ``str``.
"""

from __future__ import annotations

import abc
import dataclasses
import time

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from seer.engine.speculator import Speculator
from seer.rollout.instance import ChunkEvent, ChunkStart, Instance, StepReport
from seer.rollout.types import InstanceState, KVSource


class ScheduledInstance(Instance):
    def __init__(self, instance_id: int, scheduler: Scheduler, eos_token_ids: tuple[int, ...] = (),
                 speculator: Speculator | None = None) -> None:
        self.instance_id = instance_id
        self.scheduler = scheduler
        self.speculator = speculator
        self.eos_token_ids = eos_token_ids
        self.chunk_base: dict[str, int] = {}   # output tokens at the start of the current chunk
        self.counters = {"kv_bytes_loaded": 0, "kv_bytes_saved": 0, "chunks": 0}
        self._base = dataclasses.replace(scheduler.stats)  # an engine outlives rollouts: report deltas
        self._preempt_seen = scheduler.stats.preemptions

    # ------------------------------------------------------------------ hooks for subclasses
    @abc.abstractmethod
    def execute(self, out: SchedulerOutput) -> tuple[dict[str, StepResult], float]:
        """Run (or price) one step; returns the results and the step's duration in seconds."""

    @abc.abstractmethod
    def save_kv(self, req: Request) -> int:
        """Write a request's computed KV to the global pool; returns bytes written."""

    @abc.abstractmethod
    def load_kv(self, req: Request, request_id: int) -> int:
        """Read a request's KV from the pool into its (already allocated) blocks; returns the tokens covered
        (0 if the pool lost it: the request then recomputes) and adds the bytes read to the counters."""

    def idle_duration(self, elapsed_s: float) -> float:
        """Duration of a step that scheduled nothing: the wall time it took (a simulator charges a fixed tick)."""
        return elapsed_s

    # ------------------------------------------------------------------ Instance
    def state(self) -> InstanceState:
        bm = self.scheduler.block_manager
        pending = 0
        for req in self.scheduler.waiting:
            want = max(req.reserve_tokens, req.num_tokens)
            pending += max(0, bm.blocks_needed(want) - len(req.block_ids))
        return InstanceState(self.instance_id, max(0, bm.num_free_blocks - pending), bm.block_size,
                             running=len(self.scheduler.running) + len(self.scheduler.waiting),
                             max_running=self.scheduler.config.max_num_seqs, total_blocks=bm.num_blocks)

    def _new_request(self, chunk: ChunkStart) -> Request:
        spec = chunk.spec
        req = Request(str(spec.request_id), list(spec.prompt_token_ids), spec.params, self.eos_token_ids,
                      group_id=str(spec.group_id),
                      forced_token_ids=None if spec.forced_token_ids is None else list(spec.forced_token_ids))
        req.output_token_ids = list(chunk.output_token_ids)
        req.output_logprobs = [0.0] * len(chunk.output_token_ids)
        req.probe = spec.index == 0
        return req

    def start(self, chunk: ChunkStart) -> None:
        rid = str(chunk.spec.request_id)
        reserve = (len(chunk.spec.prompt_token_ids) + chunk.chunk_end) if chunk.reserve else 0
        if chunk.kv_source is KVSource.LOCAL:
            req = self.scheduler.resume(rid, chunk.chunk_end, reserve)
        else:
            req = self._new_request(chunk)
            req.chunk_end, req.reserve_tokens = chunk.chunk_end, reserve
            if chunk.kv_source is KVSource.POOL:
                self._import(req, chunk.spec.request_id)
            self.scheduler.add_request(req)
        req.remaining_hint = chunk.remaining_hint
        self.chunk_base[rid] = req.num_output_tokens
        self.counters["chunks"] += 1
        if self.speculator is not None and chunk.kv_source is not KVSource.LOCAL:
            self.speculator.track(req)

    def _import(self, req: Request, request_id: int) -> None:
        bm = self.scheduler.block_manager
        tokens = req.num_tokens - 1
        if not bm.allocate(req, tokens):
            return  # no room now: recompute instead (the scheduler admits it when blocks free up)
        covered = self.load_kv(req, request_id)
        if covered <= 0:
            bm.free(req)
            return
        req.num_computed_tokens = covered
        bm.cache_full_blocks(req)

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> StepReport:
        if self.speculator is not None:
            self.speculator.before_schedule(self.scheduler)
        out = self.scheduler.schedule()
        reqs = {c.request_id: self.scheduler.requests[c.request_id] for c in out.chunks}
        before = {rid: r.num_output_tokens for rid, r in reqs.items()}
        t0 = time.perf_counter()
        results, duration = self.execute(out) if not out.is_empty else ({}, 0.0)
        stopped = self.scheduler.update_from_output(out, results)
        if self.speculator is not None:
            self.speculator.after_update(out, results, reqs)
        events = [self._event(r) for r in stopped]
        preempt = self.scheduler.stats.preemptions - self._preempt_seen
        self._preempt_seen = self.scheduler.stats.preemptions
        trace = tuple((c.request_id, c.start, c.num_new_tokens, c.num_spec_tokens) for c in out.chunks)
        if out.is_empty:
            duration = max(duration, self.idle_duration(time.perf_counter() - t0))
        new = [(int(rid), r.output_token_ids[before[rid]:]) for rid, r in reqs.items()
               if r.num_output_tokens > before[rid]]
        return StepReport(duration, events, out.num_batched_tokens, len(self.scheduler.running), preempt,
                          stalled=out.is_empty and self.scheduler.has_unfinished, trace=trace, new_tokens=new)

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
        nbytes = self.save_kv(req)
        self.counters["kv_bytes_saved"] += nbytes
        self.release(request_id)
        return nbytes

    def release(self, request_id: int) -> None:
        self.scheduler.abort(str(request_id))
        if self.speculator is not None:
            self.speculator.forget(str(request_id))

    def stats(self) -> dict:
        s, b = self.scheduler.stats, self._base
        delta = {f.name: getattr(s, f.name) - getattr(b, f.name) for f in dataclasses.fields(s)}
        draft_s = self.speculator.draft_s if self.speculator is not None else 0.0
        return dict(self.counters, draft_s=draft_s, **{k: delta[k] for k in (
            "preemptions", "reprefill_tokens", "prompt_tokens_computed", "output_tokens", "spec_drafted",
            "spec_accepted", "spec_steps", "spec_bonus")})
