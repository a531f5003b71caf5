"""Chunk dispatch: which instance takes a buffered request's next chunk.

The instance that already holds the request's KV takes it if the chunk fits there; otherwise the instance with the
most free KV (then fewest running), the KV moving through the pool. A request without KV (its first chunk) starts on
one of its group's prompt homes, the instances that prefilled that prompt, if it fits there: siblings on one
instance share the prompt's cached blocks, so the same KV memory runs more sequences; scattered, each holds a
copy, and where prompts are a large share of the context that costs a memory-bound instance a third of its running
batch (docs/design.md). KV from the pool goes where any chunk would, not home: within the affinity spread a home
would keep taking a long group's chunks in the tail while other instances idle. A holder (of KV or of a prompt)
running more than ``affinity_spread`` requests beyond the least loaded live instance is overloaded: the least
loaded instance takes the chunk if it fits there, since affinity alone lets the instances that happen to hold KV
keep long queues while others idle. A chunk goes only where the KV of its first ``reserve_tokens`` tokens fits (a
critical request's: the whole chunk, drafts included, engine/speculator.py); the rest is allocated as it runs, and
where an instance's KV runs out a chunk ends early with its KV kept (engine/scheduler.py), so instances never
preempt. Reserving every chunk whole would hold a block or more per running request that most never fill: on a
memory-bound instance that is a fifth of its KV, and of its batch (benchmarks/README.md). Instances sit in heaps
with lazy updates, so a round with k dispatches over N instances costs O(N + k log N). Torch-free.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from seer.rollout.types import InstanceState, RolloutRequest, blocks_for, chunk_blocks_needed


@dataclass(frozen=True)
class DispatchConfig:
    """How `select` places chunks."""

    prefer_kv_holder: bool = True  # resume on the instance whose cache still holds the KV when it fits
    affinity_spread: int | None = None  # ... and runs at most this many more requests than the least loaded
    max_skips: int = 0  # requests that fit nowhere that a round may pass over (0: stop at the first one)
    # critical-path placement (critical_path.py): an instance's speedup at batch b over one sequence alone;
    # None turns it off
    critical_speedup: Callable[[float], float] | None = None
    # ... and the requests a critical request's instance runs beside it at no cost to its step by the step profile
    # (lone_companions), until the rollout's own steps price them (critical_path.py)
    critical_companions: int = 0
    # KV a chunk reserves at admission: this many of its tokens (a critical request's chunk: all of them), the
    # rest allocated as it runs, ending the chunk early where the instance runs out; None reserves every chunk whole
    reserve_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.reserve_tokens is not None and self.reserve_tokens < 1:
            raise ValueError(f"DispatchConfig.reserve_tokens must be >= 1 or None, got {self.reserve_tokens}")


def reserved_tokens(chunk: int, ahead: int | None, critical: bool) -> int:
    """The tokens of a ``chunk``-token chunk whose KV admission reserves: all of a critical request's (it runs
    alone, at the pace the rollout's end waits on, and must never stop for KV), else up to ``ahead``."""
    return chunk if ahead is None or critical else min(chunk, ahead)


class InstancePicker:
    """Instances with a free slot, most free KV tokens first, reserved on as chunks are placed."""

    def __init__(self, instances: Sequence[InstanceState], config: DispatchConfig,
                 reserved: Mapping[int, int] | None = None,
                 prompt_homes: Mapping[int, Sequence[int]] | None = None,
                 companions: Mapping[int, int] | None = None) -> None:
        """``reserved``: instance id -> its critical request; other requests go there only as its companions,
        while it runs fewer than ``companions[instance id]`` beside the critical request and keeps room for the
        critical request's next chunk. ``prompt_homes``: group id -> the instances that prefilled its prompt (a
        request without KV starts where its prompt is cached, if it fits)."""
        self._config = config
        self._homes = prompt_homes if prompt_homes is not None else {}
        self._reserved = dict(reserved or {})
        self._companions = dict(companions or {})
        self._critical = {rid: iid for iid, rid in self._reserved.items()}
        self._by_id: dict[int, InstanceState] = {}
        self._heap: list[tuple[int, int, int, int]] = []
        self._load: list[tuple[int, int, int]] = []  # (running, id, version) of every live instance
        largest: int | None = 0
        for inst in instances:
            iid = inst.instance_id
            if iid in self._by_id:
                raise ValueError(f"duplicate instance id {iid}")
            self._by_id[iid] = inst
            if inst.alive:
                largest = None if largest is None or inst.total_blocks is None else max(largest, inst.total_blocks)
            if inst.alive and iid not in self._reserved:
                self._load.append((inst.running, iid, 0))
                if inst.running < inst.max_running:
                    self._heap.append((-inst.free_blocks * inst.block_size, inst.running, iid, 0))
        heapq.heapify(self._heap)
        heapq.heapify(self._load)
        self._version = dict.fromkeys(self._by_id, 0)
        self.yields = 0  # chunks an overloaded KV holder gave up to the least loaded instance
        self._largest = largest  # None when some live instance does not report its size

    def _push(self, inst: InstanceState) -> None:
        if inst.instance_id in self._reserved:
            return
        version = self._version.get(inst.instance_id, -1) + 1
        self._version[inst.instance_id] = version
        heapq.heappush(self._load, (inst.running, inst.instance_id, version))
        if inst.has_slot:
            key = (-inst.free_blocks * inst.block_size, inst.running, inst.instance_id, version)
            heapq.heappush(self._heap, key)

    def _top(self) -> InstanceState | None:
        while self._heap and self._version[self._heap[0][2]] != self._heap[0][3]:
            heapq.heappop(self._heap)
        return self._by_id[self._heap[0][2]] if self._heap else None

    def _least_loaded(self) -> InstanceState:
        while self._version[self._load[0][1]] != self._load[0][2]:
            heapq.heappop(self._load)
        return self._by_id[self._load[0][1]]

    def _overloaded(self, holder: InstanceState) -> bool:
        spread = self._config.affinity_spread
        return spread is not None and bool(self._load) and holder.running - self._least_loaded().running > spread

    @property
    def exhausted(self) -> bool:
        return self._top() is None

    def reserve_for(self, req: RolloutRequest, chunk: int) -> int:
        """The tokens of ``req``'s next chunk whose KV its placement reserves (``reserved_tokens``)."""
        return reserved_tokens(chunk, self._config.reserve_tokens, req.request_id in self._critical)

    def place(self, req: RolloutRequest, chunk: int) -> tuple[InstanceState, int] | None:
        """Reserve room for the chunk (``reserve_for`` of its tokens) and return (instance, blocks), or None if it
        fits nowhere now."""
        own = self._critical.get(req.request_id)
        if own is not None:  # a critical request runs on its own instance or waits for it
            inst = self._by_id.get(own)
            if inst is None or not inst.has_slot:
                return None
            need = chunk_blocks_needed(req, inst, chunk)
            return self._reserve(inst, need) if need <= inst.free_blocks else None
        full, chunk = chunk, self.reserve_for(req, chunk)
        companion = self._companion_slot(req, chunk, full)
        if companion is not None:
            return companion
        if req.kv_instance is None and not req.kv_in_pool:
            home = self._home_slot(req, chunk)
            if home is not None:
                return home
        holder = self._by_id.get(req.kv_instance) if req.kv_instance is not None else None
        if holder is not None and holder.instance_id in self._reserved:
            holder = None
        if self._config.prefer_kv_holder and holder is not None and holder.has_slot:
            if self._overloaded(holder):  # the least loaded instance takes it if it fits, the KV moving there
                least = self._least_loaded()
                need = chunk_blocks_needed(req, least, chunk)
                if least.has_slot and need <= least.free_blocks:
                    self.yields += 1
                    return self._reserve(least, need)
            else:
                need = chunk_blocks_needed(req, holder, chunk)
                if need <= holder.free_blocks:
                    return self._reserve(holder, need)
        top = self._top()
        if top is None:
            return None
        need = chunk_blocks_needed(req, top, chunk)
        if need <= top.free_blocks:
            return self._reserve(top, need)
        if self._largest is not None and need > self._largest:
            raise ValueError(
                f"request {req.request_id}: a {chunk}-token chunk at context {req.context_len} needs {need} "
                f"KV blocks, more than the largest instance holds ({self._largest})"
            )
        return None

    def _companion_slot(self, req: RolloutRequest, chunk: int, full: int) -> tuple[InstanceState, int] | None:
        """A reserved instance with a companion place free, first: the chunk runs there at no cost to the
        critical request's step, so it is the cheapest place in the cluster. The place counts the critical request
        as running (it is placed first each round), and the chunk (``full`` tokens, ``chunk`` of them reserved)
        must leave room for that request's next chunk."""
        for iid in sorted(self._reserved):
            inst, most = self._by_id[iid], self._companions.get(iid, 0)
            if not most or not inst.alive or not inst.has_slot or inst.running >= 1 + most:
                continue
            need = chunk_blocks_needed(req, inst, chunk)
            if need + blocks_for(full, inst.block_size) + 1 <= inst.free_blocks:
                return self._reserve(inst, need)
        return None

    def _home_slot(self, req: RolloutRequest, chunk: int) -> tuple[InstanceState, int] | None:
        """The prompt home with the most free KV that the chunk fits and that is not overloaded: the request
        shares its prompt's cached blocks with its siblings there, so the same memory runs more sequences."""
        best: tuple[InstanceState, int] | None = None
        for iid in self._homes.get(req.group_id, ()):
            inst = self._by_id.get(iid)
            if inst is None or not inst.has_slot or iid in self._reserved or self._overloaded(inst):
                continue
            need = chunk_blocks_needed(req, inst, chunk)
            if need <= inst.free_blocks and (best is None or inst.free_blocks > best[0].free_blocks):
                best = (inst, need)
        return None if best is None else self._reserve(*best)

    def _reserve(self, inst: InstanceState, need: int) -> tuple[InstanceState, int]:
        inst.free_blocks -= need
        inst.running += 1
        self._push(inst)
        return inst, need
