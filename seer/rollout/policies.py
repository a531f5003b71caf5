"""Rollout policies compared side by side: the baseline and the Seer ablation ladder.

Why: Seer's claims are relative (throughput and tail against veRL, `context` against `oracle`), so every
driver (real engine, trace replay, simulator) must mean the same thing by each policy name. A policy is just
three switches:
- `divided`: chunks through the global request buffer and KV pool with fit-only admission (technique 1); when
  False, groups are split evenly across instances up front and each instance runs its share to completion with
  continuous batching and recompute preemption (veRL).
- `ordering`: which buffered request runs next (`fifo`, `context`, `group-oracle`, `oracle`; see
  orderings/). `group-oracle` and `oracle` are references that read the replayed true lengths.
- `speculative`: grouped speculative decoding from sibling suffix trees (technique 3).
- `critical`: critical-path placement (critical_path.py): the responses the ordering expects to end last each
  run on an instance of their own. Any divided policy takes it as a suffix: `context+critical`, `oracle+critical`.
- `rank`: the context ordering's rank of non-probes when the policy fixes it (orderings/context.py); None leaves
  it to the rollout's `OrderingConfig`.

`seer` is the default stack: the context ordering with the `attained` rank (every response is tested early, so a
runaway hidden among short siblings shows itself while there is time), critical-path placement (the responses
expected to end last run alone, with the whole draft budget) and grouped speculation. Chosen over the other
combinations on several seeded samples of two traces (benchmarks/README.md). `seer-paper` is the paper's stack
as published, for comparison: the group-estimate order, no placement. `seer-oracle` is `seer` told every
response's true length (longest remaining first, placement and drafting as in `seer`): a reference, not a
policy, whose gap to `seer` is what any better length estimate could still win. `seer-nodraft` is `seer` without
grouped speculation: run beside `seer`, it shows what drafting gains or costs on the same workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from seer.rollout.orderings import CONTEXT_RANKS, ORDERINGS


@dataclass(frozen=True)
class RolloutPolicy:
    name: str
    divided: bool
    ordering: str
    speculative: bool
    critical: bool = False
    rank: str | None = None

    def __post_init__(self) -> None:
        if self.ordering not in ORDERINGS:
            raise ValueError(f"policy {self.name!r}: unknown ordering {self.ordering!r}")
        if self.critical and not self.divided:
            raise ValueError(f"policy {self.name!r}: critical-path placement needs divided rollout")
        if self.rank is not None and (self.ordering != "context" or self.rank not in CONTEXT_RANKS):
            raise ValueError(f"policy {self.name!r}: rank {self.rank!r} needs the context ordering and one of "
                             f"{', '.join(CONTEXT_RANKS)}")

    @property
    def preempts(self) -> bool:
        """Only the non-divided baseline admits beyond its KV and preempts (recompute) when it runs out."""
        return not self.divided

    @property
    def needs_true_lengths(self) -> bool:
        return self.ordering in ("oracle", "group-oracle")


POLICIES: dict[str, RolloutPolicy] = {
    p.name: p
    for p in (
        RolloutPolicy("verl", divided=False, ordering="fifo", speculative=False),
        RolloutPolicy("divided", divided=True, ordering="fifo", speculative=False),
        RolloutPolicy("context", divided=True, ordering="context", speculative=False),
        RolloutPolicy("seer", divided=True, ordering="context", speculative=True, critical=True, rank="attained"),
        RolloutPolicy("seer-nodraft", divided=True, ordering="context", speculative=False, critical=True,
                      rank="attained"),
        RolloutPolicy("seer-paper", divided=True, ordering="context", speculative=True, rank="group"),
        RolloutPolicy("oracle", divided=True, ordering="oracle", speculative=False),
        RolloutPolicy("seer-oracle", divided=True, ordering="oracle", speculative=True, critical=True),
        RolloutPolicy("group-oracle", divided=True, ordering="group-oracle", speculative=False),
    )
}


CRITICAL_SUFFIX = "critical"


class UnknownPolicyError(ValueError):
    """A policy name that is not in the registry."""


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy(name: str) -> RolloutPolicy:
    """Look a policy up by name; an unknown name lists the known ones."""
    base, plus, suffix = name.partition("+")
    if base not in POLICIES or (plus and suffix != CRITICAL_SUFFIX):
        raise UnknownPolicyError(f"unknown policy {name!r}; known policies: {', '.join(POLICIES)} (divided ones "
                                 f"also as NAME+{CRITICAL_SUFFIX})")
    if not plus:
        return POLICIES[base]
    if not POLICIES[base].divided:
        raise UnknownPolicyError(f"policy {name!r}: {base!r} does not divide rollouts, so it has no placement to "
                                 f"make critical-path aware")
    if POLICIES[base].critical:
        raise UnknownPolicyError(f"policy {name!r}: {base!r} already places the critical path")
    return replace(POLICIES[base], name=name, critical=True)


def parse_policies(spec: str) -> list[RolloutPolicy]:
    """`"verl,divided,seer"` -> policies, in order, without duplicates; rejects an empty list."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UnknownPolicyError(f"no policy given; known policies: {', '.join(POLICIES)}")
    return [get_policy(n) for n in dict.fromkeys(names)]


def split_groups_evenly(group_ids: Sequence[int], num_instances: int) -> list[list[int]]:
    """veRL's static split: consecutive slices of the group list, sizes differing by at most one.

    veRL hands each data-parallel rollout worker a contiguous slice of the batch before generation starts; the
    first `len % n` instances get one extra group.
    """
    if num_instances < 1:
        raise ValueError(f"num_instances must be >= 1, got {num_instances}")
    base, extra = divmod(len(group_ids), num_instances)
    out: list[list[int]] = []
    start = 0
    for i in range(num_instances):
        stop = start + base + (1 if i < extra else 0)
        out.append(list(group_ids[start:stop]))
        start = stop
    return out


def instance_of_group(group_ids: Sequence[int], num_instances: int) -> dict[int, int]:
    """The static split as a mapping group_id -> instance, for `RequestBuffer.select_pinned`."""
    return {g: i for i, share in enumerate(split_groups_evenly(group_ids, num_instances)) for g in share}
