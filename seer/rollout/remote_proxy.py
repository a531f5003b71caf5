"""The coordinator's view of an instance that runs elsewhere (a process or a Ray actor).

Such an instance steps on its own and reports a snapshot (free blocks, running count, resident KV) with every
step; between reports the proxy adds what it has sent since (reserved blocks, queued chunks), so the dispatcher
never over-admits on a stale view. Subclasses only say how messages travel.
"""

from __future__ import annotations

import abc

from seer.rollout.instance import ChunkStart, Instance, StepReport
from seer.rollout.types import InstanceState


class RemoteInstanceProxy(Instance):
    def __init__(self, iid: int, snap: dict) -> None:
        self.instance_id = iid
        self.snap = snap
        self.pending_blocks = 0
        self.pending_running = 0

    def refresh(self, snap: dict) -> None:
        self.snap, self.pending_blocks, self.pending_running = snap, 0, 0

    def state(self) -> InstanceState:
        s = self.snap
        return InstanceState(self.instance_id, max(0, s["free_blocks"] - self.pending_blocks), s["block_size"],
                             running=s["running"] + self.pending_running, max_running=s["max_running"],
                             total_blocks=s["total_blocks"])

    def start(self, chunk: ChunkStart) -> None:
        self.pending_blocks += chunk.assignment.blocks_reserved
        self.pending_running += 1
        self.snap["has_work"] = True
        self.snap["resident"].pop(chunk.spec.request_id, None)
        self.send_start(chunk)

    @abc.abstractmethod
    def send_start(self, chunk: ChunkStart) -> None:
        """Deliver a chunk start to the remote instance."""

    def step(self) -> StepReport:
        raise NotImplementedError("remote instances step on their own")

    def has_work(self) -> bool:
        return bool(self.snap["has_work"])

    def resident(self) -> list[int]:
        return list(self.snap["resident"])

    def resident_blocks(self, request_id: int) -> int:
        return self.snap["resident"].get(request_id, 0)

    def forget_resident(self, request_id: int) -> int:
        """Drop a resident request from the view; returns the blocks it held (now free)."""
        return self.snap["resident"].pop(request_id, 0)

    def stats(self) -> dict:
        return self.snap.get("stats", {})
