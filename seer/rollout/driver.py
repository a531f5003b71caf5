"""The rollout driver: turns groups into finished responses across instances.

One driver serves the real engine, the process and Ray backends and the simulator: instances report steps
(duration + chunk-end events), the driver feeds the events to the request buffer and dispatches the next chunks.
Who calls ``on_step`` is the backend's business: a discrete-event loop on virtual time for instances in this
process and the simulator (``virtual_time.py``, ``run``), or a loop over workers' reports on the wall clock.

Policies: ``verl`` pins groups to instances up front and lets each engine batch and preempt; the divided
policies run chunks of ``chunk_tokens``, reserve the KV of a chunk's first ``chunk_reserve_tokens`` at admission
(a chunk ends early where its instance's KV runs out: no preemption) and keep a paused request's KV resident
where it ran, moving it through the global KV pool only when its next chunk goes
elsewhere or its space is needed. Torch-free.

Serving: an optional ``RolloutListener`` hears every chunk's new tokens and every finished group as they happen
(so an HTTP server can stream), and ``abort`` (thread-safe) ends responses early; it takes effect at the next
event: buffered responses finish at once with reason ``abort`` and their resident KV is freed, running ones
when their current chunk returns.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable
from typing import Callable

from seer.rollout.dispatch import DispatchConfig, reserved_tokens
from seer.rollout.instances.base import (
    ChunkEvent,
    ChunkStart,
    Instance,
    InstanceLost,
    RequestSpec,
    StepReport,
)
from seer.rollout.metrics import ResponseRecord, compute_metrics
from seer.rollout.orderings import OrderingConfig
from seer.rollout.policies import RolloutPolicy, instance_of_group
from seer.rollout.request_buffer import RequestBuffer
from seer.rollout.types import (
    FINISH_ABORT,
    Assignment,
    DriverCounters,
    FaultPlan,
    GroupInput,
    InstanceState,
    KVSource,
    RequestState,
    ResponseResult,
    RolloutListener,
    RolloutRequest,
    RolloutResult,
    RolloutStalled,
    chunk_blocks_needed,
)
from seer.sampling_params import mix_seed


class RolloutDriver:
    def __init__(self, policy: RolloutPolicy, instances: list[Instance], groups: list[GroupInput],
                 chunk_tokens: int = 128, ordering_config: OrderingConfig | None = None,
                 on_progress: Callable[["RolloutDriver"], None] | None = None,
                 fault: FaultPlan | None = None, draft_server=None,
                 listener: RolloutListener | None = None, affinity_spread: int | None = None,
                 critical_speedup: Callable[[float], float] | None = None, critical_companions: int = 0,
                 seed: int | None = None, chunk_reserve_tokens: int | None = None) -> None:
        """``seed``: responses sampled without a seed get one derived from it, their group and their index, so a
        response draws the same random numbers on whichever instance its chunks run and no two responses (on
        one instance or several) share a stream."""
        if not instances:
            raise ValueError("a rollout needs at least one instance")
        if not groups:
            raise ValueError("a rollout needs at least one group")
        if policy.critical and critical_speedup is None:
            raise ValueError(f"policy {policy.name!r}: critical-path placement needs the instances' batch speedup")
        if policy.needs_true_lengths and any(g.true_lengths is None for g in groups):
            raise ValueError(f"policy {policy.name!r} needs the true response lengths of a replayed trace")
        self.policy = policy
        if policy.rank is not None:
            ordering_config = dataclasses.replace(ordering_config or OrderingConfig(), rank=policy.rank)
        self.instances = {inst.instance_id: inst for inst in instances}
        self.alive = set(self.instances)
        self.buffer = RequestBuffer(policy.ordering, chunk_tokens=chunk_tokens if policy.divided else None,
                                    dispatch=DispatchConfig(affinity_spread=affinity_spread,
                                                            critical_speedup=critical_speedup,
                                                            critical_companions=critical_companions,
                                                            reserve_tokens=chunk_reserve_tokens),
                                    ordering_config=ordering_config)
        self.specs: dict[int, RequestSpec] = {}
        self.results: dict[int, ResponseResult] = {}
        for g in groups:
            group = self.buffer.add_group(len(g.prompt_token_ids), g.size, g.params.max_tokens,
                                          prompt_token_ids=g.prompt_token_ids, true_lengths=g.true_lengths)
            for req in group.requests:
                forced = None if g.forced is None else g.forced[req.index]
                params = g.response_params(req.index)
                if params.seed is None and seed is not None:
                    params = dataclasses.replace(params, seed=mix_seed("request", seed, group.group_id, req.index))
                self.specs[req.request_id] = RequestSpec(req.request_id, group.group_id, req.index,
                                                         g.prompt_token_ids, params, forced, g.key,
                                                         g.stop_after(req.index))
                self.results[req.request_id] = ResponseResult(req.request_id, group.group_id, req.index)
        self.on_progress = on_progress
        self.fault = fault
        self.draft_server = draft_server  # shared grouped-drafting service: a finished group's index is freed
        self.now = 0.0
        self.busy: dict[int, list[tuple[float, float]]] = {i: [] for i in self.instances}
        self.step_costs: dict[int, list[tuple[float, float]]] = {i: [] for i in self.instances}  # (draft, kv)
        self.decisions: dict[int, list[tuple]] = {i: [] for i in self.instances}
        self.counters = DriverCounters()
        self._progress_at = 0.0
        self.listener = listener
        # called before each step on virtual time: where rollouts in threads take turns (turns.py); None: none
        self.pace: Callable[[], None] | None = None
        self.aborted: set[int] = set()                  # request ids finished by abort
        self._aborting: set[int] = set()                # running: finish as aborted when their chunk returns
        self._abort_lock = threading.Lock()
        self._abort_pending: list[tuple[int, tuple[int, ...] | None]] = []
        if listener is not None:
            listener.on_start(self)

    # ------------------------------------------------------------------ aborts
    def abort(self, group_id: int, indices: Iterable[int] | None = None) -> None:
        """End responses of a group early (all of them by default), with finish reason ``abort``.

        Thread-safe; applied at the driver's next event: a buffered response finishes at once and its resident
        KV is released, a running one when its current chunk returns (its KV is released then). Aborting a
        finished response or an unknown group does nothing.
        """
        with self._abort_lock:
            self._abort_pending.append((group_id, None if indices is None else tuple(indices)))

    def _apply_aborts(self) -> bool:
        """Apply pending aborts; returns whether a buffered response finished (its KV was freed)."""
        with self._abort_lock:
            pending, self._abort_pending = self._abort_pending, []
        freed = False
        for gid, indices in pending:
            group = self.buffer.groups.get(gid)
            if group is None:
                continue
            for req in group.requests:
                if indices is not None and req.index not in indices:
                    continue
                if req.state is RequestState.RUNNING:
                    self._aborting.add(req.request_id)
                elif req.state is RequestState.BUFFERED:
                    holder = req.kv_instance
                    self.buffer.abort(req.request_id)
                    if holder is not None and holder in self.alive:
                        self.instances[holder].release(req.request_id)
                    self.aborted.add(req.request_id)
                    self._report(req, [], [])
                    freed = True
        return freed

    def _report(self, req: RolloutRequest, new_token_ids: list[int], new_logprobs: list[float]) -> None:
        """Tell the listener about a chunk's tokens; record a finished response and a finished group."""
        if req.finished:
            res = self.results[req.request_id]
            res.finish_reason = req.finish_reason
            res.finish_time_s = self.now
        if self.listener is not None:
            self.listener.on_tokens(req.group_id, req.index, new_token_ids, new_logprobs, req.finished,
                                    req.finish_reason)
        if not req.finished or not self.buffer.groups[req.group_id].done:
            return
        if self.draft_server is not None and self.draft_server.has_group(str(req.group_id)):
            self.draft_server.finish_group(str(req.group_id))
        if self.listener is not None:
            self.listener.on_group_done(req.group_id)

    # ------------------------------------------------------------------ dispatch
    def _launch(self, a: Assignment) -> None:
        req = a.request
        rid = req.request_id
        if a.kv_source is KVSource.POOL and req.kv_instance is not None and req.kv_instance != a.instance_id:
            if not self._evict(req.kv_instance, rid):  # its KV died with its instance: back to the buffer
                self.buffer.on_chunk_done(rid, 0, kv_instance=None, kv_in_pool=False)
                return
        res = self.results[rid]
        res.instance_history.append(a.instance_id)
        hint = self.buffer.ordering.remaining_hint(req, self.buffer.groups[req.group_id])
        critical = self.buffer.critical is not None and self.buffer.critical.instance_of.get(rid) == a.instance_id
        reserve = (a.max_new_tokens if a.reserve_tokens is None else a.reserve_tokens) if self.policy.divided else None
        chunk = ChunkStart(a, self.specs[rid], tuple(res.token_ids), req.generated + a.max_new_tokens,
                           reserve_tokens=reserve, remaining_hint=hint, critical=critical)
        try:
            self.instances[a.instance_id].start(chunk)
        except InstanceLost:
            self._kill(a.instance_id)  # the request, running there, returns to the buffer with the rest

    def _dispatch(self) -> None:
        if not self.policy.divided:
            return
        states = self._clear_reserved()
        while self.buffer.num_buffered:  # with nothing buffered, select and _make_room have nothing to place
            placed = self.buffer.select(states if states is not None else self._states())
            for a in placed:
                if a.instance_id in self.alive:  # an earlier launch of this round may have found it dead
                    self._launch(a)
            if not self._make_room():  # the next request in order fits nowhere: evict paused KV for it
                return
            states = None

    def _states(self) -> list[InstanceState]:
        return [self.instances[i].state() for i in sorted(self.alive)]

    def _clear_reserved(self) -> list[InstanceState] | None:
        """Critical-path placement: refresh the critical set and move other requests' paused KV off the
        instances reserved for it (requests still running there leave theirs when their chunk ends). Returns
        the live instances' states as they are after that, for the round's first placements (None without
        critical-path placement)."""
        if self.buffer.critical is None:
            return None
        states = self._states()
        self.buffer.update_critical(states)
        moved = False
        for iid, keep in list(self.buffer.critical.request_on.items()):
            for rid in self._evictable(iid):
                if rid != keep:
                    moved = True
                    if not self._evict(iid, rid):
                        break  # the instance is gone: the next round sees that
        return self._states() if moved else states

    def _make_room(self) -> bool:
        """Evict resident KV of waiting requests so the next request in order fits somewhere."""
        head = self.buffer.ordering.pop()
        if head is None:
            return False
        self.buffer.ordering.requeue(head, self.buffer.groups[head.group_id])
        chunk = head.chunk_max_tokens(self.buffer.chunk_tokens)
        critical = self.buffer.critical is not None and head.request_id in self.buffer.critical.instance_of
        chunk = reserved_tokens(chunk, self.buffer.dispatch.reserve_tokens, critical)
        best = None
        for iid in sorted(self.alive):
            victims = [r for r in self._evictable(iid) if r != head.request_id]
            if not victims or not self._may_host(iid, head.request_id):
                continue
            inst = self.instances[iid]
            st = inst.state()
            if not st.has_slot:
                continue
            need = chunk_blocks_needed(head, st, chunk)
            if st.free_blocks + sum(inst.resident_blocks(r) for r in victims) < need:
                continue
            if best is None or st.free_blocks > best[1]:
                best = (iid, st.free_blocks, need, victims)
        if best is None or best[1] >= best[2]:  # nowhere to make room, or room that select did not use
            return False
        iid, free, need, victims = best
        inst = self.instances[iid]
        for rid in victims:
            if free >= need:
                break
            free += inst.resident_blocks(rid)
            if not self._evict(iid, rid):
                break  # the instance is gone (now marked failed): the next dispatch round sees that
        return True

    def _may_host(self, iid: int, rid: int) -> bool:
        """Critical-path placement: a reserved instance hosts only its critical request, which runs nowhere
        else."""
        critical = self.buffer.critical
        if critical is None:
            return True
        own = critical.instance_of.get(rid)
        return own == iid if own is not None else critical.critical_on(iid) is None

    def _evictable(self, iid: int) -> list[int]:
        """Waiting requests whose KV sits on instance ``iid``. The buffer's record decides, not the instance's
        resident list alone: a remote instance's snapshot can predate an eviction and still list the request."""
        reqs = self.buffer.requests
        return [r for r in self.instances[iid].resident()
                if reqs[r].state is RequestState.BUFFERED and reqs[r].kv_instance == iid]

    def _evict(self, iid: int, rid: int) -> bool:
        """Move a paused request's KV from instance ``iid`` to the pool; False if that instance turned out
        to be dead (it is then handled as failed and the request will recompute)."""
        try:
            nbytes = self.instances[iid].evict(rid)
        except InstanceLost:
            self._kill(iid)
            return False
        self.counters.kv_bytes_moved += nbytes
        self.counters.evictions += 1
        req = self.buffer.requests[rid]
        req.kv_instance, req.kv_in_pool = None, True
        return True

    # ------------------------------------------------------------------ events
    def _apply(self, iid: int, ev: ChunkEvent) -> None:
        res = self.results[ev.request_id]
        res.token_ids += ev.new_token_ids
        res.logprobs += ev.new_logprobs
        self.counters.tokens += len(ev.new_token_ids)
        abort = ev.request_id in self._aborting and not ev.finished
        self._aborting.discard(ev.request_id)
        if abort:
            self.aborted.add(ev.request_id)
        req = self.buffer.on_chunk_done(ev.request_id, len(ev.new_token_ids), ev.finished or abort,
                                        FINISH_ABORT if abort else ev.finish_reason,
                                        kv_instance=None if ev.finished else iid, kv_in_pool=False,
                                        kv_tokens=ev.kv_tokens)
        if req.finished and not ev.finished:
            self.instances[iid].release(ev.request_id)  # max_tokens reached at a chunk boundary, or aborted
        self._report(req, ev.new_token_ids, ev.new_logprobs)

    def _record(self, iid: int, start: float, rep: StepReport) -> None:
        self.busy[iid].append((start, start + rep.duration_s))
        self.step_costs[iid].append((rep.draft_s, rep.kv_s))
        self.decisions[iid].append(rep.trace)
        if self.buffer.critical is not None and self.buffer.critical.companions:  # else the fit is never read
            self.buffer.critical.measured.add(rep.trace, rep.duration_s - rep.draft_s - rep.kv_s)
        self.counters.steps += 1
        self.counters.preemptions += rep.preemptions
        self.counters.emitted += sum(len(toks) for _, toks in rep.new_tokens)

    # ------------------------------------------------------------------ faults
    def _kill(self, iid: int) -> None:
        """An instance died: its running chunks return to the buffer (tokens of the lost chunk are redone)."""
        self.alive.discard(iid)
        if not self.alive:
            raise RolloutStalled("every instance has failed")
        for req in list(self.buffer.running_on(iid)):
            self.buffer.on_chunk_done(req.request_id, 0, kv_instance=None, kv_in_pool=False)
        for req in self.buffer.requests.values():
            if req.kv_instance == iid:
                req.kv_instance, req.kv_tokens = None, 0
        self.counters.failed_instances += 1

    # ------------------------------------------------------------------ main loop
    def begin(self) -> None:
        """Place the first chunks: veRL's static split, or the first dispatch round."""
        self._apply_aborts()
        if not self.policy.divided:
            split = instance_of_group(sorted(self.buffer.groups), len(self.instances))
            ids = sorted(self.instances)
            for a in self.buffer.select_pinned({g: ids[i] for g, i in split.items()}):
                self._launch(a)
        self._dispatch()

    def on_step(self, iid: int, start: float, rep: StepReport) -> None:
        """One instance step ended at ``self.now``: record it, apply its chunk ends, dispatch what follows."""
        self._record(iid, start, rep)
        freed = self._apply_aborts()
        for ev in rep.events:
            self._apply(iid, ev)
        if rep.events or freed:
            self._dispatch()
        if self.on_progress is not None and (rep.events or time.monotonic() - self._progress_at > 0.5):
            self._progress_at = time.monotonic()
            self.on_progress(self)

    def on_instance_lost(self, iid: int) -> None:
        self._kill(iid)
        for rid in [r for r in self._aborting if self.buffer.requests[r].state is RequestState.BUFFERED]:
            self._aborting.discard(rid)  # its chunk was lost with the instance: abort it as a buffered one
            req = self.buffer.requests[rid]
            self.abort(req.group_id, [req.index])
        self._apply_aborts()
        self._dispatch()

    @property
    def done(self) -> bool:
        return self.buffer.all_finished

    def run(self) -> RolloutResult:
        """Run to completion on virtual time (instances in this process, ``virtual_time.py``)."""
        from seer.rollout.virtual_time import run_virtual_time

        return run_virtual_time(self)

    def relieve(self, iid: int) -> bool:
        """An instance's step scheduled nothing though it has work (paused KV fills it): move one paused
        request's KV to the pool. Returns whether anything moved."""
        victims = self._evictable(iid)
        return bool(victims) and self._evict(iid, victims[0])

    def diagnose(self) -> str:
        """Why no instance can make progress: the message of ``RolloutStalled``."""
        b = self.buffer
        return (f"rollout stalled at t={self.now:.3f}s: {b.num_buffered} buffered, {b.num_running} running, "
                f"{b.num_finished}/{b.num_requests} finished, alive instances {sorted(self.alive)}; "
                f"a chunk fits on no instance (raise KV memory or lower chunk_tokens/max_tokens)")

    def result(self) -> RolloutResult:
        records = [ResponseRecord(r.finish_time_s or 0.0, len(r.token_ids), r.request_id, r.group_id)
                   for r in self.results.values()]
        instance_stats = {i: inst.stats() for i, inst in self.instances.items()}

        def summed(key: str) -> int:
            return sum(int(st.get(key, 0)) for st in instance_stats.values())

        ids = sorted(self.instances)
        metrics = compute_metrics(records, [self.busy[i] for i in ids],
                                  preemptions=self.counters.preemptions,
                                  reprefill_tokens=self.buffer.reprefill_tokens + summed("reprefill_tokens"),
                                  kv_bytes_moved=self.counters.kv_bytes_moved + summed("kv_bytes_loaded"),
                                  step_costs=[self.step_costs[i] for i in ids],
                                  reprefill_reasons=self._reprefill_reasons(instance_stats.values()),
                                  batches=[len(t) for i in ids for t in self.decisions[i] if t])
        critical = self.buffer.critical
        stats = dict(dataclasses.asdict(self.counters), aborted=len(self.aborted),
                     affinity_yields=self.buffer.affinity_yields,
                     critical_isolated=critical.isolated if critical is not None else 0,
                     kv_sources={k.value: v for k, v in self.buffer.kv_sources.items()},
                     instances=instance_stats, busy=self.busy, step_costs=self.step_costs)
        responses = sorted(self.results.values(), key=lambda r: (r.group_id, r.index))
        return RolloutResult(responses, metrics, self.decisions, stats)

    def _reprefill_reasons(self, instance_stats: Iterable[dict]) -> dict[str, int]:
        """Recomputed tokens by reason: KV lost with a failed instance (the buffer's), and each instance's
        failed imports and preemptions."""
        reasons: dict[str, int] = {}
        if self.buffer.reprefill_tokens:
            reasons["kv_lost"] = self.buffer.reprefill_tokens
        for st in instance_stats:
            for reason, tokens in st.get("reprefill_reasons", {}).items():
                reasons[reason] = reasons.get(reason, 0) + tokens
        return reasons

