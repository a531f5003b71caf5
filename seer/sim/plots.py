"""PNG plots of simulated rollouts: instance timelines, running requests, KV usage, finish-time CDF (the tail).

Why these four: they show *why* one policy beats another. Timelines show idle instances (static split) versus
continuously busy ones (divided rollout); running requests and KV usage show the baseline's preemption storms and
its shrinking batch in the tail; the finish-time CDF is the tail itself (the last 10% of responses). Matplotlib's
Agg backend, no display needed; imported only when plots are asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from seer.sim.sim_instance import Timeline
from seer.sim.simulate import PolicyRun


def _merge(intervals: Sequence[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    """Union of busy intervals, joining those separated by less than ``gap`` (fewer rectangles to draw)."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e - s) for s, e in out]


def _on_grid(tl: Timeline, values: list, grid: np.ndarray) -> np.ndarray:
    """A per-step series as a step function sampled on ``grid`` (0 before the first and after the last step)."""
    if not tl.start:
        return np.zeros_like(grid)
    starts = np.asarray(tl.start)
    ends = starts + np.asarray(tl.duration)
    idx = np.searchsorted(starts, grid, side="right") - 1
    vals = np.asarray(values, dtype=float)
    out = np.where(idx >= 0, vals[np.clip(idx, 0, None)], 0.0)
    return np.where(grid <= ends[-1], out, 0.0)


def _makespan(run: PolicyRun) -> float:
    return run.result.metrics.makespan_s


def write_plots(runs: Sequence[PolicyRun], out_dir: str | Path) -> dict[str, str]:
    """Write the four PNGs into ``out_dir``; returns their paths by kind."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("no runs to plot")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    horizon = max(_makespan(r) for r in runs)
    grid = np.linspace(0.0, horizon, 600)
    paths: dict[str, str] = {}

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.2 + 1.6 * len(runs)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        for iid, intervals in sorted(run.busy.items()):
            ax.broken_barh(_merge(intervals, horizon / 2000), (iid - 0.4, 0.8), color="tab:blue", linewidth=0)
        ax.axvline(_makespan(run), color="k", lw=0.8)
        ax.set_ylabel(f"{run.policy}\ninstance")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle("instance busy timelines")
    paths["timelines"] = _save(fig, out / "timelines.png", plt)

    for kind, label, attr in (("running", "running requests (all instances)", "running"),
                              ("kv_usage", "KV blocks in use (mean over instances)", "kv_frac")):
        fig, ax = plt.subplots(figsize=(10, 4))
        for run in runs:
            series = [_on_grid(tl, getattr(tl, attr), grid) for tl in run.timelines.values()]
            if not series:
                continue
            total = np.sum(series, axis=0) if attr == "running" else np.mean(series, axis=0)
            ax.plot(grid, total, label=run.policy, lw=1.2)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(label)
        ax.legend()
        paths[kind] = _save(fig, out / f"{kind}.png", plt)

    fig, ax = plt.subplots(figsize=(10, 4))
    for run in runs:
        t = np.sort([r.finish_time_s or 0.0 for r in run.result.responses])
        frac = np.arange(1, len(t) + 1) / len(t)
        line, = ax.plot(t, frac, label=f"{run.policy} (tail {run.result.metrics.tail_s:.0f} s)")
        ax.axvline(run.result.metrics.p90_s, color=line.get_color(), ls=":", lw=0.8)
    ax.axhline(0.9, color="gray", lw=0.6)
    ax.set_xlabel("finish time (s)")
    ax.set_ylabel("responses finished")
    ax.set_title("finish-time CDF: the tail is everything after the 90% line")
    ax.legend()
    paths["tail_cdf"] = _save(fig, out / "tail_cdf.png", plt)
    return paths


def _save(fig, path: Path, plt) -> str:  # noqa: ANN001 - matplotlib objects
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
