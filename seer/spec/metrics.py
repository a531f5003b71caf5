"""Speculative-decoding counters, overall, per group and per request.

Why summed counters: docs/design.md defines tau = (accepted + bonus) / verification steps of requests that speculated
and accept_rate = accepted / drafted, both from summed counters. Averaging per-request rates would let a few
short requests dominate, so only counters are stored and ratios are derived at read time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

__all__ = ["SpecCounters", "SpecMetrics"]


@dataclass
class SpecCounters:
    """One set of counters. ``steps`` counts verification steps with a non-empty draft; ``plain_steps`` counts
    decode steps of the same requests without one (not part of tau; they give ``tokens_per_step``)."""

    drafted: int = 0
    accepted: int = 0
    bonus: int = 0
    steps: int = 0
    plain_steps: int = 0

    def add(self, drafted: int, accepted: int, bonus: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.bonus += bonus
        self.steps += 1

    def merge(self, other: "SpecCounters") -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.bonus += other.bonus
        self.steps += other.steps
        self.plain_steps += other.plain_steps

    @property
    def tau(self) -> float:
        """Mean acceptance length incl. the bonus token; 0.0 when nothing was speculated."""
        return (self.accepted + self.bonus) / self.steps if self.steps else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per decode step over all steps, speculated or not (1.0 per plain step)."""
        total = self.steps + self.plain_steps
        return (self.accepted + self.bonus + self.plain_steps) / total if total else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"drafted": self.drafted, "accepted": self.accepted, "bonus": self.bonus, "steps": self.steps,
                "plain_steps": self.plain_steps, "tau": self.tau, "accept_rate": self.accept_rate,
                "tokens_per_step": self.tokens_per_step}

    def check_integrity(self) -> None:
        assert min(self.drafted, self.accepted, self.bonus, self.steps, self.plain_steps) >= 0, "negative counter"
        assert self.accepted <= self.drafted, f"accepted {self.accepted} > drafted {self.drafted}"
        assert self.bonus <= self.steps, f"bonus {self.bonus} > steps {self.steps}"


@dataclass
class SpecMetrics:
    """Overall, per-group and per-request counters plus drafter wall time (propose calls only). Per request,
    because a rollout's longest response sets its makespan and its own acceptance, not its group's, says how
    fast it could have run (``seer.rollout.bound``)."""

    total: SpecCounters = field(default_factory=SpecCounters)
    per_group: dict[Hashable, SpecCounters] = field(default_factory=dict)
    per_request: dict[Hashable, SpecCounters] = field(default_factory=dict)
    draft_time_s: float = 0.0
    propose_calls: int = 0
    proposed_requests: int = 0

    def record(self, group_id: Hashable, drafted: int, accepted: int, bonus: int,
               request_id: Hashable | None = None) -> None:
        """One verification step of one request that speculated (``drafted`` > 0)."""
        if drafted <= 0:
            raise ValueError(f"record() is for steps that speculated; drafted={drafted}")
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        if bonus not in (0, 1):
            raise ValueError(f"bonus must be 0 or 1, got {bonus}")
        self.total.add(drafted, accepted, bonus)
        self.per_group.setdefault(group_id, SpecCounters()).add(drafted, accepted, bonus)
        if request_id is not None:
            self.per_request.setdefault(request_id, SpecCounters()).add(drafted, accepted, bonus)

    def record_plain(self, group_id: Hashable, request_id: Hashable | None = None) -> None:
        """One decode step of a request that did not speculate."""
        self.total.plain_steps += 1
        self.per_group.setdefault(group_id, SpecCounters()).plain_steps += 1
        if request_id is not None:
            self.per_request.setdefault(request_id, SpecCounters()).plain_steps += 1

    def record_propose(self, seconds: float, num_requests: int) -> None:
        self.draft_time_s += seconds
        self.propose_calls += 1
        self.proposed_requests += num_requests

    @property
    def draft_time_per_call_s(self) -> float:
        return self.draft_time_s / self.propose_calls if self.propose_calls else 0.0

    def as_dict(self) -> dict:
        return {**self.total.as_dict(), "draft_time_s": self.draft_time_s, "propose_calls": self.propose_calls,
                "draft_time_per_call_s": self.draft_time_per_call_s,
                "per_group": {str(g): c.as_dict() for g, c in self.per_group.items()},
                "per_request": {str(r): c.as_dict() for r, c in self.per_request.items()}}

    def check_integrity(self) -> None:
        self.total.check_integrity()
        summed = SpecCounters()
        for c in self.per_group.values():
            c.check_integrity()
            summed.merge(c)
        assert summed == self.total, f"per-group counters {summed} do not sum to the total {self.total}"
        by_request = SpecCounters()
        for c in self.per_request.values():
            c.check_integrity()
            by_request.merge(c)
        assert not self.per_request or by_request == self.total, (
            f"per-request counters {by_request} do not sum to the total {self.total}")
