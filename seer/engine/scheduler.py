"""Continuous batching under a token budget and the KV capacity, with chunked prefill and recompute preemption.

``schedule()`` returns a ``SchedulerOutput`` (which requests compute how many tokens this step) and
``update_from_output()`` applies what the model produced. Running requests are served first, oldest first;
when KV runs out the newest running request is preempted: its blocks are freed and it later recomputes its
tokens (counted as ``reprefill_tokens``, the cost a veRL-like baseline pays under KV pressure). Waiting requests
are admitted only when nothing was preempted in the step, and a preempted request only when one free block per
running request remains after it: re-admitting it the moment its own blocks came free gets it preempted again at
the next block boundary, recomputing its whole context for a few tokens each time. A waiting request whose next
prompt block is being computed this very step by a sibling waits one step, so the G requests of a group compute
their prompt once. With ``decode_reserve`` set, admission also leaves free an adaptive share of the blocks that
running requests may still need (``decode_reserve.py``); the real engine turns it on. A divided-rollout chunk that
reserved only part of its KV (``Request.pause_when_full``) is never preempted: where its next token finds no
block it ends its chunk early, KV kept, and a draft that finds none is dropped; the block kept for a next token
counts as promised (``pending_blocks``), so neither a new chunk nor another request's draft takes it. Torch-free:
the simulator drives this class unchanged with a cost model instead of a model.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field, replace

from seer.engine.block_manager import BlockKey, BlockManager
from seer.engine.decode_reserve import DecodeReserve, DecodeReserveConfig
from seer.engine.request import Request, RequestStatus


class RequestRejected(ValueError):
    """A request that can never run (too long, cannot fit in KV memory); raised at submission."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    decode_reserve: DecodeReserveConfig | None = None  # None: admit whatever fits now, as vLLM does

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ScheduledChunk:
    request_id: str
    start: int            # num_computed_tokens before this step: KV position of the first new token
    num_new_tokens: int   # tokens computed this step, draft tokens included
    num_spec_tokens: int  # how many of them are draft tokens (at the end)
    samples: bool         # the chunk reaches the request's last real token, so the model emits tokens
    shared_tokens: int = 0  # context tokens in KV blocks an earlier chunk of the step reads too (a sibling's)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted_ids: list[str] = field(default_factory=list)
    step: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass
class StepResult:
    """What the model produced for one request in one step (empty for a partial prefill chunk)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_accepted_spec: int = 0


@dataclass
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    reprefill_tokens: int = 0
    prompt_tokens_computed: int = 0
    prefix_hit_tokens: int = 0
    output_tokens: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_bonus: int = 0
    spec_steps: int = 0
    # of the spec counters, those of drafts from the history source (earlier rollouts' responses to the same
    # prompt); the rest came from the group's own siblings
    history_drafted: int = 0
    history_accepted: int = 0
    history_steps: int = 0


def _drop_draft(req: Request) -> None:
    req.spec_token_ids = []
    req.spec_parents = None
    req.spec_source = ""


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.paused: dict[str, Request] = {}
        self.stats = SchedulerStats()
        self.reprefill_reasons: Counter[str] = Counter()  # stats.reprefill_tokens by why they were recomputed
        self._arrivals = 0
        self.reserve = (DecodeReserve(config.decode_reserve, block_manager.block_size, config.max_model_len)
                        if config.decode_reserve else None)

    # ------------------------------------------------------------------ submission
    def validate(self, req: Request) -> None:
        """Raise ``RequestRejected`` for a request that could never complete; nothing is queued then."""
        if not req.prompt_token_ids:
            raise RequestRejected(f"request {req.request_id}: empty prompt")
        if req.num_prompt_tokens >= self.config.max_model_len:
            raise RequestRejected(
                f"request {req.request_id}: prompt has {req.num_prompt_tokens} tokens, longer than "
                f"max_model_len={self.config.max_model_len} allows (it needs room for at least one new token)")
        total = min(req.max_total_tokens, self.config.max_model_len)
        need = self.block_manager.blocks_needed(total)
        if need > self.block_manager.num_blocks:
            raise RequestRejected(
                f"request {req.request_id}: needs {need} KV blocks for {total} tokens but the cache has only "
                f"{self.block_manager.num_blocks} blocks of {self.block_manager.block_size} tokens; "
                f"lower max_tokens or give the engine more KV memory")

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise RequestRejected(f"duplicate request id {req.request_id}")
        self.validate(req)
        req.arrival = self._arrivals
        self._arrivals += 1
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> Request | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.paused.pop(request_id, None)
        self.block_manager.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = req.finish_reason or "abort"
        return req

    @property
    def has_unfinished(self) -> bool:
        """Work left to step (paused requests wait for the caller, not for a step)."""
        return bool(self.waiting or self.running)

    def resume(self, request_id: str, chunk_end: int | None, reserve_tokens: int = 0) -> Request:
        """Queue a paused request for its next chunk; its KV blocks are still in place."""
        req = self.paused.pop(request_id, None)
        if req is None:
            raise KeyError(f"request {request_id!r} is not paused here")
        req.chunk_end = chunk_end
        req.reserve_tokens = reserve_tokens
        req.pause_when_full = False  # a property of each chunk: the caller sets it for this one
        req.status = RequestStatus.WAITING
        self.waiting.append(req)
        return req

    # ------------------------------------------------------------------ scheduling
    def schedule(self) -> SchedulerOutput:
        self.stats.steps += 1
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        pending_keys: set[BlockKey] = set()
        scheduled: set[str] = set()

        spare: int | None = None  # free blocks beyond those promised (pending_blocks), counted on first need
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            if req.pause_when_full and req.spec_token_ids:
                fits, spare = self._draft_fits(req, n, spare)
                if not fits:
                    _drop_draft(req)  # its draft finds no KV: it decodes one token, for which a block was kept
                    n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            while not self.block_manager.can_allocate(req, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                break
            chunks.append(self._take(req, n, pending_keys))
            scheduled.add(req.request_id)
            budget -= n
            i += 1

        if not preempted:
            budget = self._admit_waiting(budget, chunks, pending_keys)
            if not self.running and self.waiting:
                self._admit_on_held_kv(budget, chunks, pending_keys)
        return SchedulerOutput(chunks=self._mark_shared(chunks), preempted_ids=preempted, step=self.stats.steps)

    def _draft_fits(self, req: Request, n: int, spare: int | None) -> tuple[bool, int | None]:
        """Whether ``req``'s ``n`` tokens, draft included, fit in the blocks it holds, the one kept for its next
        token and ``spare``, the free blocks nobody was promised (None: not counted yet); returns that and the
        spare left. A draft must not take the block a later request's next token was kept for."""
        extra = self.block_manager.num_blocks_to_allocate(req, n) - self._next_block(req)
        if extra <= 0:
            return True, spare
        if spare is None:
            spare = self.block_manager.num_free_blocks - self.pending_blocks()
        return (True, spare - extra) if extra <= spare else (False, spare)

    def _mark_shared(self, chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """Each chunk with the context tokens it reads from blocks an earlier chunk of the step also reads: the
        leading blocks it has in common with the first chunk that starts from the same block (siblings share
        their prompt's blocks). The attention kernel reads such blocks from cache, not memory, so a step of
        siblings costs less than one of strangers at the same contexts, and a step-cost fit must see it."""
        bs = self.block_manager.block_size
        leaders: dict[int, tuple[list[int], int]] = {}
        out = []
        for c in chunks:
            blocks = c.start // bs
            ids = self.requests[c.request_id].block_ids
            if blocks == 0 or not ids:
                out.append(c)
                continue
            lead = leaders.setdefault(ids[0], (ids, blocks))
            if lead[0] is ids:
                out.append(c)
                continue
            k, top = 0, min(blocks, lead[1])
            while k < top and ids[k] == lead[0][k]:
                k += 1
            out.append(replace(c, shared_tokens=k * bs) if k else c)
        return out

    def _admit_waiting(self, budget: int, chunks: list[ScheduledChunk], pending_keys: set[BlockKey]) -> int:
        skipped: list[Request] = []
        held = self.reserve.held_blocks(self.running) if self.reserve is not None and self.waiting else 0.0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            bm = self.block_manager
            fresh = not req.block_ids
            if fresh:
                keys = bm.prompt_keys(req)
                hits = bm.find_cached_prefix(keys)
                if len(hits) < len(keys) and keys[len(hits)] in pending_keys:
                    skipped.append(self.waiting.popleft())  # a sibling computes this block right now
                    continue
                req.num_cached_prompt_tokens = bm.allocate_cached_prefix(req)
            n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            reserve = max(n, req.reserve_tokens - req.num_computed_tokens)
            preempted = req.reprefill_reason is None and req.max_computed_tokens > req.num_computed_tokens
            headroom = len(self.running) if preempted else 0
            if self.reserve is not None:
                slots = bm.blocks_needed(req.num_computed_tokens + reserve) * bm.block_size
                held += self.reserve.ratio * self.reserve.future_blocks(req, slots)
                headroom += int(held)
            if bm.num_blocks_to_allocate(req, reserve) + headroom > bm.num_free_blocks:
                if fresh:  # its prefix's blocks stay cached for the next try
                    bm.detach_cached_prefix(req)
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            chunks.append(self._take(req, n, pending_keys, reserve))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _admit_on_held_kv(self, budget: int, chunks: list[ScheduledChunk], pending_keys: set[BlockKey]) -> None:
        """Nothing runs and the head of the queue cannot be admitted: the first waiting chunk whose next tokens fit
        in the KV it holds plus the free blocks runs on that, ending its chunk early where it runs out
        (``pause_when_full``). Chunks placed from a view a step old (a remote instance's snapshot) can together
        need more KV than the instance has; each then holds blocks the others wait for, and an instance with work
        that can never step would stall the rollout. An ended chunk's KV is resident, so the coordinator can move
        it and the others go on."""
        bm = self.block_manager
        for req in self.waiting:
            if req.chunk_end is None or not req.block_ids:
                continue
            n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            if n <= 0 or bm.num_blocks_to_allocate(req, n) > bm.num_free_blocks:
                continue
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            req.pause_when_full, req.reserve_tokens = True, 0
            self.running.append(req)
            chunks.append(self._take(req, n, pending_keys))
            return

    def _take(self, req: Request, n: int, pending_keys: set[BlockKey], reserve: int = 0) -> ScheduledChunk:
        """Allocate slots for ``n`` new tokens of ``req`` (at least ``reserve``) and record the chunk."""
        ok = self.block_manager.allocate(req, max(n, reserve))
        assert ok
        start = req.num_computed_tokens
        num_spec = max(0, start + n - req.num_tokens)
        if start < req.max_computed_tokens:
            redone = min(start + n, req.max_computed_tokens) - start
            self.stats.reprefill_tokens += redone
            self.reprefill_reasons[req.reprefill_reason or "preemption"] += redone
        if start < req.num_prompt_tokens:
            self.stats.prompt_tokens_computed += min(start + n, req.num_prompt_tokens) - start
            if self.block_manager.enable_prefix_caching:
                bs = self.block_manager.block_size
                first, last = start // bs, (start + n) // bs
                if last > first:
                    pending_keys.update(self.block_manager.chain_keys(req.all_token_ids(), last)[first:])
        return ScheduledChunk(req.request_id, start, n, num_spec, samples=start + n >= req.num_tokens)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.block_manager.free(req)
        req.max_computed_tokens = max(req.max_computed_tokens, req.num_computed_tokens)
        req.reprefill_reason = None
        req.num_computed_tokens = 0
        _drop_draft(req)
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.stats.preemptions += 1
        if self.reserve is not None:
            self.reserve.observe_preemption()
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ update
    def update_from_output(self, out: SchedulerOutput, results: dict[str, StepResult]) -> list[Request]:
        """Apply one step's results; returns the requests that stopped running in this step: finished ones
        and, in divided rollout, those whose chunk ended (status PAUSED)."""
        finished: list[Request] = []
        for chunk in out.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # aborted meanwhile
            res = results.get(chunk.request_id)
            real_end = chunk.start + chunk.num_new_tokens - chunk.num_spec_tokens
            if res is None or not res.token_ids:
                req.num_computed_tokens = real_end
                self.block_manager.cache_full_blocks(req)
                continue
            self._record_spec(chunk, res, req.spec_source)
            req.num_computed_tokens = real_end + res.num_accepted_spec
            _drop_draft(req)
            for tok, lp in zip(res.token_ids, res.logprobs):
                req.append_output(tok, lp)
                self.stats.output_tokens += 1
                reason = req.check_stop(self.config.max_model_len)
                if reason is not None:
                    req.finish_reason = reason
                    break
            req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens - 1)
            self.block_manager.trim(req, max(req.num_computed_tokens + 1, req.reserve_tokens))
            self.block_manager.cache_full_blocks(req)
            if req.finish_reason is not None:
                self._finish(req)
                finished.append(req)
            elif req.chunk_end is not None and req.num_output_tokens >= req.chunk_end:
                self._pause(req)
                finished.append(req)
        self._end_chunks_out_of_kv(finished)
        return finished

    def pending_blocks(self) -> int:
        """Blocks already promised: what the waiting requests' admission will take (their reserve, else their
        context) and the block each running ``pause_when_full`` request's next token needs where it crosses into
        one (the pass that ended the others' chunks kept these free). Whoever places new requests here must leave
        them, or a request admitted into them preempts the one the block was kept for."""
        return self._waiting_blocks() + sum(self._next_block(r) for r in self.running if r.pause_when_full)

    def _waiting_blocks(self) -> int:
        bm = self.block_manager
        return sum(max(0, bm.blocks_needed(max(r.reserve_tokens, r.num_tokens)) - len(r.block_ids))
                   for r in self.waiting)

    def _next_block(self, req: Request) -> int:
        """Blocks a decoding request needs for its next token beyond those it holds (0 or 1)."""
        if req.num_computed_tokens != req.num_tokens - 1:
            return 0
        return max(0, self.block_manager.blocks_needed(req.num_tokens) - len(req.block_ids))

    def _end_chunks_out_of_kv(self, stopped: list[Request]) -> None:
        """A running ``pause_when_full`` request whose next token needs a block the instance no longer has (besides
        those the waiting requests were admitted with) ends its chunk now, its KV kept: it continues from the
        request buffer, here or where KV is free, instead of being preempted into recomputing its context. Within
        a step the older requests get the blocks left, as preemption would keep them."""
        free = None
        for req in list(self.running):
            need = self._next_block(req) if req.pause_when_full else 0
            if need <= 0:
                continue
            if free is None:
                free = self.block_manager.num_free_blocks - self._waiting_blocks()
            if need <= free:
                free -= need
            else:
                self._pause(req)
                stopped.append(req)

    def _pause(self, req: Request) -> None:
        self.running.remove(req)
        req.status = RequestStatus.PAUSED
        req.reserve_tokens = 0
        self.block_manager.trim(req, req.num_computed_tokens + 1)
        self.paused[req.request_id] = req

    def _record_spec(self, chunk: ScheduledChunk, res: StepResult, source: str) -> None:
        if chunk.num_spec_tokens:
            self.stats.spec_steps += 1
            self.stats.spec_drafted += chunk.num_spec_tokens
            self.stats.spec_accepted += res.num_accepted_spec
            self.stats.spec_bonus += 1
            if source == "history":
                self.stats.history_steps += 1
                self.stats.history_drafted += chunk.num_spec_tokens
                self.stats.history_accepted += res.num_accepted_spec

    def _finish(self, req: Request) -> None:
        if self.reserve is not None:
            self.reserve.observe_finish(req)
        self.running.remove(req)
        self.block_manager.free(req)
        req.status = RequestStatus.FINISHED
        del self.requests[req.request_id]

    def check_integrity(self) -> None:
        live = list(self.waiting) + self.running + list(self.paused.values())
        assert len({r.request_id for r in live}) == len(live), "a request is queued twice"
        assert set(self.requests) == {r.request_id for r in live}, "request table differs from the queues"
        for req in self.running:
            assert req.status == RequestStatus.RUNNING
            assert req.num_computed_tokens <= req.num_tokens
        for req in self.waiting:
            assert req.status == RequestStatus.WAITING
        for req in self.paused.values():
            assert req.status == RequestStatus.PAUSED and req.num_computed_tokens == req.num_tokens - 1
        assert len(self.running) <= self.config.max_num_seqs
        if self.reserve is not None:
            self.reserve.check_integrity()
        self.block_manager.check_integrity(live)
