"""The draft budget shared by the engine and the simulator: best prefix of the value ranking, classes, caps."""

from __future__ import annotations

from seer.spec.budget import DraftClass, plan_budget


def linear_price(fixed: float, per_token: float):
    """A step of ``fixed`` seconds plus ``per_token`` per draft token (context and drafters free)."""
    return lambda tokens, context, drafting: fixed + per_token * tokens


def test_free_tokens_are_all_taken_costly_ones_none() -> None:
    c = DraftClass([0.5 ** j for j in range(1, 5)], ["a", "b"])
    assert plan_budget([c], linear_price(1.0, 0.0), 2.0) == 8 and c.granted == 4 and c.partial == 0
    c = DraftClass([0.5 ** j for j in range(1, 5)], ["a", "b"])
    assert plan_budget([c], linear_price(1.0, 1.0), 2.0) == 0 and c.gamma(0) == c.gamma(1) == 0


def test_tokens_kept_while_value_per_second_rises() -> None:
    # value 1 per plain request (4 of them), step 1 s; a token of value v raises the rate iff v > rate * 0.1
    gains = [0.9, 0.6, 0.3, 0.1]
    c = DraftClass(list(gains), list(range(4)))
    plan_budget([c], linear_price(1.0, 0.1), 4.0)
    rates = []
    value, t = 4.0, 1.0
    for g in gains:
        value, t = value + 4 * g, t + 0.4
        rates.append(value / t)
    assert c.granted == 1 + rates.index(max(rates))  # the best prefix, computed by hand


def test_partial_class_and_probe_boost() -> None:
    # a class of 10 whose first token pays for three members only: draft tokens beyond 3 cost a second each
    crowd = DraftClass([0.5], list(range(10)))
    plan_budget([crowd], lambda tokens, context, drafting: 1.0 + max(0, tokens - 3), 10.0)
    assert crowd.granted == 0 and crowd.partial == 3 and [crowd.gamma(i) for i in (2, 3)] == [1, 0]
    # equal values: the probe is ranked first only with a boost
    probe, other = DraftClass([0.5], ["p"], probe=True), DraftClass([0.6], ["o"])

    def one_token(tokens: int, context: float, drafting: int) -> float:
        return 1.0 if tokens <= 1 else 100.0

    plan_budget([other, probe], one_token, 2.0, probe_boost=2.0)
    assert (probe.granted, other.granted) == (1, 0)
    plan_budget([other, probe], one_token, 2.0, probe_boost=1.0)
    assert (probe.granted, other.granted) == (0, 1)


def test_cap_context_and_drafters_reach_the_price() -> None:
    seen: list[tuple[int, float, int]] = []

    def price(tokens: int, context: float, drafting: int) -> float:
        seen.append((tokens, context, drafting))
        return 1.0

    a, b = DraftClass([0.9, 0.8], ["x", "y"], context=300.0), DraftClass([0.7], ["z"], context=50.0)
    assert plan_budget([a, b], price, 3.0, max_tokens=3) == 3
    assert (a.granted, a.partial, b.granted) == (1, 1, 0)  # x, y token 1 and x token 2; z is past the cap
    assert seen[:3] == [(0, 0.0, 0), (2, 300.0, 2), (3, 450.0, 2)]
    assert plan_budget([a, b], price, 0.0) == 0 and a.granted == 0  # no plain tokens: nothing to speed up



def test_a_critical_request_is_planned_first_and_the_rest_fit_in_the_slack() -> None:
    # four draft tokens are free, each one more costs 2% of the step: the critical request (weight 3, acceptance
    # 0.5) takes the free ones, and its companions (acceptance 0.95) only what keeps the step within the slack
    def price(tokens: int, context: float, drafting: int) -> float:
        return 1.0 + 0.02 * max(0, tokens - 4)

    def batch(critical: bool) -> tuple[DraftClass, DraftClass]:
        crit = DraftClass([3.0 * 0.5 ** j for j in range(1, 9)], ["r"], critical=critical, weight=3.0)
        return crit, DraftClass([0.95 ** j for j in range(1, 9)], ["a", "b", "c", "d"])

    def own_rate(c: DraftClass, tokens: int) -> float:
        """The critical request's expected tokens per second."""
        return (1.0 + sum(0.5 ** j for j in range(1, c.granted + 1))) / price(tokens, 0.0, 0)

    crit, mates = batch(True)
    total = plan_budget([mates, crit], price, 7.0, slack=0.05)
    assert crit.granted == 4  # its own best: a fifth token is worth 0.5 ** 5 of a token for 2% of the step
    assert (mates.granted, mates.partial) == (0, 2) and total == 6  # 1.04 s <= 1.05 s; a seventh token: 1.06 s
    fast = own_rate(crit, total)
    crit, mates = batch(True)
    assert plan_budget([mates, crit], price, 7.0, slack=0.0) == 4 and mates.gamma(0) == 0
    # without the flag the step is planned for its total value: the companions' drafts slow the critical stream
    crit, mates = batch(False)
    total = plan_budget([mates, crit], price, 7.0)
    assert mates.granted >= 4 and total > 20 and own_rate(crit, total) < 0.8 * fast
