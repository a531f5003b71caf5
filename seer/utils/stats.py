"""Chi-square tests and their power: the statistics behind Seer's on-policy checks.

Why here: the claim that drafting, pausing and migrating requests leave the sampling distribution unchanged is
checked by the tests (tests/engine/test_verify_statistics.py, tests/rollout/test_onpolicy.py) and by ``seer bench
onpolicy`` on the user's own model, and all must judge it the same way. scipy is not a dependency, so the
chi-square survival function comes from torch's regularised upper incomplete gamma function.

A p-value alone says nothing when a test could not have seen a bias, so every test here comes with its power:
``detectable_tv`` gives the smallest total-variation distortion a test detects with probability 0.9 in any
direction (the Pearson statistic is approximately noncentral chi-square with lambda = n * chi2-distance, and by
Cauchy-Schwarz a total-variation shift delta has chi2-distance >= 4 delta^2). Two samples of n_a and n_b behave
like one of n_a n_b / (n_a + n_b) (n / 2 for equal sizes).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ChiSquare:
    """One Pearson test: the statistic, its degrees of freedom (pooled bins - 1) and the p-value."""

    statistic: float
    df: int
    pvalue: float

    @property
    def bins(self) -> int:
        return self.df + 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def chi2_sf(x: float, df: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma). torch is imported
    here, not with the module: the CLI imports this module to build its parser, and torch takes seconds."""
    import torch

    a = torch.tensor(df / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2, dtype=torch.float64)))


def chi2_isf(alpha: float, df: int) -> float:
    """The critical value: the x with ``chi2_sf(x, df) == alpha`` (bisection)."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def noncentral_power(lam: float, df: int, alpha: float) -> float:
    """P(noncentral chi-square(df, lam) > the central critical value): a Poisson(lam / 2) mixture of central ones."""
    crit = chi2_isf(alpha, df)
    half = lam / 2
    weight, total = math.exp(-half), 0.0
    for j in range(int(half + 12 * math.sqrt(half + 1) + 30)):
        total += weight * chi2_sf(crit, df + 2 * j)
        weight *= half / (j + 1)
    return total


def detectable_tv(n: float, bins: int, alpha: float = 1e-3, power: float = 0.9) -> float:
    """The smallest total variation on ``bins`` bins that ``n`` draws detect with ``power`` in any direction
    (for two samples pass ``effective_n``)."""
    if bins < 2 or n <= 0:
        return 1.0
    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if noncentral_power(mid, bins - 1, alpha) < power else (lo, mid)
    return min(1.0, math.sqrt(hi / (4 * n)))


def effective_n(na: int, nb: int) -> float:
    """The one-sample size a two-sample test of ``na`` against ``nb`` is as powerful as."""
    return na * nb / (na + nb) if na and nb else 0.0


def pooled(observed: Sequence[float], expected: Sequence[float], minimum: float = 5.0
           ) -> tuple[list[float], list[float]]:
    """Bins with positive expectation; the smallest are pooled (in order of expectation) until each pool reaches
    ``minimum``, a remainder joins the last pool. Pearson's approximation needs expected counts of about 5 or
    more; pooling the tail instead of dropping it keeps every draw in the test."""
    obs: list[float] = []
    exp: list[float] = []
    acc_o, acc_e = 0.0, 0.0
    for i in sorted((i for i, e in enumerate(expected) if e > 0), key=lambda i: expected[i]):
        acc_o, acc_e = acc_o + observed[i], acc_e + expected[i]
        if acc_e >= minimum:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o, acc_e = 0.0, 0.0
    if acc_e > 0:
        if obs:
            obs[-1] += acc_o
            exp[-1] += acc_e
        else:
            obs.append(acc_o)
            exp.append(acc_e)
    return obs, exp


def goodness_of_fit(counts: Sequence[int], probs: Sequence[float], max_bins: int | None = None) -> ChiSquare:
    """Pearson goodness-of-fit of ``counts`` against ``probs``. Bins expecting < 5 are pooled; with ``max_bins``,
    pools are made large enough that there are at most that many (so the stated power holds whatever the
    target's tail). A draw where the target has no mass is a certain failure: p = 0."""
    n = sum(counts)
    minimum = 5.0 if max_bins is None else max(5.0, n / max_bins)
    obs, exp = pooled(counts, [n * p for p in probs], minimum)
    df = max(len(obs) - 1, 0)
    if any(c > 0 and p <= 0 for c, p in zip(counts, probs)):
        return ChiSquare(math.inf, df, 0.0)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return ChiSquare(stat, df, chi2_sf(stat, df) if df else 1.0)


def homogeneity(a: Sequence[Hashable], b: Sequence[Hashable], minimum: float = 20.0) -> ChiSquare:
    """Pearson chi-square two-sample test that ``a`` and ``b`` come from one distribution. Categories are pooled
    in order of their combined count until each pool expects >= ``minimum`` in each sample (rare categories,
    e.g. long-tail tokens, would otherwise break the approximation); a remainder joins the last pool. Fewer than
    two pools: nothing to compare, p = 1."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    smaller = min(na, nb) / max(na + nb, 1)
    pools: list[list[int]] = []
    acc = [0, 0]
    for key in sorted(set(ca) | set(cb), key=lambda k: (ca[k] + cb[k], repr(k))):
        acc = [acc[0] + ca[key], acc[1] + cb[key]]
        if (acc[0] + acc[1]) * smaller >= minimum:
            pools.append(acc)
            acc = [0, 0]
    if acc[0] + acc[1]:
        if pools:
            pools[-1] = [pools[-1][0] + acc[0], pools[-1][1] + acc[1]]
        else:
            pools.append(acc)
    if len(pools) < 2:
        return ChiSquare(0.0, max(len(pools) - 1, 0), 1.0)
    stat = 0.0
    for oa, ob in pools:
        ea, eb = (oa + ob) * na / (na + nb), (oa + ob) * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    return ChiSquare(stat, len(pools) - 1, chi2_sf(stat, len(pools) - 1))
