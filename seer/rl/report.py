"""Training report: reward, response length and rollout time per iteration, one line per rollout policy.

Putting the policies on the same axes is the point of the comparison run: on-policy fidelity means the reward
and length curves of ``verl`` and ``seer`` agree within noise (same algorithm, same seeds, same weights at
every step up to sampling noise), while the rollout-time panel shows what Seer buys. Also summarises a run into
the JSON the CLI writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _values(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [math.nan if r.get(key) is None else float(r[key]) for r in rows]


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-policy entry of ``seer train --json``: first/last reward and mean times per iteration."""
    if not rows:
        raise ValueError("no iterations to summarise")
    return {"iterations": len(rows),
            "reward_first": rows[0]["reward_mean"], "reward_last": rows[-1]["reward_mean"],
            "accuracy_first": rows[0].get("accuracy"), "accuracy_last": rows[-1].get("accuracy"),
            "rollout_s_mean": _mean(_values(rows, "rollout_s")),
            "iteration_s_mean": _mean(_values(rows, "iteration_s")),
            "rollout_wall_s_mean": _mean(_values(rows, "rollout_wall_s")),
            "iteration_wall_s_mean": _mean(_values(rows, "iteration_wall_s")),
            "rollout_tail_s_mean": _mean(_values(rows, "rollout_tail_s")),
            "throughput_tok_s_mean": _mean(_values(rows, "throughput_tok_s")),
            "tau_mean": _mean(_values(rows, "tau")),
            "response_len_mean": _mean(_values(rows, "response_len_mean")),
            "reward_curve": _values(rows, "reward_mean")}


def comparison(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """``{"policies": {name: summary}}`` plus the rollout and iteration speedups over verl when both ran."""
    report: dict[str, Any] = {"policies": {name: summarize(rows) for name, rows in runs.items()}}
    pol = report["policies"]
    if "verl" in pol:
        for key, out in (("rollout_s_mean", "rollout_speedup_vs_verl"),
                         ("iteration_s_mean", "iteration_speedup_vs_verl")):
            base = pol["verl"][key]
            report[out] = {name: (base / s[key] if base and s[key] else None) for name, s in pol.items()
                           if name != "verl"}
    return report


def plot_training(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Three panels (reward, response length, rollout time) against iteration; returns the PNG path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (("reward_mean", "accuracy", "reward (mean; dashed: accuracy)"),
              ("response_len_mean", "response_len_p90", "response length, tokens (mean; dashed: p90)"),
              ("rollout_s", "iteration_s", "seconds (rollout makespan; dashed: iteration)"))
    for ax, (key, second, label) in zip(axes, panels):
        for name, rows in runs.items():
            it = [r["iteration"] for r in rows]
            line, = ax.plot(it, _values(rows, key), marker="o", ms=3, label=name)
            ax.plot(it, _values(rows, second), ls="--", color=line.get_color(), alpha=0.6)
        ax.set_xlabel("iteration")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
