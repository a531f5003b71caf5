"""An instance that dies in the middle of an eviction or a KV import: fault injection at the risky moments.

Killing an instance at a time (``FaultPlan(during="step")``) rarely lands while it moves KV, yet those are the
moments where a lost instance can lose or duplicate a request: an eviction whose bytes never reach the pool,
a chunk started from pool KV that its new instance never loaded. This wrapper stands in for an instance in the
driver and kills it (``kill``: nothing in process, SIGKILL for a worker process, ``ray.kill`` for an actor) at
the first such moment, raising ``InstanceLost`` as a real loss does; everything else passes through.
"""

from __future__ import annotations

from collections.abc import Callable

from seer.rollout.instances.base import ChunkStart, Instance, InstanceLost, StepReport
from seer.rollout.types import InstanceState, KVSource


class FaultyInstance(Instance):
    def __init__(self, inner: Instance, during: str, kill: Callable[[], None] = lambda: None) -> None:
        if during not in ("evict", "import"):
            raise ValueError(f"FaultyInstance injects faults during evict or import, not {during!r}")
        self.inner = inner
        self.instance_id = inner.instance_id
        self.during = during
        self._kill = kill
        self.dead = False

    def _die(self) -> InstanceLost:
        self.dead = True
        self._kill()
        return InstanceLost(self.instance_id)

    def state(self) -> InstanceState:
        return self.inner.state()

    def start(self, chunk: ChunkStart) -> None:
        if self.dead:
            raise InstanceLost(self.instance_id)
        self.inner.start(chunk)
        if self.during == "import" and chunk.kv_source is KVSource.POOL:
            raise self._die()  # the start (and its import) reached the instance, which then died

    def step(self) -> StepReport:
        if self.dead:
            raise InstanceLost(self.instance_id)
        return self.inner.step()

    def has_work(self) -> bool:
        return not self.dead and self.inner.has_work()

    def resident(self) -> list[int]:
        return [] if self.dead else self.inner.resident()

    def resident_blocks(self, request_id: int) -> int:
        return self.inner.resident_blocks(request_id)

    def evict(self, request_id: int) -> int:
        if self.dead or self.during == "evict":
            raise self._die()
        return self.inner.evict(request_id)

    def release(self, request_id: int) -> None:
        if not self.dead:
            self.inner.release(request_id)

    def stats(self) -> dict:
        return self.inner.stats()

    def __getattr__(self, name: str):  # backend-specific parts of the wrapped instance (snap, proc, actor, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
