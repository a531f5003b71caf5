"""The coordinator's view of an instance that runs elsewhere (a process or a Ray actor), and its commands.

Such an instance steps on its own and reports a snapshot (free blocks, running count, resident KV) with every
step. A snapshot can predate chunk starts sent meanwhile: a host handles commands only between steps, so a
step's report omits the starts that arrived during it. Starts are therefore numbered, a snapshot says the last
one its instance had handled (``handled``), and the proxy adds the blocks and slots of every start after that,
so the dispatcher never over-admits on a stale view. The snapshot's free blocks are the instance's balance
(``kv_balance``), negative where it owes its waiting chunks more than is free, so the blocks an eviction frees
pay that debt before the proxy offers them. Commands travel through a ``Transport``, the same proxy for every
kind of host.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from seer.rollout.instances.base import ChunkStart, Instance, InstanceLost, StepReport
from seer.rollout.instances.transport import InstanceSilent, Transport
from seer.rollout.types import InstanceState, RolloutStalled


class RemoteInstanceProxy(Instance):
    def __init__(self, iid: int, snap: dict[str, Any], link: Transport, answer_timeout_s: float = 60.0) -> None:
        self.instance_id = iid
        self.snap = snap
        self.link = link
        self.answer_timeout_s = answer_timeout_s  # a host silent this long is stalled, never waited on forever
        self.sent = snap.get("handled", 0)  # number of the last chunk start sent
        self.unseen: deque[tuple[int, int]] = deque()  # (number, blocks) of starts the snapshot may not include

    def refresh(self, snap: dict[str, Any]) -> None:
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
        rid = chunk.spec.request_id
        self.sent += 1
        self.unseen.append((self.sent, chunk.assignment.blocks_reserved))
        self.snap["resident"].pop(rid, None)
        self.link.post(self.instance_id, "start", chunk, self.sent, self.link.claim_kv(rid))

    def step(self) -> StepReport:
        raise NotImplementedError("remote instances step on their own")

    def has_work(self) -> bool:
        """Work by the last snapshot, or a chunk start sent since that it did not include."""
        return bool(self.snap["has_work"]) or bool(self.unseen)

    def resident(self) -> list[int]:
        return list(self.snap["resident"])

    def resident_blocks(self, request_id: int) -> int:
        return self.snap["resident"].get(request_id, 0)

    def forget_resident(self, request_id: int) -> int:
        """Drop a resident request from the view; returns the blocks it held (now free)."""
        return self.snap["resident"].pop(request_id, 0)

    def evict(self, request_id: int) -> int:
        blocks = self.forget_resident(request_id)
        try:
            nbytes, kv = self.link.call(self.instance_id, "evict", request_id, timeout_s=self.answer_timeout_s)
        except InstanceSilent as err:
            raise RolloutStalled(f"instance {self.instance_id} did not answer an eviction within "
                                 f"{self.answer_timeout_s:g} s (stall timeout)") from err
        if kv is not None:
            self.link.keep_kv(request_id, kv)
        self.snap["free_blocks"] += blocks
        return int(nbytes)

    def release(self, request_id: int) -> None:
        self.forget_resident(request_id)
        try:
            self.link.post(self.instance_id, "release", request_id)
        except InstanceLost:
            pass  # a dead instance holds no KV

    def stats(self) -> dict[str, Any]:
        return self.snap.get("stats", {})
