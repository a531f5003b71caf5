"""The paper's order of non-probe requests: the group with the longest estimate L_g first, its members by arrival.

L_g is the longest finished sibling's length, max_tokens before any finishes (``Group.length_estimate``). Used by
the context ordering with ``rank="group"``; kept as the paper states it, so the default (``rank="remaining"``)
can be measured against it.
"""

from __future__ import annotations

import heapq

from seer.rollout.orderings.heap import LazyHeap
from seer.rollout.types import Group, RolloutRequest


class GroupMajorQueue:
    def __init__(self) -> None:
        self._members: dict[int, LazyHeap] = {}  # group -> its waiting non-probes, by arrival
        self._groups: list[tuple[int, int, int]] = []  # (-L_g, group_id, version)
        self._version: dict[int, int] = {}  # version of a group's newest entry; older entries are stale
        self._listed: set[int] = set()  # groups with a live entry in `_groups`

    def store(self, req: RolloutRequest, group: Group) -> None:
        self._members.setdefault(group.group_id, LazyHeap()).push(req.arrival_seq, req)
        if group.group_id not in self._listed:
            self._list(group)

    def to_rekey(self, group: Group, respread: bool) -> list[RolloutRequest]:
        """A sibling finished: the group moves to its new L_g; no member needs a new key."""
        if group.group_id in self._listed:
            self._list(group)
        return []

    def compact(self) -> None:
        """Nothing to do: a group's stale members are dropped as they surface."""

    def _list(self, group: Group) -> None:
        version = self._version.get(group.group_id, -1) + 1
        self._version[group.group_id] = version
        self._listed.add(group.group_id)
        heapq.heappush(self._groups, (-group.length_estimate, group.group_id, version))

    def pop(self) -> RolloutRequest | None:
        while self._groups:
            _, gid, version = self._groups[0]
            if gid not in self._listed or self._version[gid] != version:
                heapq.heappop(self._groups)
                continue
            req = self._members[gid].pop()
            if req is None:
                heapq.heappop(self._groups)
                self._listed.discard(gid)
                continue
            return req
        return None

    def tickets(self) -> list[int]:
        for gid, heap in self._members.items():
            if heap.tickets():
                assert gid in self._listed, f"context: group {gid} has waiting requests but is not listed"
        return [t for heap in self._members.values() for t in heap.tickets()]
