"""A transport to no hosts, for the shared remote-instance code: answers from a script, posts recorded."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.host import HostSpec, KVEntry, StepAnswer
from seer.rollout.instances.transport import Transport


def snapshot(free: int = 50, running: int = 0, handled: int = 0, version: int = 0) -> dict[str, Any]:
    return {"free_blocks": free, "running": running, "max_running": 8, "total_blocks": 100, "block_size": 16,
            "resident": {}, "has_work": running > 0, "weight_version": version, "handled": handled}


class FakeTransport(Transport):
    """``versions``: what successive ``update_weights`` commands answer; ``evicted_kv``: what evictions bring back
    (None: a shared pool keeps it)."""

    def __init__(self, versions: Iterable[int] = (), evicted_kv: KVEntry | None = None) -> None:
        super().__init__()
        self.versions: Iterator[int] = iter(versions)
        self.evicted_kv = evicted_kv
        self.snaps: dict[int, dict[str, Any]] = {}
        self.posted: list[tuple[int, str, tuple[Any, ...]]] = []
        self.held: dict[int, KVEntry] = {}
        self.spawned = 0

    def spawn(self, specs: list[HostSpec]) -> dict[int, dict[str, Any]]:
        self.lost.clear()
        self.spawned += 1
        self.snaps = {s.instance_id: snapshot() for s in specs}
        return {iid: dict(snap) for iid, snap in self.snaps.items()}

    def kill(self, iid: int) -> None:
        self.lost.add(iid)

    def close(self) -> None:
        pass

    def post(self, iid: int, command: str, *args: Any) -> None:
        self.posted.append((iid, command, args))

    def send(self, iid: int, command: str, *args: Any) -> tuple[int, str, tuple[Any, ...]]:
        return iid, command, args

    def answer(self, ticket: tuple[int, str, tuple[Any, ...]], timeout_s: float) -> Any:
        iid, command, args = ticket
        if iid in self.lost:
            raise InstanceLost(iid)
        if command == "update_weights":
            self.snaps[iid]["weight_version"] = next(self.versions)
            return self.snaps[iid]["weight_version"]
        if command == "snapshot":
            return dict(self.snaps[iid])
        if command == "evict":
            return 100, self.evicted_kv
        return None

    def request_steps(self, iids: Iterable[int]) -> bool:
        return False

    def poll(self, timeout_s: float) -> list[tuple[int, StepAnswer]]:
        return []

    def forget_steps(self) -> None:
        pass

    def keep_kv(self, request_id: int, kv: KVEntry) -> None:
        self.held[request_id] = kv

    def claim_kv(self, request_id: int) -> Any:
        return self.held.pop(request_id, None)

    def kv_entries(self) -> int:
        return len(self.held)

    def clear_kv(self) -> int:
        n = len(self.held)
        self.held.clear()
        return n
