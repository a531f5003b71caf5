"""Turn the requests of one batching window into rollout groups, merging separate requests for one prompt.

Why: Seer's gains come from groups (siblings share prompt KV, the probe predicts the group's length, siblings
draft for each other), but some clients send the G samples of a prompt as G requests with ``n=1`` (verl's agent
loop does). Requests that arrive in the same window are merged into one group when they are for the same
prompt with the same sampling settings and either carry the same explicit ``group_id`` or carry no seed. A
seeded request without a ``group_id`` stays alone: inside a group, sibling i samples with a seed derived from
the group's (``sibling_seed``), so merging would change the result a seeded client expects. Groups sent
explicitly (``/v1/rollout``) are never merged.

Each merged group keeps a route from (group, sibling index) back to (submission, part, sample) so results find
their request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

from seer.rollout.types import GroupInput
from seer.server.convert import GroupSpec

Route = tuple[int, int, int]  # (submission, part, sample) in the batch


def merge_key(spec: GroupSpec) -> Hashable | None:
    """Specs with equal keys become one group; None: never merged."""
    if not spec.mergeable:
        return None
    settings = replace(spec.params, n=1)
    if spec.group_id is not None:
        return ("id", spec.group_id, spec.prompt_token_ids, settings)
    if spec.params.seed is None:
        return ("prompt", spec.prompt_token_ids, settings)
    return None


@dataclass
class GroupPlan:
    """The groups of one rollout and where each response goes."""

    groups: list[GroupInput] = field(default_factory=list)
    routes: dict[tuple[int, int], Route] = field(default_factory=dict)       # (group, index) -> route
    targets: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (sub, part) -> (group, 1st)

    def locate(self, sub: int, part: int, sample: int) -> tuple[int, int]:
        """(group, sibling index) running a given sample."""
        gid, first = self.targets[(sub, part)]
        return gid, first + sample


def plan_groups(submissions: Sequence[Sequence[GroupSpec]], key_prefix: str = "") -> GroupPlan:
    """Merge mergeable specs with equal keys (in arrival order) and lay out one GroupInput per group."""
    members: list[list[tuple[int, int, GroupSpec]]] = []
    by_key: dict[Hashable, int] = {}
    for s, parts in enumerate(submissions):
        for p, spec in enumerate(parts):
            key = merge_key(spec)
            if key is not None and key in by_key:
                members[by_key[key]].append((s, p, spec))
                continue
            if key is not None:
                by_key[key] = len(members)
            members.append([(s, p, spec)])
    plan = GroupPlan()
    for gid, group in enumerate(members):
        size = 0
        for s, p, spec in group:
            plan.targets[(s, p)] = (gid, size)
            for j in range(spec.params.n):
                plan.routes[(gid, size + j)] = (s, p, j)
            size += spec.params.n
        head = group[0][2]
        meta = dict(head.metadata or {})
        if head.group_id is not None:
            meta.setdefault("group_id", head.group_id)
        plan.groups.append(GroupInput(head.prompt_token_ids, size, replace(head.params, n=size),
                                      key=f"{key_prefix}{head.group_id or gid}", metadata=meta or None))
    return plan
