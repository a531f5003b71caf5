"""The draft budget: how many draft tokens each request verifies in the next step.

Rule (docs/design.md, "Adaptive draft length"): every candidate draft token has a marginal value, the
probability that it is accepted times the weight of its request's tokens (draft token ``j`` of a request with
per-token acceptance ``a`` and weight ``w`` is worth ``w * a ** j``), and the step has a price, its time with
those tokens added. Candidates are ranked by value (probes' values boosted, so a group's length estimate arrives
early), and the prefix of that ranking with the most expected value per second of step is kept: nothing, i.e.
plain decoding, when no prefix beats the step without drafts. A memory-bound step (the rollout's tail) drafts
long because extra tokens cost it almost nothing; a compute-bound step (a large busy batch) drafts little or not
at all.

Why one function for the engine and the simulator: ``SpecPolicy.plan`` prices a step from the engine's profiled
table ``T(B, n)`` and gives every request a class of its own; the simulator prices it with the roofline at the
batch's contexts and puts requests with equal values in one class (a thousand running requests are a few dozen
classes), so simulated and real drafting decide by the same rule. A class is granted whole tokens in rank
order; the class ranked right after the kept prefix may grant its next token to some of its members (the
largest count that still raises the rate).

A step that carries a critical request (one the rollout gave an instance of its own because it bounds the
makespan) is planned for that request first: its drafts maximise its own tokens per second at the step's price,
with every other request at plain decoding, and the other requests (its companions) then draft only while the
step stays within ``CRITICAL_SLACK`` of that price. Why: the rollout made the request critical because the
shared instances can absorb the rest of the work while it runs; a companion's drafts add tokens the rollout does
not wait for and, at any batch where drafted tokens are not free, slow the one token stream it does wait for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CRITICAL_SLACK", "DraftClass", "StepPrice", "plan_budget"]

CRITICAL_SLACK = 0.05  # how much a critical request's step may slow for the other requests beside it


@dataclass
class DraftClass:
    """Requests whose draft tokens have equal values; ``gains[j - 1]`` is the value of each one's token ``j``."""

    gains: list[float]
    members: list[Any] = field(default_factory=list)  # what the caller grants to (requests, request ids)
    context: float = 0.0  # summed context of the members: a draft token of each attends to this much KV
    probe: bool = False
    critical: bool = False  # members bound the makespan: planned first, the rest fit around them
    weight: float = 1.0  # value of each member's plain token (what its gains are scaled by)
    granted: int = 0  # draft tokens every member verifies
    partial: int = 0  # members[:partial] verify one more

    def gamma(self, member: int) -> int:
        """Draft tokens granted to ``members[member]``."""
        return self.granted + (1 if member < self.partial else 0)


class StepPrice(Protocol):
    def __call__(self, tokens: int, context: float, drafting: int) -> float:
        """Seconds of the step with ``tokens`` draft tokens added, attending to ``context`` KV tokens in all,
        from ``drafting`` requests (0, 0, 0: the plain step)."""
        ...


@dataclass
class _Prefix:
    """Running totals of a prefix of the ranking."""

    value: float
    tokens: int = 0
    context: float = 0.0
    drafting: int = 0

    def grow(self, c: DraftClass, j: int, k: int) -> "_Prefix":
        """This prefix with token ``j`` (1-based) of ``k`` members of ``c`` added."""
        per = c.context / len(c.members) if c.members else 0.0
        return _Prefix(self.value + k * c.gains[j - 1], self.tokens + k, self.context + k * per,
                       self.drafting + (k if j == 1 else 0))


def _ranking(classes: list[DraftClass], probe_boost: float) -> list[tuple[int, int]]:
    """(class, token j) in order of boosted value; ties in class order, then token order (a stable sort)."""

    def boosted(item: tuple[int, int]) -> float:
        c = classes[item[0]]
        return c.gains[item[1] - 1] * (probe_boost if c.probe else 1.0)

    items = [(i, j) for i, c in enumerate(classes) if c.members for j in range(1, len(c.gains) + 1)]
    return sorted(items, key=boosted, reverse=True)


def plan_budget(classes: list[DraftClass], price: StepPrice, base_value: float, probe_boost: float = 1.0,
                max_tokens: int | None = None, slack: float = CRITICAL_SLACK) -> int:
    """Set ``granted``/``partial`` of every class; returns the draft tokens granted in all.

    ``base_value``: the value of the step's plain tokens (the summed weights of its decoding requests).
    ``max_tokens``: a cap on the draft tokens of the step. Gains of a class must not increase with ``j``.
    ``slack``: with critical classes, how much dearer than their own plan the others' drafts may make the step.
    """
    critical = [c for c in classes if c.critical and c.members]
    if not critical:
        return _plan(classes, price, base_value, probe_boost, max_tokens).tokens
    others = [c for c in classes if not (c.critical and c.members)]
    plain = sum(c.weight * len(c.members) for c in critical)
    own = _plan(critical, price, plain, 1.0, max_tokens)
    limit = (1.0 + slack) * price(own.tokens, own.context, own.drafting)

    def around(tokens: int, context: float, drafting: int) -> float:
        """The step with the critical drafts in; beyond the slack it is worth nothing (an infinite price)."""
        p = price(own.tokens + tokens, own.context + context, own.drafting + drafting)
        return p if p <= limit else float("inf")

    room = None if max_tokens is None else max_tokens - own.tokens
    rest = _plan(others, around, base_value + own.value - plain, probe_boost, room)
    return own.tokens + rest.tokens


def _plan(classes: list[DraftClass], price: StepPrice, base_value: float, probe_boost: float,
          max_tokens: int | None) -> _Prefix:
    """``plan_budget`` for classes of which none is critical; returns the kept plan's totals (its value with
    ``base_value``)."""
    for c in classes:
        c.granted = c.partial = 0
    if base_value <= 0:
        return _Prefix(base_value)
    ranking, cap = _ranking(classes, probe_boost), max_tokens
    # the running prefix as plain locals (this loop runs batch x gamma_max times a step); the best as a _Prefix
    value, tokens, context, drafting = base_value, 0, 0.0, 0
    best_rate, best_len, best_prefix, cut = base_value / price(0, 0.0, 0), 0, _Prefix(base_value), 0
    for n, (i, j) in enumerate(ranking, start=1):
        c = classes[i]
        size = len(c.members)
        k = size if cap is None else min(size, cap - tokens)
        if k <= 0:
            break
        value, tokens = value + k * c.gains[j - 1], tokens + k
        context += k * (c.context / size)
        drafting += k if j == 1 else 0
        rate = value / price(tokens, context, drafting)
        if rate > best_rate:
            best_rate, best_len, best_prefix, cut = rate, n, _Prefix(value, tokens, context, drafting), size - k
        if k < size:
            break  # the cap cut this class: nothing ranked later fits
    for i, j in ranking[:best_len]:
        classes[i].granted = j
    if cut:  # the best prefix ends in a class the cap cut: its last token goes to some members only
        i, j = ranking[best_len - 1]
        classes[i].granted, classes[i].partial = j - 1, len(classes[i].members) - cut
        return best_prefix
    if best_len < len(ranking):
        i, j = ranking[best_len]
        room = len(classes[i].members) - 1 if cap is None else min(len(classes[i].members) - 1,
                                                                   cap - best_prefix.tokens)
        k = _partial(classes[i], j, best_prefix, best_rate, price, room)
        classes[i].partial = k
        best_prefix = best_prefix.grow(classes[i], j, k)
    return best_prefix


def _partial(c: DraftClass, j: int, prefix: _Prefix, rate: float, price: StepPrice, room: int) -> int:
    """Largest k <= room such that token ``j`` for k members of ``c`` still raises the rate (bisection)."""
    lo, hi = 0, max(room, 0)
    while lo < hi:
        k = (lo + hi + 1) // 2
        p = prefix.grow(c, j, k)
        if p.value / price(p.tokens, p.context, p.drafting) > rate:
            lo = k
        else:
            hi = k - 1
    return lo
