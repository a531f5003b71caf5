"""The global request buffer of divided rollout: where every request is, and which chunk runs where next.

Why: under divided rollout (Seer technique 1) a response is not bound to one instance for its whole life; it
runs a chunk of at most `chunk_tokens` tokens, comes back here, and its next chunk may run anywhere. That lets
the cluster rebalance continuously (no instance idles while another is overloaded) and, with a global KV pool,
move work without re-prefill. Admission is strict: a chunk is placed only where its KV fits for the whole chunk,
so instances never preempt.

The buffer is the single source of truth for where each request is (buffered, running on instance i, finished)
and for group progress; an `Ordering` (orderings/) decides which buffered request goes next, and `select`
decides where, through the instance picker (dispatch.py). With critical-path placement (critical_path.py) an
instance reserved for a critical request takes only that request's chunks, which go first in each round.

The buffer is not thread-safe: one driver loop owns it (select, then report chunk ends). At dispatch a request's
`kv_instance` / `kv_in_pool` still say where its KV was (the `Assignment.kv_source` says how to get it);
`on_chunk_done` sets them anew. KV left resident on an instance counts in that instance's used blocks, so if
nothing runs and nothing fits, the driver must evict resident KV to the pool (clear `kv_instance`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

from seer.rollout.critical_path import CriticalPath
from seer.rollout.dispatch import DispatchConfig, InstancePicker
from seer.rollout.length_model import PopulationLength
from seer.rollout.orderings import Ordering, OrderingConfig, make_ordering
from seer.rollout.types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    Assignment,
    Group,
    InstanceState,
    KVSource,
    RequestState,
    RolloutRequest,
)


class RequestBuffer:
    """All requests of one rollout, where each one is, and the dispatch of their next chunks."""

    def __init__(
        self,
        ordering: Ordering | str = "fifo",
        chunk_tokens: int | None = None,
        dispatch: DispatchConfig | None = None,
        ordering_config: OrderingConfig | None = None,
    ) -> None:
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
        self.ordering = make_ordering(ordering, ordering_config) if isinstance(ordering, str) else ordering
        self.chunk_tokens = chunk_tokens
        self.dispatch = dispatch or DispatchConfig()
        self.requests: dict[int, RolloutRequest] = {}
        self.groups: dict[int, Group] = {}
        self._buffered: dict[int, RolloutRequest] = {}
        self._running: dict[int, dict[int, RolloutRequest]] = {}
        self._finished: set[int] = set()
        self.kv_sources: Counter[KVSource] = Counter()  # chunks dispatched, by how their KV arrives
        self.reprefill_tokens = 0  # tokens recomputed because a request's KV was lost
        self.affinity_yields = 0  # chunks moved off an overloaded KV holder (DispatchConfig.affinity_spread)
        speedup = self.dispatch.critical_speedup
        self.critical = (CriticalPath(speedup, companions=self.dispatch.critical_companions)
                         if speedup is not None and chunk_tokens is not None else None)
        self._population: PopulationLength | None = None  # the last population fit, and when to refit it
        self._population_refit = 0
        # group -> instances that prefilled its prompt, in that order: a sibling starting there shares the prompt's
        # cached KV blocks (dispatch.py, "prompt homes")
        self.prompt_homes: dict[int, list[int]] = {}

    # ---- building -------------------------------------------------------------------------------------
    def add_group(
        self,
        prompt_len: int,
        size: int,
        max_tokens: int,
        *,
        group_id: int | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        true_lengths: Sequence[int] | None = None,
    ) -> Group:
        """Add G = `size` requests sampled from one prompt; request ids are assigned sequentially."""
        gid = len(self.groups) if group_id is None else group_id
        if gid in self.groups:
            raise ValueError(f"group {gid} already added")
        if size < 1 or max_tokens < 1 or prompt_len < 1:
            raise ValueError(f"group {gid}: need size >= 1, max_tokens >= 1, prompt_len >= 1")
        ids = tuple(prompt_token_ids) if prompt_token_ids is not None else None
        if ids is not None and len(ids) != prompt_len:
            raise ValueError(f"group {gid}: prompt_len {prompt_len} but {len(ids)} prompt token ids")
        lengths = tuple(true_lengths) if true_lengths is not None else None
        if lengths is not None and (len(lengths) != size or min(lengths) < 0):
            raise ValueError(f"group {gid}: true_lengths must be {size} non-negative lengths")
        group = Group(gid, size, max_tokens, true_lengths=lengths)
        for index in range(size):
            rid = len(self.requests)
            req = RolloutRequest(
                rid, gid, index, prompt_len, max_tokens, prompt_token_ids=ids,
                true_length=lengths[index] if lengths is not None else None,
            )
            group.requests.append(req)
            self.requests[rid] = req
            self._buffered[rid] = req
            self.ordering.push(req, group)
            if self.critical is not None:
                self.critical.work.add(req)
        self.groups[gid] = group
        return group

    # ---- dispatch -------------------------------------------------------------------------------------
    def select(self, instances: Sequence[InstanceState], n: int | None = None) -> list[Assignment]:
        """Place up to `n` next chunks (ordering order) on `instances`.

        Each placement reserves on the given `InstanceState`s (free_blocks -= blocks, running += 1), so several
        chunks in one round never over-admit. Stops at the first request that fits nowhere (after
        `max_skips` such requests); raises ValueError if a chunk exceeds every instance's `total_blocks`.
        """
        if not self._buffered or n == 0:
            return []
        self._population_fit()  # the ordering measures groups none of whose members has finished by it
        reserved = self.critical.request_on if self.critical is not None else {}
        companions = self.critical.companions_on if self.critical is not None else {}
        picker = InstancePicker(instances, self.dispatch, reserved, self.prompt_homes, companions)
        out: list[Assignment] = []
        for rid in sorted(reserved.values()):  # critical requests first, each on its own instance
            req = self._buffered.get(rid)
            if req is None or (n is not None and len(out) >= n):
                continue
            chunk = req.chunk_max_tokens(self.chunk_tokens)
            placed = picker.place(req, chunk)
            if placed is not None:
                self.ordering.remove(req)
                out.append(self._start(req, placed[0].instance_id, chunk, placed[1], picker.reserve_for(req, chunk)))
        skipped: list[RolloutRequest] = []
        try:
            while (n is None or len(out) < n) and not picker.exhausted:
                req = self.ordering.pop()
                if req is None:
                    break
                chunk = req.chunk_max_tokens(self.chunk_tokens)
                try:
                    placed = picker.place(req, chunk)
                except ValueError:
                    skipped.append(req)
                    raise
                if placed is None:
                    skipped.append(req)
                    if len(skipped) > self.dispatch.max_skips:
                        break
                    continue
                out.append(self._start(req, placed[0].instance_id, chunk, placed[1], picker.reserve_for(req, chunk)))
        finally:
            for req in skipped:
                self.ordering.requeue(req, self.groups[req.group_id])
            self.affinity_yields += picker.yields
        return out

    def update_critical(self, instances: Sequence[InstanceState]) -> None:
        """Refresh critical-path placement (critical_path.py) before a dispatch round."""
        if self.critical is None:
            return
        population = self._population_fit()
        self.critical.work.refresh(lambda r: self.estimated_remaining(r, lambda: population),
                                   (population, self.ordering.hint_inputs))
        self.critical.update(instances)

    POPULATION_REFIT_GROWTH = 1.05

    def _population_fit(self) -> PopulationLength | None:
        """All responses' lengths as one distribution, for requests whose group has revealed nothing: refitted
        only once the finished count has grown by 5% since the last fit (the fit is an EM over every response,
        too dear for every dispatch round of a large rollout, and a few more finishes barely move it)."""
        done = self.num_finished
        if done >= self._population_refit:
            self._population = PopulationLength.fit(self.groups.values())
            self.ordering.on_population(None if self._population is None else math.exp(self._population.mu))
            grown = math.ceil(done * self.POPULATION_REFIT_GROWTH)
            self._population_refit = max(done + 1, grown) if self._population is not None else done + 1
        return self._population

    def estimated_remaining(self, req: RolloutRequest,
                            population: Callable[[], PopulationLength | None] | None = None) -> tuple[float, bool]:
        """The ordering's belief of what ``req`` still has to generate; where it has none, the expectation under
        ``population()`` (all responses' lengths); without that, its whole budget (then False)."""
        hint = self.ordering.remaining_hint(req, self.groups[req.group_id])
        fit = population() if hint is None and population is not None else None
        if fit is not None:
            hint = fit.mean_remaining(req.generated, req.max_tokens)
        return (float(req.remaining_budget), False) if hint is None else (hint, True)

    def take(self, request_id: int, instance_id: int) -> Assignment:
        """Dispatch one specific buffered request (no fit check, nothing reserved): manual or static drivers."""
        req = self._buffered.get(request_id)
        if req is None:
            raise ValueError(f"request {request_id} is not in the buffer")
        self.ordering.remove(req)
        return self._start(req, instance_id, req.chunk_max_tokens(self.chunk_tokens), 0)

    def select_pinned(self, instance_of_group: Mapping[int, int]) -> list[Assignment]:
        """Dispatch every buffered request, in ordering order, to its group's fixed instance (veRL-style)."""
        unplaced = {r.group_id for r in self._buffered.values()} - set(instance_of_group)
        if unplaced:
            raise KeyError(f"groups {sorted(unplaced)} have no instance in the static split")
        out: list[Assignment] = []
        while (req := self.ordering.pop()) is not None:
            chunk = req.chunk_max_tokens(self.chunk_tokens)
            out.append(self._start(req, instance_of_group[req.group_id], chunk, 0))
        return out

    def _start(self, req: RolloutRequest, instance_id: int, chunk: int, blocks: int,
               reserve: int | None = None) -> Assignment:
        source = self._kv_source(req, instance_id)
        assignment = Assignment(req, instance_id, chunk, source, blocks, reserve)
        self.kv_sources[source] += 1
        self.reprefill_tokens += assignment.reprefill_tokens
        if source is not KVSource.LOCAL and source is not KVSource.POOL:  # its prompt is prefilled there
            homes = self.prompt_homes.setdefault(req.group_id, [])
            if instance_id not in homes:
                homes.append(instance_id)
        del self._buffered[req.request_id]
        self._running.setdefault(instance_id, {})[req.request_id] = req
        req.state = RequestState.RUNNING
        req.running_on = instance_id
        req.instance_history.append(instance_id)
        req.chunks += 1
        return assignment

    @staticmethod
    def _kv_source(req: RolloutRequest, instance_id: int) -> KVSource:
        if req.kv_instance == instance_id:
            return KVSource.LOCAL
        if req.kv_in_pool or req.kv_instance is not None:
            return KVSource.POOL  # resident on another instance: the driver moves it through the pool
        return KVSource.FRESH if req.generated == 0 else KVSource.RECOMPUTE

    # ---- completion -----------------------------------------------------------------------------------
    def on_chunk_done(
        self,
        request_id: int,
        new_tokens: int,
        finished: bool = False,
        finish_reason: str | None = None,
        *,
        kv_instance: int | None = None,
        kv_in_pool: bool = True,
        kv_tokens: int | None = None,
    ) -> RolloutRequest:
        """A chunk ended. Unfinished requests return to the buffer with their KV where the caller says it is.

        Defaults follow the paper: the KV was written to the pool and freed on the instance. Reaching
        max_tokens finishes the request (reason `length`) whatever `finished` says. `kv_tokens` (tokens the
        KV covers) defaults to the whole context; pass the exact figure when KV stays resident, since the
        dispatcher counts `blocks_for(kv_tokens)` as already held on `kv_instance`.
        """
        req = self.requests.get(request_id)
        if req is None or req.state is not RequestState.RUNNING:
            state = "unknown" if req is None else req.state.value
            raise ValueError(f"request {request_id} is not running (it is {state})")
        if new_tokens < 0 or req.generated + new_tokens > req.max_tokens:
            raise ValueError(
                f"request {request_id}: {new_tokens} new tokens after {req.generated} exceeds "
                f"max_tokens {req.max_tokens}"
            )
        del self._running[req.running_on][request_id]  # type: ignore[index]
        req.running_on = None
        req.generated += new_tokens
        group = self.groups[req.group_id]
        if self.critical is not None:
            self.critical.work.touch(req)
        if finished or req.generated == req.max_tokens:
            req.state = RequestState.FINISHED
            req.finish_reason = finish_reason or (FINISH_LENGTH if req.generated == req.max_tokens else FINISH_STOP)
            req.kv_instance, req.kv_in_pool, req.kv_tokens = None, False, 0
            self._finish(req, group)
        else:
            req.state = RequestState.BUFFERED
            req.kv_instance, req.kv_in_pool = kv_instance, kv_in_pool
            req.kv_tokens = req.context_len if kv_tokens is None else kv_tokens
            self._buffered[request_id] = req
            self.ordering.push(req, group)
        return req

    def abort(self, request_id: int) -> RolloutRequest:
        """Finish a buffered request now with reason `abort` (a client went away). It leaves the ordering;
        the caller frees whatever KV it still held (read `kv_instance` / `kv_in_pool` before calling)."""
        req = self._buffered.pop(request_id, None)
        if req is None:
            raise ValueError(f"request {request_id} is not buffered")
        self.ordering.remove(req)
        req.state = RequestState.FINISHED
        req.finish_reason = FINISH_ABORT
        req.kv_instance, req.kv_in_pool, req.kv_tokens = None, False, 0
        self._finish(req, self.groups[req.group_id])
        return req

    def _finish(self, req: RolloutRequest, group: Group) -> None:
        """Record a finished request in its group: its length is evidence of the group's, unless it was
        aborted (a partial length would pass for a short sibling)."""
        self._finished.add(req.request_id)
        if req.finish_reason == FINISH_ABORT:
            group.aborted += 1
        else:
            group.finished_lengths.append(req.generated)
        self.ordering.on_group_update(group)
        if group.done:
            self.prompt_homes.pop(group.group_id, None)
        if self.critical is not None:  # the group's length model moved: its members' estimates with it
            self.critical.work.remove(req)
            for sibling in group.requests:
                self.critical.work.touch(sibling)

    # ---- queries --------------------------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def num_buffered(self) -> int:
        return len(self._buffered)

    @property
    def num_running(self) -> int:
        return sum(len(r) for r in self._running.values())

    @property
    def num_finished(self) -> int:
        return len(self._finished)

    @property
    def all_finished(self) -> bool:
        return len(self._finished) == len(self.requests)

    def running_on(self, instance_id: int) -> list[RolloutRequest]:
        """Requests running a chunk on one instance (e.g. to return them to the buffer if it dies)."""
        return list(self._running.get(instance_id, {}).values())

    def buffered(self) -> Iterator[RolloutRequest]:
        return iter(self._buffered.values())

    # ---- integrity ------------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Every request is in exactly one place, group tallies match their members, the ordering agrees."""
        running = {rid: (iid, r) for iid, reqs in self._running.items() for rid, r in reqs.items()}
        places = len(self._buffered) + len(running) + len(self._finished)
        assert places == len(self.requests), "a request is in two places or in none"
        assert set(self._buffered) | set(running) | self._finished == set(self.requests), "unknown request"
        for rid, req in self.requests.items():
            assert req.request_id == rid and 0 <= req.generated <= req.max_tokens, f"request {rid} corrupt"
            if rid in self._buffered:
                assert req.state is RequestState.BUFFERED and req.running_on is None, f"request {rid} state"
            elif rid in running:
                assert req.state is RequestState.RUNNING and req.running_on == running[rid][0], f"{rid} state"
            else:
                assert req.state is RequestState.FINISHED and req.finish_reason, f"request {rid} state"
        for gid, group in self.groups.items():
            assert [r.index for r in group.requests] == list(range(group.size)), f"group {gid} members"
            done = sorted(r.generated for r in group.requests if r.finished and r.finish_reason != FINISH_ABORT)
            assert sorted(group.finished_lengths) == done, f"group {gid} finished lengths"
            aborted = sum(r.finish_reason == FINISH_ABORT for r in group.requests)
            assert group.aborted == aborted, f"group {gid} aborted count"
            homes = self.prompt_homes.get(gid, [])
            assert len(set(homes)) == len(homes) and not (homes and group.done), f"group {gid} prompt homes"
        self.ordering.check_integrity(self._buffered.values())
        if self.critical is not None:
            self.critical.check_integrity()
            assert not set(self.critical.instance_of) & self._finished, "a finished request is still critical"
