"""Rollout report plots: per-instance busy timeline, where instance time went, length distribution, finish-time
CDF.

One PNG per rollout (four panels side by side), written next to the JSON report: the shape of the tail and the
idle time it leaves are easier to see than to read from percentiles. With a ``bound_s`` the CDF marks the
makespan no policy can beat.
"""

from __future__ import annotations

from pathlib import Path

from seer.rollout.types import RolloutResult

SPLIT = (("compute_s", "compute"), ("draft_s", "drafting"), ("kv_s", "KV movement"), ("idle_s", "idle"))


def plot_rollout(results: dict[str, RolloutResult], path: str | Path, title: str = "",
                 bound_s: float | None = None) -> Path:
    """``results``: policy name -> result. Draws every policy into the same four panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    tl, split, hist, cdf = axes
    names = list(results)
    row = 0
    for name in names:
        busy = results[name].stats.get("busy", {})
        for iid in sorted(busy):
            tl.broken_barh([(s, e - s) for s, e in busy[iid]], (row - 0.4, 0.8))
            row += 1
    labels = [f"{n}/i{iid}" for n in names for iid in sorted(results[n].stats.get("busy", {}))]
    tl.set_yticks(range(len(labels)), labels)
    tl.set_xlabel("time (s)")
    tl.set_title("instance busy timeline")
    bottom = [0.0] * len(names)
    for key, label in SPLIT:
        values = [sum(getattr(results[n].metrics, key)) for n in names]
        split.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    split.set_ylabel("instance seconds (all instances)")
    split.set_title("where instance time went")
    split.legend()
    for name in names:
        lengths = [len(r.token_ids) for r in results[name].responses]
        hist.hist(lengths, bins=30, alpha=0.5, label=name)
        times = sorted(r.finish_time_s or 0.0 for r in results[name].responses)
        cdf.plot(times, [(i + 1) / len(times) for i in range(len(times))], label=name)
    hist.set_xlabel("response length (tokens)")
    hist.set_title("length distribution")
    cdf.axhline(0.9, color="grey", lw=0.5, ls="--")
    if bound_s is not None:
        cdf.axvline(bound_s, color="black", lw=0.8, ls=":", label=f"bound {bound_s:.3g} s")
    cdf.set_xlabel("finish time (s)")
    cdf.set_ylabel("fraction of responses finished")
    cdf.set_title("finish-time CDF (tail right of the 0.9 line)")
    cdf.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
