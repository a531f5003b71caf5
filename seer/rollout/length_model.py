"""The within-group length model behind context-aware ranking: log-normal siblings, right-censored observations.

Why a module of its own: the context ordering (``orderings/context.py``) only needs "how much does this request
still have to generate", but answering it takes a small statistical model that deserves its own tests. Lengths of
one group are LogNormal(mu_g, s). A finished sibling is an observation; an unfinished one that has generated c
tokens is right-censored at c (it is known to be longer). From these come the group's median (``censored_median``),
the within-group spread ``s`` itself (``censored_spread``), and the quantities a ranking needs: the conditional
quantile and mean of what is left, and the posterior odds that a request is a degenerate runaway.

The spread must be estimated from censored data too. Estimating it from completed groups alone (every member
finished) is biased low mid-rollout: a group with one unusually long member completes late, so the groups that
complete first are the narrow ones, and the ranking matters most early. Measured in one simulated rollout each:
on the qwen2vl-72b preset (true within-group sd 0.44) the completed-groups estimate was 0.24 when 5% of the
responses had finished and 0.37 at 10% (EM: 0.29, 0.41); on kimi-k2 (true sd 0.22) no group had completed at
10%, and it was 0.11-0.17 until half had finished (EM: 0.20-0.24).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import ClassVar

from seer.rollout.types import Group

_NORMAL = NormalDist()
_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
MIN_SPREAD = 0.01  # floor of an estimated spread: identical lengths (forced replays) must not give sd 0
UNINFORMATIVE_Z = -3.0  # a request censored this many sds below its group's median tells nothing (survival > 0.998)


def _mills(a: float) -> tuple[float, float]:
    """Inverse Mills ratio phi(a) / (1 - Phi(a)) and its derivative (in (0, 1))."""
    tail = 0.5 * math.erfc(a / _SQRT2)
    lam = math.exp(-0.5 * a * a) * _INV_SQRT_2PI / tail if tail > 1e-300 else a + 1.0 / max(a, 1e-9)
    return lam, min(max(lam * (lam - a), 1e-12), 1.0)


def group_logs(group: Group) -> tuple[list[float], list[float]]:
    """(log lengths of finished siblings, log generated lengths of unfinished ones that have started)."""
    xs = [math.log(max(n, 1)) for n in group.finished_lengths]
    cs = [math.log(r.generated) for r in group.requests if not r.finished and r.generated > 0]
    return xs, cs


def censored_mu(xs: Sequence[float], cs: Sequence[float], sigma: float, start: float | None = None) -> float:
    """Maximum-likelihood mean of log length given observations ``xs`` and right-censored values ``cs``. Newton
    on the score sum(x - mu) + sigma * sum(lambda((c - mu) / sigma)), which falls monotonically in mu, inside a
    bracket; ``start`` (a previous estimate) makes it converge in a step or two."""
    return _weighted_mu(Counted.of(xs, ones=True), Counted.of(cs, ones=True), sigma, start)


@dataclass(frozen=True)
class Counted:
    """Values with multiplicities. A rollout's lengths repeat (integers, chunk ends), so the population fit
    evaluates each distinct value once, weighted by its count, instead of once per response."""

    values: list[float]
    counts: list[int]

    @classmethod
    def of(cls, values: Iterable[float], ones: bool = False) -> Counted:
        """``values`` as they are (``ones``: every count 1, the arithmetic of an unweighted sum) or merged."""
        if ones:
            vs = list(values)
            return cls(vs, [1] * len(vs))
        merged = Counter(values)
        return cls(list(merged), list(merged.values()))

    @property
    def total(self) -> int:
        return sum(self.counts)


def _weighted_mu(xs: Counted, cs: Counted, sigma: float, start: float | None) -> float:
    """``censored_mu`` over counted values."""
    if not xs.values:
        raise ValueError("no finished sibling to estimate from")
    n, sx = float(xs.total), sum(w * x for x, w in zip(xs.values, xs.counts))
    if not cs.values:
        return sx / n
    lo, hi = min(xs.values) - 1.0, max([*xs.values, *cs.values]) + 8.0 * sigma + 1.0
    mu = start if start is not None and lo < start < hi else sx / n
    censored = list(zip(cs.values, cs.counts))
    for _ in range(50):
        score, slope = sx - n * mu, -n
        for c, w in censored:
            lam, dlam = _mills((c - mu) / sigma)
            score += w * (sigma * lam)
            slope -= w * dlam
        if score > 0:
            lo = mu
        else:
            hi = mu
        step = mu - score / slope
        if abs(score) < 1e-9 or hi - lo < 1e-9:
            break
        mu = step if lo < step < hi else 0.5 * (lo + hi)
    return mu


def censored_median(group: Group, sigma: float) -> float:
    """The group's median length under LogNormal(mu, sigma), mu by censored maximum likelihood."""
    xs, cs = group_logs(group)
    if not xs:
        raise ValueError(f"group {group.group_id}: no finished sibling to estimate from")
    return math.exp(censored_mu(xs, cs, sigma))


def censored_spread(groups: Iterable[tuple[Sequence[float], Sequence[float]]], sigma: float,
                    base_ss: float = 0.0, base_dof: int = 0, iterations: int = 4) -> tuple[float, int]:
    """EM estimate of the within-group sd of log length, and its degrees of freedom.

    ``groups`` are (observed, censored) log lengths of groups with a finished sibling that are not complete;
    ``base_ss`` / ``base_dof`` are the pooled sum of squares and degrees of freedom of complete groups (exact:
    their means do not depend on the spread). E-step: a value censored at c contributes
    E[(X - mu)^2 | X > c] = s^2 (1 + a lambda(a)), a = (c - mu) / s. M-step: s^2 = total / (values - groups), the
    pooled unbiased form. Censored values far below the median (a < UNINFORMATIVE_Z) are left out: at the fixed
    point they would add s^2 to the total and one to the count, which changes nothing. ``iterations`` EM steps
    start from ``sigma`` (the previous estimate: called as data arrives, the iteration continues across calls).
    The estimate is at least MIN_SPREAD; (sigma, 0) when there is nothing to estimate from."""
    return _weighted_spread([(Counted.of(xs, ones=True), Counted.of(cs, ones=True)) for xs, cs in groups],
                            sigma, base_ss, base_dof, iterations)


def _weighted_spread(groups: Sequence[tuple[Counted, Counted]], sigma: float, base_ss: float = 0.0,
                     base_dof: int = 0, iterations: int = 4) -> tuple[float, int]:
    """``censored_spread`` over counted values."""
    data = [(xs, cs) for xs, cs in groups if xs.values]
    mus: list[float | None] = [None] * len(data)
    s, dof = sigma, base_dof
    for _ in range(iterations):
        ss, dof = base_ss, base_dof
        for k, (xs, cs) in enumerate(data):
            mu = mus[k] = _weighted_mu(xs, cs, s, mus[k])
            ss += sum(w * (x - mu) ** 2 for x, w in zip(xs.values, xs.counts))
            n = xs.total
            for c, w in zip(cs.values, cs.counts):
                a = (c - mu) / s
                if a >= UNINFORMATIVE_Z:
                    ss += w * (s * s * (1.0 + a * _mills(a)[0]))
                    n += w
            dof += n - 1
        if dof <= 0:
            return sigma, 0
        new = max(math.sqrt(ss / dof), MIN_SPREAD)
        converged = abs(new - s) < 1e-3 * s
        s = new
        if converged:
            break
    return s, dof


def runaway_posterior(center: float, generated: int, sigma: float, prior: float) -> float:
    """P(a request is a runaway that will run to max_tokens | it has generated `generated` tokens), when its
    group's lengths are LogNormal(ln center, sigma) except for a `prior` share of degenerate responses."""
    if prior <= 0 or generated <= 0:
        return prior
    a = (math.log(generated) - math.log(max(center, 1e-9))) / sigma
    survive = 0.5 * math.erfc(a / _SQRT2)
    return prior / (prior + (1.0 - prior) * survive)


def mean_remaining(center: float, generated: int, sigma: float, cap: int) -> float:
    """E[min(L, cap) - generated | L > generated] for L ~ LogNormal(ln center, sigma) (the cap applied to the
    conditional mean, which is close enough for a priority)."""
    mu = math.log(max(center, 1e-9))
    mean = math.exp(mu + 0.5 * sigma * sigma)
    if generated <= 0:
        return min(float(cap), mean)
    a = (math.log(generated) - mu) / sigma
    tail = 0.5 * math.erfc(a / _SQRT2)
    if tail > 1e-12:
        cond = mean * 0.5 * math.erfc((a - sigma) / _SQRT2) / tail
    else:  # deep in the tail the excess over `generated` is about generated * sigma / a
        cond = generated * (1.0 + sigma / a)
    return max(min(float(cap), cond) - generated, 0.0)


def quantile_remaining(center: float, generated: int, sigma: float, level: float, cap: int) -> float:
    """The `level` quantile of L - generated for L ~ LogNormal(ln center, sigma) conditioned on L > generated,
    with L capped at `cap` (max_tokens)."""
    mu = math.log(max(center, 1e-9))
    if generated <= 0:
        return min(float(cap), math.exp(mu + sigma * _NORMAL.inv_cdf(level)))
    a = (math.log(generated) - mu) / sigma
    tail = 0.5 * math.erfc(a / _SQRT2)
    if tail > 1e-12:
        z = _NORMAL.inv_cdf(1.0 - (1.0 - level) * tail)
    else:  # far in the tail the conditional excess of a standard normal is ~ exponential with rate a
        z = a - math.log(1.0 - level) / a
    return min(float(cap), math.exp(mu + sigma * z)) - generated


@dataclass(frozen=True)
class PopulationLength:
    """Lengths of all responses of a rollout as one LogNormal(mu, sigma): what a request whose siblings have
    revealed nothing is expected to need. Both are fitted with the unfinished responses right-censored at what
    they have generated (EM, as ``censored_spread``), so the short responses that finish first pass neither for
    the population's median nor for its spread."""

    mu: float
    sigma: float

    MIN_FINISHED: ClassVar[int] = 16  # finished responses before the fit replaces the budget

    @classmethod
    def fit(cls, groups: Iterable[Group]) -> PopulationLength | None:
        """The fit over every group's responses, or None while fewer than MIN_FINISHED have finished."""
        xs: list[float] = []
        cs: list[float] = []
        for group in groups:
            finished, censored = group_logs(group)
            xs += finished
            cs += censored
        if len(xs) < cls.MIN_FINISHED:
            return None
        mean = sum(xs) / len(xs)
        start = max(math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)), MIN_SPREAD)
        seen, running = Counted.of(xs), Counted.of(cs)
        sigma, _ = _weighted_spread([(seen, running)], start, iterations=20)
        return cls(_weighted_mu(seen, running, sigma, mean), sigma)

    def mean_remaining(self, generated: int, cap: int) -> float:
        """E[min(L, cap) - generated | L > generated] under the population's distribution."""
        return mean_remaining(math.exp(self.mu), generated, self.sigma, cap)
