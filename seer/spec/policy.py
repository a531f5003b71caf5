"""Adaptive draft length: speculate only where it pays, and spend the verify budget where it gains most.

Why: verifying gamma draft tokens is almost free when the batch is small (decode is memory bound: the tail of a
rollout) and costs nearly gamma times a plain step when the batch is large (compute bound). The rule (docs/design.md):
with per-token acceptance ``a``, batch ``B`` and ``g`` draft tokens, the time per emitted token is

    T_SD(g) = (1 - a) * (D(B, g) + T(B, g)) / (1 - a ** (g + 1))

(``T(B, g)``: verify step with ``g`` drafts per sequence, i.e. ``g + 1`` tokens per sequence; ``D``: drafting
time), and speculation is worth it only when ``T_SD(g) < T(B, 0)``, the plain decode step. Acceptance is tracked
online (decayed counts per request, with the group's estimate as the prior, and for a new group the rollout's
own running estimate over all groups, itself starting from ``prior_accept``). The running estimate matters: a
fixed prior of 0.5 kept mid-size batches from ever drafting, so their real acceptance (0.75 on CASTILLO at T=0.7)
was never observed.
For a batch with different acceptances, drafts are handed out token by token in order of marginal expected gain
(draft token ``j`` of request ``i`` is accepted with probability ``a_i ** j``), probes first, and the prefix of
that order with the best tokens per second is kept; it is empty, i.e. speculation is off, on a large busy batch.

Tokens are not all worth the same to a synchronous rollout: it ends when its longest response ends, so a token
of a request with much left to generate shortens the makespan, while one of a request about to finish only
adds throughput. Each request may carry a ``weight`` (the speculator passes its estimated remaining length
relative to the batch mean, from the context scheduler's estimate) and the plan maximises weighted tokens per
second. With equal weights this is the plain rule above; with one long straggler in a busy batch it drafts for
the straggler alone, which costs the batch little and speeds the critical path by its acceptance length.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from seer.spec.budget import DraftClass, plan_budget

__all__ = ["VerifyCostModel", "AcceptanceTracker", "PolicyConfig", "SpecPolicy", "PolicyRequest", "t_sd"]


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation, linear extrapolation beyond the ends."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class VerifyCostModel:
    """Step time ``T(B, n)`` of a batch of ``B`` sequences with ``n`` tokens each (``n = 1``: plain decode), from
    a measured table, bilinear in between. The engine fills it by profiling (``to_profile`` round-trips).

    The table is measured at one short ``context``. A sequence at a longer context reads the difference once
    per step, ``read_s`` seconds per KV token, and each token it computes also attends to it, ``pair_s`` seconds
    per (token, context token) pair. A rollout's long responses decode at contexts of hundreds to thousands of
    tokens, where both matter: without the pairs drafting looks cheap where it is dear; with the read charged
    per token instead of per sequence (one slope for both), a plain step looks cheap and a draft token dear,
    and long contexts go undrafted (benchmarks/README.md, "Reads apart from pairs")."""

    def __init__(self, batch_sizes: Sequence[int], tokens_per_seq: Sequence[int],
                 times_s: Sequence[Sequence[float]], draft_s_per_request: float = 0.0, pair_s: float = 0.0,
                 context: float = 0.0, read_s: float = 0.0) -> None:
        if not batch_sizes or not tokens_per_seq:
            raise ValueError("the cost table needs at least one batch size and one tokens_per_seq")
        if list(batch_sizes) != sorted(set(batch_sizes)) or list(tokens_per_seq) != sorted(set(tokens_per_seq)):
            raise ValueError("batch_sizes and tokens_per_seq must be strictly increasing")
        if tokens_per_seq[0] != 1:
            raise ValueError("tokens_per_seq must start at 1 (the plain decode step)")
        if len(times_s) != len(batch_sizes) or any(len(row) != len(tokens_per_seq) for row in times_s):
            raise ValueError("times_s must be a len(batch_sizes) x len(tokens_per_seq) table")
        if any(t <= 0 for row in times_s for t in row) or draft_s_per_request < 0:
            raise ValueError("step times must be > 0 and draft_s_per_request >= 0")
        if pair_s < 0 or context < 0 or read_s < 0:
            raise ValueError("pair_s, read_s and context must be >= 0")
        self.batch_sizes = [float(b) for b in batch_sizes]
        self.tokens_per_seq = [float(n) for n in tokens_per_seq]
        self.times_s = [[float(t) for t in row] for row in times_s]
        self.draft_s_per_request = draft_s_per_request
        self.pair_s = pair_s
        self.read_s = read_s
        self.context = context
        self._floor_s = 0.01 * min(min(r) for r in self.times_s)  # step_time's floor (the table is fixed)

    @classmethod
    def from_profile(cls, profile: Mapping) -> "VerifyCostModel":
        """``{"batch_sizes": [...], "tokens_per_seq": [...], "times_s": [[...], ...], "draft_s_per_request": x}``"""
        try:
            return cls(profile["batch_sizes"], profile["tokens_per_seq"], profile["times_s"],
                       profile.get("draft_s_per_request", 0.0), profile.get("pair_s", 0.0),
                       profile.get("context", 0.0), profile.get("read_s", 0.0))
        except KeyError as exc:
            raise ValueError(f"cost profile lacks {exc.args[0]!r}") from None

    def to_profile(self) -> dict:
        return {"batch_sizes": [int(b) for b in self.batch_sizes], "tokens_per_seq": [int(n) for n in
                self.tokens_per_seq], "times_s": self.times_s, "draft_s_per_request": self.draft_s_per_request,
                "pair_s": self.pair_s, "context": self.context, "read_s": self.read_s}

    def row_for_batch(self, batch: float) -> list[float]:
        """``T(batch, n)`` for every profiled ``n`` (interpolated in B)."""
        return [_interp(self.batch_sizes, [row[j] for row in self.times_s], batch)
                for j in range(len(self.tokens_per_seq))]

    def step_time(self, batch: float, tokens_per_seq: float, row: Sequence[float] | None = None) -> float:
        """Interpolated ``T(B, n)``; never below 1% of the smallest measured time. ``row``: a cached
        ``row_for_batch(batch)``."""
        row = self.row_for_batch(batch) if row is None else row
        return max(_interp(self.tokens_per_seq, row, tokens_per_seq), self._floor_s)

    def draft_time(self, batch: float) -> float:
        return self.draft_s_per_request * batch


def critical_weights(hints: Sequence[float | None]) -> list[float]:
    """Each request's estimated remaining length (``hints``, None where the rollout gave no estimate) over the
    batch mean, and 1 without an estimate: the policy's token values, so drafts go first to the requests that
    bound the makespan. A floor of one token keeps a finishing request from dropping to zero value."""
    known = [max(h, 1.0) for h in hints if h is not None]
    if not known:
        return [1.0] * len(hints)
    mean = sum(known) / len(known)
    return [1.0 if h is None else max(h, 1.0) / mean for h in hints]


def t_sd(cost: VerifyCostModel, a: float, batch: int, gamma: int) -> float:
    """The time per emitted token (docs/design.md) when every request drafts ``gamma`` tokens (0: plain
    decode)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if gamma == 0:
        return cost.step_time(batch, 1)
    expected = gamma + 1.0 if a >= 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)
    return (cost.draft_time(batch) + cost.step_time(batch, gamma + 1)) / expected


@dataclass(frozen=True)
class PolicyConfig:
    gamma_max: int = 8
    prior_accept: float = 0.5  # per-token acceptance assumed for a group nothing is known about
    prior_weight: float = 4.0  # pseudo-trials behind a prior (global -> group -> request)
    decay: float = 0.95  # weight of the past per observed step (EMA of counts)
    global_decay: float = 0.999  # the same for the estimate over all groups (a window of ~1,000 observations)
    probe_boost: float = 2.0  # probes' marginal gains are ranked this much higher
    max_batch_tokens: int = 4096  # cap on draft tokens per step, all requests together

    def __post_init__(self) -> None:
        if self.gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1, got {self.gamma_max}")
        if not 0.0 < self.prior_accept < 1.0 or self.prior_weight <= 0:
            raise ValueError("prior_accept must be in (0, 1) and prior_weight > 0")
        if not 0.0 < self.decay <= 1.0 or not 0.0 < self.global_decay <= 1.0:
            raise ValueError("decay and global_decay must be in (0, 1]")
        if self.probe_boost < 1.0 or self.max_batch_tokens < 0:
            raise ValueError("probe_boost must be >= 1 and max_batch_tokens >= 0")


class AcceptanceTracker:
    """Per-token acceptance, online. Each verified draft position is a Bernoulli trial: ``accepted`` successes,
    plus one failure when the draft was cut short by a rejection (the geometric MLE)."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._requests: dict[Hashable, list[float]] = {}  # request -> [successes, trials] (decayed)
        self._groups: dict[Hashable, list[float]] = {}
        self._all = [0.0, 0.0]  # every observation, decayed with global_decay

    def observe(self, request_id: Hashable, group_id: Hashable, path_len: int, accepted: int) -> None:
        """``path_len``: the length of the draft path that was verified (linear: the draft length)."""
        if path_len < 1 or not 0 <= accepted <= path_len:
            raise ValueError(f"need 1 <= path_len and 0 <= accepted <= path_len, got {path_len}, {accepted}")
        trials = accepted + (1 if accepted < path_len else 0)
        lam = self.config.decay
        for table, key in ((self._requests, request_id), (self._groups, group_id)):
            s = table.setdefault(key, [0.0, 0.0])
            s[0] = lam * s[0] + accepted
            s[1] = lam * s[1] + trials
        g = self.config.global_decay
        self._all = [g * self._all[0] + accepted, g * self._all[1] + trials]

    def _blend(self, counts: list[float] | None, prior: float) -> float:
        w = self.config.prior_weight
        if counts is None:
            return prior
        return (counts[0] + w * prior) / (counts[1] + w)

    def global_accept(self) -> float:
        return self._blend(self._all if self._all[1] > 0 else None, self.config.prior_accept)

    def group_accept(self, group_id: Hashable) -> float:
        return self._blend(self._groups.get(group_id), self.global_accept())

    def accept(self, request_id: Hashable, group_id: Hashable) -> float:
        return self._blend(self._requests.get(request_id), self.group_accept(group_id))

    def forget(self, request_id: Hashable | None = None, group_id: Hashable | None = None) -> None:
        self._requests.pop(request_id, None)
        self._groups.pop(group_id, None)

    def check_integrity(self) -> None:
        for table in (self._requests, self._groups, {"all groups": self._all}):
            for key, (s, n) in table.items():
                assert 0 <= s <= n + 1e-9, f"acceptance counts of {key!r} broken: {s} of {n}"


@dataclass(frozen=True)
class PolicyRequest:
    request_id: Hashable
    group_id: Hashable
    is_probe: bool = False
    max_gamma: int | None = None  # e.g. tokens left before max_tokens
    weight: float = 1.0  # value of this request's tokens relative to the batch (critical-path priority)
    context: float = 0.0  # tokens its next token attends to (prompt and output so far)
    critical: bool = False  # the rollout isolated it: the step is planned for it first (``plan_budget``)

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


class SpecPolicy:
    """Chooses each running request's draft length for the next step."""

    def __init__(self, cost: VerifyCostModel, config: PolicyConfig | None = None) -> None:
        self.cost = cost
        self.config = config or PolicyConfig()
        self.tracker = AcceptanceTracker(self.config)

    def best_uniform_gamma(self, a: float, batch: int) -> int:
        """The draft-length rule (docs/design.md) for a uniform batch: the gamma minimising T_SD, or 0 when none
        beats T(B, 0)."""
        times = [t_sd(self.cost, a, batch, g) for g in range(self.config.gamma_max + 1)]
        return min(range(len(times)), key=lambda g: (times[g], g))

    def plan(self, batch: Sequence[PolicyRequest]) -> dict[Hashable, int]:
        """Draft length per request for one step (``plan_budget`` with the profiled step price, one class per
        request); all zeros when speculation does not pay."""
        cfg, n = self.config, len(batch)
        if n == 0:
            return {}
        classes = []
        cost, floor = self.cost, self.cost.context
        for r in batch:
            a = self.tracker.accept(r.request_id, r.group_id)
            cap = cfg.gamma_max if r.max_gamma is None else max(0, min(cfg.gamma_max, r.max_gamma))
            classes.append(DraftClass([a ** j * r.weight for j in range(1, cap + 1)], [r.request_id],
                                      context=max(0.0, r.context - floor), probe=r.is_probe,
                                      critical=r.critical, weight=r.weight))
        row = cost.row_for_batch(n)
        plain = cost.step_time(n, 1, row) + (cost.read_s + cost.pair_s) * sum(c.context for c in classes)

        def price(tokens: int, context: float, drafting: int) -> float:
            """The plain step at the batch's contexts, plus ``tokens`` draft tokens attending to ``context``
            tokens beyond the table's in all (``DraftClass.context`` is measured from there)."""
            extra = cost.step_time(n, 1 + tokens / n, row) - cost.step_time(n, 1, row) if tokens else 0.0
            return plain + extra + cost.pair_s * context + cost.draft_time(drafting)

        plan_budget(classes, price, sum(r.weight for r in batch), cfg.probe_boost, cfg.max_batch_tokens)
        return {c.members[0]: c.gamma(0) for c in classes}

    def observe(self, request_id: Hashable, group_id: Hashable, path_len: int, accepted: int) -> None:
        self.tracker.observe(request_id, group_id, path_len, accepted)

    def check_integrity(self) -> None:
        self.tracker.check_integrity()
