"""What runs where a remote instance lives: one engine instance answering the coordinator's commands.

Why one class: an instance process and a Ray actor must make the same decisions from the same commands, so
both run an ``InstanceHost`` and differ only in how commands reach it (a pipe or an actor call,
``backends/local.py`` and ``backends/ray_cluster.py``). The protocol is the host's public methods, named in
``COMMANDS``: ``snapshot``, ``start``, ``begin``, ``step``, ``evict``, ``release``, ``register``, ``feed``,
``finish_group`` and ``update_weights``; every answer that describes the instance carries a ``snapshot`` (free
blocks, running count, resident KV, the number of the last chunk start handled, counters), which the
coordinator's proxy (``remote.py``) keeps as its view.

KV leaves an instance through its pool: a pool shared between hosts (the file pool of local processes) keeps
it, while a host without one (a Ray actor, ``HandoffPool``) sends the evicted KV back with the eviction's
answer, and the coordinator hands it to the instance that resumes the request with that chunk's start.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seer.engine.config import EngineConfig
from seer.engine.speculator import SpecConfig
from seer.rollout.instances.base import ChunkStart, StepReport
from seer.rollout.kv_pool import KVPool, Payload, PoolStats

if TYPE_CHECKING:  # torch: imported where a host is built, so proxies and transports stay torch-free
    from seer.rollout.instances.engine import EngineInstance

# what a step answers: (start wall time, end wall time, report or None when there was no work, snapshot)
StepAnswer = tuple[float, float, StepReport | None, dict[str, Any]]
KVEntry = tuple[Payload, dict[str, Any]]  # a pool entry: payload and metadata

COMMANDS = frozenset({"snapshot", "start", "begin", "step", "evict", "release", "register", "feed",
                      "finish_group", "update_weights"})


@dataclass(frozen=True)
class HostSpec:
    instance_id: int
    engine: EngineConfig                     # this instance's engine, its model set
    pool_dirs: tuple[str, str, int] | None   # a shared file pool (memory dir, spill dir, budget), or None
    spec: SpecConfig | None                  # drafting, when the policy speculates
    cost_profile: dict[str, Any] | None      # verify-cost profile for the adaptive policy


def build_instance(spec: HostSpec) -> EngineInstance:
    """The engine instance of ``spec``, its pool and speculator set up."""
    from seer.engine.llm_engine import LLMEngine
    from seer.engine.speculator import Speculator
    from seer.rollout.file_pool import FileKVPool
    from seer.rollout.instances.engine import EngineInstance
    from seer.spec.policy import VerifyCostModel

    engine = LLMEngine(spec.engine.for_instance(spec.instance_id))
    pool: KVPool = FileKVPool(*spec.pool_dirs) if spec.pool_dirs is not None else HandoffPool()
    speculator = None
    if spec.spec is not None:
        cost = VerifyCostModel.from_profile(spec.cost_profile) if spec.cost_profile is not None else None
        speculator = Speculator.build(spec.spec, cost)
    return EngineInstance(spec.instance_id, engine, pool, speculator)


class HandoffPool(KVPool):
    """A host-local pool: entries arrive with a chunk start and leave with an eviction's answer."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, KVEntry] = {}
        self.moved = 0

    def put(self, request_id: Hashable, payload: Payload, meta: dict[str, Any] | None = None) -> None:
        self.entries[request_id] = (payload, meta or {})
        self.moved += len(payload)

    def get(self, request_id: Hashable) -> KVEntry:
        return self.entries[request_id]

    def pop(self, request_id: Hashable) -> KVEntry:
        return self.entries.pop(request_id)

    def drop(self, request_id: Hashable) -> bool:
        return self.entries.pop(request_id, None) is not None

    def clear(self) -> int:
        n = len(self.entries)
        self.entries.clear()
        return n

    def contains(self, request_id: Hashable) -> bool:
        return request_id in self.entries

    def stats(self) -> PoolStats:
        size = sum(len(p) for p, _ in self.entries.values())
        return PoolStats(len(self.entries), size, 0, self.moved, 0, 0, 0)

    def check_integrity(self) -> None:
        assert all(isinstance(m, dict) for _, m in self.entries.values())

    def close(self) -> None:
        self.entries.clear()


class InstanceHost:
    """One engine instance and the commands the coordinator sends it (``handle``)."""

    def __init__(self, spec: HostSpec) -> None:
        self.inst = build_instance(spec)
        self.handled = 0  # number of the last chunk start handled (the proxy's pending starts are those after it)
        self.labels: dict[str, Any] = {}  # where the host runs, added to its stats (a Ray node id)

    def handle(self, command: str, *args: Any) -> Any:
        if command not in COMMANDS:
            raise ValueError(f"unknown instance command {command!r}")
        return getattr(self, command)(*args)

    def has_work(self) -> bool:
        return self.inst.has_work()

    def snapshot(self) -> dict[str, Any]:
        inst = self.inst
        st = inst.state()
        return {"free_blocks": inst.kv_balance(), "running": st.running, "max_running": st.max_running,
                "total_blocks": st.total_blocks, "block_size": st.block_size,
                "resident": {rid: inst.resident_blocks(rid) for rid in inst.resident()},
                "has_work": inst.has_work(), "weight_version": inst.weight_version,
                "stats": dict(inst.stats(), **self.labels), "handled": self.handled}

    def start(self, chunk: ChunkStart, number: int, kv: KVEntry | None = None) -> None:
        if kv is not None:  # KV evicted from another host, handed over with the chunk
            self.inst.pool.put(chunk.spec.request_id, kv[0], kv[1])
        self.inst.start(chunk)
        self.handled = number

    def begin(self) -> None:
        """A rollout starts: per-rollout counters restart."""
        self.inst.begin_rollout()

    def step(self) -> StepAnswer:
        t0 = time.time()
        if not self.inst.has_work():
            return t0, t0, None, self.snapshot()
        rep = self.inst.step()
        # the KV this instance moved since its last step (evictions, imports at a start) is part of its busy time
        return t0 - rep.kv_s, time.time(), rep, self.snapshot()

    def evict(self, request_id: int) -> tuple[int, KVEntry | None]:
        """Save a resident request's KV to the pool and free it here: the bytes written, and the KV itself
        where the pool is this host's own (it travels with the answer)."""
        nbytes = self.inst.evict(request_id)
        kv = self.inst.pool.pop(request_id) if isinstance(self.inst.pool, HandoffPool) else None
        return nbytes, kv

    def release(self, request_id: int) -> None:
        """Free a resident (paused) request's KV without saving it; a request not resident here is left alone
        (the coordinator's view may be a step stale)."""
        if str(request_id) in self.inst.scheduler.paused:
            self.inst.release(request_id)

    def register(self, groups: list[tuple[str, tuple[int, ...]]]) -> None:
        """The rollout's groups, for this host's draft-server replica."""
        if self.inst.speculator is not None:
            server = self.inst.speculator.server
            for gid, prompt in groups:
                if not server.has_group(gid):
                    server.register_group(gid, prompt)

    def feed(self, updates: list[tuple[str, str, list[int]]]) -> None:
        """Sibling tokens generated on other instances (drafts may be a step stale, never wrong)."""
        if self.inst.speculator is not None:
            server = self.inst.speculator.server
            server.feed([u for u in updates if server.has_group(u[0])])

    def finish_group(self, gid: str) -> None:
        if self.inst.speculator is not None:
            self.inst.speculator.finish_group(gid)

    def update_weights(self, source: Any, version: int | None) -> int:
        return self.inst.update_weights(source, version)
