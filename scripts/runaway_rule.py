"""How well the context ordering's runaway rule finds runaways on a trace: precision and recall, from lengths alone.

Why: the ordering ranks a request as a runaway (its whole budget left) once the posterior odds that it
degenerated pass ``1 - hedge`` (``seer.rollout.length_model.runaway_posterior``), given its finished siblings.
A rule that fires too often spends the budget's priority (and critical-path instances) on ordinary long
responses; one that fires late leaves the real runaway in the tail. This replays each group as if its members
advanced together, one token at a time (what the ``attained`` order approximates), and records when each
response is flagged. A response is a runaway when it is more than ``--factor`` times the median of its siblings.
Reported: responses flagged at all (precision = runaways among them) and runaways flagged before they reached
half their length (recall), with the spread the ordering assumes before it has measured one (0.30).

    python scripts/runaway_rule.py --trace data/math_cot_groups.jsonl
"""

from __future__ import annotations

import argparse
import math
import statistics

from seer.data.traces import load_trace
from seer.rollout.length_model import censored_mu, runaway_posterior
from seer.rollout.orderings import OrderingConfig


def flag_points(lengths: list[int], sigma: float, prior: float, hedge: float) -> list[int | None]:
    """Per response, the generated length at which the rule first flags it (None: never), members advancing
    together; checked every token up to 64, then every 1/64 of the length reached (long traces)."""
    flagged: list[int | None] = [None] * len(lengths)
    g = 0
    while g < max(lengths) - 1:
        g += max(1, g // 64)
        finished = [math.log(n) for n in lengths if n <= g]
        running = [i for i, n in enumerate(lengths) if n > g and flagged[i] is None]
        if not finished or not running:
            continue
        censored = [math.log(g)] * sum(1 for n in lengths if n > g)
        center = math.exp(censored_mu(finished, censored, sigma))
        if runaway_posterior(center, g, sigma, prior) > 1.0 - hedge:
            for i in running:
                flagged[i] = g
    return flagged


def main() -> None:
    cfg = OrderingConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="data/math_cot_groups.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--factor", type=float, default=2.0, help="a runaway is this many times its siblings' median")
    ap.add_argument("--sigma", type=float, default=cfg.spread_prior)
    ap.add_argument("--prior", type=float, default=cfg.runaway_prior)
    ap.add_argument("--hedge", type=float, default=cfg.hedge)
    a = ap.parse_args()
    responses = runaways = flagged = true_flags = early = 0
    examples = []
    for group in load_trace(a.trace, limit=a.limit):
        lengths = [max(1, r.length) for r in group.responses]
        points = flag_points(lengths, a.sigma, a.prior, a.hedge)
        for i, (n, at) in enumerate(zip(lengths, points)):
            others = statistics.median(lengths[:i] + lengths[i + 1:])
            truth = n > a.factor * others
            responses += 1
            runaways += truth
            flagged += at is not None
            true_flags += truth and at is not None
            early += truth and at is not None and at <= n / 2
            if truth:
                examples.append(f"{group.group_id}[{i}] {n} tokens (siblings' median {others:.0f}): "
                                f"{'flagged at ' + str(at) if at is not None else 'never flagged'}")
    print(f"{a.trace}: {responses} responses, {runaways} runaways (> {a.factor:g}x their siblings' median), "
          f"{flagged} flagged")
    print(f"precision {true_flags / flagged if flagged else float('nan'):.2f}  recall (flagged by half their length) "
          f"{early / runaways if runaways else float('nan'):.2f}  (sigma {a.sigma}, prior {a.prior}, hedge {a.hedge})")
    for line in examples[:8]:
        print("  " + line)


if __name__ == "__main__":
    main()
