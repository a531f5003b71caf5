"""The length model: censored median and spread, conditional quantile and mean, runaway odds, the population."""

from __future__ import annotations

import math
import random

import pytest

from seer.rollout.length_model import (
    MIN_SPREAD,
    PopulationLength,
    censored_mu,
    censored_spread,
    mean_remaining,
    quantile_remaining,
    runaway_posterior,
)
from seer.rollout.types import Group, RolloutRequest


def test_conditional_quantile_of_the_remaining_length() -> None:
    assert quantile_remaining(20, 0, 0.3, 0.99, 100) == pytest.approx(20 * math.exp(0.3 * 2.3263), rel=1e-3)
    assert 0 < quantile_remaining(20, 80, 0.3, 0.99, 100) <= 20  # far past the median: small, never zero
    assert quantile_remaining(20, 99, 0.3, 0.99, 100) == pytest.approx(1)


def test_runaway_posterior_and_mean_remaining() -> None:
    """A request far past its group's lengths is most likely a runaway; near the median it is not."""
    assert runaway_posterior(100, 60, 0.3, 0.0025) < 0.01
    assert runaway_posterior(100, 300, 0.3, 0.0025) > 0.5
    assert runaway_posterior(100, 300, 0.3, 0.0) == 0.0
    # E[L - g | L > g] for LogNormal(ln 100, 0.3), against a direct numerical integral
    sigma, g = 0.3, 120
    xs = [g + 0.5 * k for k in range(1, 4000)]
    dens = [math.exp(-0.5 * ((math.log(x) - math.log(100)) / sigma) ** 2) / (x * sigma) for x in xs]
    expected = sum((x - g) * d for x, d in zip(xs, dens)) / sum(dens)
    assert mean_remaining(100, g, sigma, 10**6) == pytest.approx(expected, rel=0.02)
    assert mean_remaining(100, 0, sigma, 10**6) == pytest.approx(100 * math.exp(0.045))
    assert mean_remaining(100, 990, sigma, 1000) == pytest.approx(10)  # never past max_tokens


def test_censored_mu_solves_the_score_equation() -> None:
    xs, cs, sigma = [4.0, 4.2], [4.5, 4.6], 0.3
    mu = censored_mu(xs, cs, sigma)
    z = [(c - mu) / sigma for c in cs]
    mills = [math.exp(-0.5 * a * a) / math.sqrt(2 * math.pi) / (0.5 * math.erfc(a / math.sqrt(2))) for a in z]
    assert sum(x - mu for x in xs) + sigma * sum(mills) == pytest.approx(0, abs=1e-7)
    assert mu > 4.1                                           # censored values pull the mean up
    assert censored_mu(xs, [], sigma) == pytest.approx(4.1)   # no censoring: the plain mean
    assert censored_mu(xs, cs, sigma, start=mu + 0.5) == pytest.approx(mu)
    with pytest.raises(ValueError, match="no finished"):
        censored_mu([], cs, sigma)


def test_censored_spread_on_complete_groups_is_the_pooled_sd() -> None:
    groups = [([math.log(10), math.log(20), math.log(40)], []) for _ in range(5)]
    s, dof = censored_spread(groups, 0.3, iterations=10)
    assert s == pytest.approx(math.log(2), rel=1e-6) and dof == 10
    assert censored_spread([], 0.3) == (0.3, 0)
    assert censored_spread([([1.0], [])], 0.3) == (0.3, 0)   # one value: no degree of freedom
    assert censored_spread([([2.0, 2.0], [])], 0.3)[0] == MIN_SPREAD  # identical lengths do not give sd 0


def test_censored_spread_is_unbiased_where_completed_groups_are_not() -> None:
    """Groups of 8 with sd 0.45, observed mid-rollout: each group has run to a little above its median, so values
    below that point are finished and the rest censored there. The groups that completed are the narrow ones
    (their pooled sd is far below 0.45); the censored estimate over all groups is close to the truth."""
    rng = random.Random(0)
    sigma = 0.45
    complete, partial = [], []
    for _ in range(400):
        mu = rng.gauss(0.0, 0.8)
        cut = mu + rng.uniform(0.2, 0.8)
        logs = [mu + rng.gauss(0.0, sigma) for _ in range(8)]
        xs, cs = [x for x in logs if x <= cut], [cut] * sum(x > cut for x in logs)
        if xs:
            (partial if cs else complete).append((xs, cs))
    ss = sum(sum((x - sum(xs) / len(xs)) ** 2 for x in xs) for xs, _ in complete)
    dof = sum(len(xs) - 1 for xs, _ in complete)
    assert math.sqrt(ss / dof) < 0.85 * sigma                # the completed-groups-only estimate
    s, n = censored_spread(partial, 0.3, ss, dof, iterations=200)
    assert s == pytest.approx(sigma, rel=0.08) and n > dof


def _group(gid: int, finished: list[int], generated: list[int]) -> Group:
    group = Group(gid, len(finished) + len(generated), 4000, finished_lengths=list(finished))
    for i, n in enumerate(generated):
        group.requests.append(RolloutRequest(gid * 100 + i, gid, i, 8, 4000, generated=n))
    return group


def test_population_fit_needs_enough_finished_responses() -> None:
    few = [_group(g, [100, 120], [50]) for g in range(7)]  # 14 finished
    assert PopulationLength.fit(few) is None
    enough = few + [_group(7, [110, 90], [])]
    fit = PopulationLength.fit(enough)
    assert fit is not None and fit.sigma > 0


def test_population_fit_counts_the_unfinished_as_censored() -> None:
    finished = [_group(g, [100, 120, 80, 110], []) for g in range(5)]
    plain = PopulationLength.fit(finished)
    with_long = PopulationLength.fit(finished + [_group(9, [], [600] * 8)])  # a long group still running
    assert plain is not None and with_long is not None
    assert with_long.mu > plain.mu  # the long group pulls the median up before any of it finishes
    # a request far beyond every finished response is expected to need far more than a typical one
    assert with_long.mean_remaining(600, 4000) > with_long.mean_remaining(50, 4000)
    assert with_long.mean_remaining(600, 610) <= 10


def test_population_fit_merges_repeated_lengths_without_changing_the_estimate() -> None:
    """The population fit weights each distinct length by its count; it must equal the EM over every response."""
    rng = random.Random(3)
    groups = [_group(g, [rng.choice([64, 96, 128, 300]) for _ in range(6)],
                     [rng.choice([32, 64, 96, 128]) for _ in range(2)]) for g in range(20)]
    fit = PopulationLength.fit(groups)
    assert fit is not None
    xs = [math.log(n) for g in groups for n in g.finished_lengths]
    cs = [math.log(r.generated) for g in groups for r in g.requests if not r.finished]
    mean = sum(xs) / len(xs)
    start = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    sigma, _ = censored_spread([(xs, cs)], start, iterations=20)
    assert fit.sigma == pytest.approx(sigma, rel=1e-12)
    assert fit.mu == pytest.approx(censored_mu(xs, cs, sigma, mean), rel=1e-12)
