"""The coordinator's view of an instance that runs elsewhere (a process or a Ray actor).

Such an instance steps on its own and reports a snapshot (free blocks, running count, resident KV) with every
step. A snapshot can predate chunk starts sent meanwhile: a worker handles messages only between steps, so a
step's report omits the starts that arrived during it. Starts are therefore numbered, a snapshot says the last
one its instance had handled (``handled``), and the proxy adds the blocks and slots of every start after that,
so the dispatcher never over-admits on a stale view. Subclasses only say how messages travel.
"""

from __future__ import annotations

import abc
from collections import deque

from seer.rollout.instances.base import ChunkStart, Instance, StepReport
from seer.rollout.types import InstanceState


class RemoteInstanceProxy(Instance):
    def __init__(self, iid: int, snap: dict) -> None:
        self.instance_id = iid
        self.snap = snap
        self.sent = snap.get("handled", 0)  # number of the last chunk start sent
        self.unseen: deque[tuple[int, int]] = deque()  # (number, blocks) of starts the snapshot may not include

    def refresh(self, snap: dict) -> None:
        """A newer snapshot: the starts it has handled are in it; later ones stay pending."""
        handled = snap.get("handled", 0)
        while self.unseen and self.unseen[0][0] <= handled:
            self.unseen.popleft()
        self.snap = snap

    @property
    def pending_blocks(self) -> int:
        return sum(blocks for _, blocks in self.unseen)

    def state(self) -> InstanceState:
        s = self.snap
        return InstanceState(self.instance_id, max(0, s["free_blocks"] - self.pending_blocks), s["block_size"],
                             running=s["running"] + len(self.unseen), max_running=s["max_running"],
                             total_blocks=s["total_blocks"])

    def start(self, chunk: ChunkStart) -> None:
        self.sent += 1
        self.unseen.append((self.sent, chunk.assignment.blocks_reserved))
        self.snap["has_work"] = True
        self.snap["resident"].pop(chunk.spec.request_id, None)
        self.send_start(chunk, self.sent)

    @abc.abstractmethod
    def send_start(self, chunk: ChunkStart, number: int) -> None:
        """Deliver chunk start number ``number`` to the remote instance, which reports it as ``handled``."""

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
