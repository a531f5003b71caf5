"""Rollout metrics exactly as docs/design.md defines them, and the policy comparison of the bench report.

Why one module: the real rollout bench, trace replay and the simulator must produce the same JSON keys from
the same definitions, or their figures are not comparable. All times are seconds since rollout start.

Percentiles use the nearest-rank method: p-th percentile of n sorted values = value at rank ceil(p/100 * n)
(1-based). It always returns an observed finish time, and then "the time at which 90% of the responses had
finished" is exactly the p90 finish time, so tail_s = makespan_s - p90_s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ResponseRecord:
    """One finished response: when it finished and how many tokens it generated."""

    finish_time_s: float
    generated_tokens: int
    request_id: int | None = None
    group_id: int | None = None


@dataclass(frozen=True)
class RolloutMetrics:
    makespan_s: float
    throughput_tok_s: float
    tail_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    preemptions: int
    reprefill_tokens: int
    kv_bytes_moved: int
    idle_frac: list[float] = field(default_factory=list)
    num_responses: int = 0
    generated_tokens: int = 0
    # where each instance's time went; per instance compute_s + draft_s + kv_s + idle_s = makespan_s
    compute_s: list[float] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    kv_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)
    kv_frac: float = 0.0          # share of all instances' busy time spent moving KV to or from the pool
    reprefill_reasons: dict[str, int] = field(default_factory=dict)
    steps: int = 0                # steps that computed something, all instances together
    mean_batch: float = 0.0       # sequences per such step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (see the module docstring); p in (0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    ordered = sorted(values)
    rank = math.ceil(p / 100 * len(ordered) - 1e-9)
    return ordered[max(rank, 1) - 1]


def busy_time(intervals: Sequence[tuple[float, float]], horizon_s: float) -> float:
    """Length of the union of [start, end) intervals, clipped to [0, horizon_s]."""
    total, reach = 0.0, 0.0
    for start, end in sorted(intervals):
        if end < start:
            raise ValueError(f"busy interval ends before it starts: ({start}, {end})")
        start, end = max(start, reach, 0.0), min(end, horizon_s)
        if end > start:
            total += end - start
            reach = end
    return total


def time_split(intervals: Sequence[tuple[float, float]], costs: Sequence[tuple[float, float]],
               horizon_s: float) -> dict[str, float]:
    """One instance's time up to ``horizon_s``: compute, drafting, KV movement and idle.

    ``costs[j]`` is step j's (draft_s, kv_s) inside its busy interval ``intervals[j]``; a step that runs past the
    horizon counts in proportion. Compute is the rest of the busy time, so the four parts sum to the horizon.
    """
    busy = busy_time(intervals, horizon_s)
    draft = kv = 0.0
    for (start, end), (d, k) in zip(intervals, costs):
        inside = min(end, horizon_s) - start
        if inside > 0 and end > start:
            frac = inside / (end - start)
            draft += frac * d
            kv += frac * k
    return {"compute_s": max(busy - draft - kv, 0.0), "draft_s": draft, "kv_s": kv, "idle_s": horizon_s - busy}


def compute_metrics(
    responses: Sequence[ResponseRecord],
    busy_intervals: Sequence[Sequence[tuple[float, float]]],
    *,
    preemptions: int = 0,
    reprefill_tokens: int = 0,
    kv_bytes_moved: int = 0,
    step_costs: Sequence[Sequence[tuple[float, float]]] | None = None,
    reprefill_reasons: Mapping[str, int] | None = None,
    batches: Sequence[int] = (),
) -> RolloutMetrics:
    """Metrics of one rollout; `busy_intervals[i]` are instance i's busy (start, end) times,
    `step_costs[i]` the (draft_s, kv_s) inside each of them (none: all compute) and `batches` the sequences
    of every step that computed something."""
    if not responses:
        raise ValueError("no responses to measure")
    finish = [r.finish_time_s for r in responses]
    if min(finish) < 0:
        raise ValueError("a response finished before the rollout started")
    makespan = max(finish)
    if makespan <= 0:
        raise ValueError("makespan must be positive")
    tokens = sum(r.generated_tokens for r in responses)
    p90 = percentile(finish, 90)
    costs = step_costs if step_costs is not None else [[(0.0, 0.0)] * len(iv) for iv in busy_intervals]
    splits = [time_split(iv, c, makespan) for iv, c in zip(busy_intervals, costs)]
    busy = sum(s["compute_s"] + s["draft_s"] + s["kv_s"] for s in splits)
    return RolloutMetrics(
        makespan_s=makespan,
        throughput_tok_s=tokens / makespan,
        tail_s=makespan - p90,
        p50_s=percentile(finish, 50),
        p90_s=p90,
        p99_s=percentile(finish, 99),
        preemptions=preemptions,
        reprefill_tokens=reprefill_tokens,
        kv_bytes_moved=kv_bytes_moved,
        idle_frac=[s["idle_s"] / makespan for s in splits],
        num_responses=len(responses),
        generated_tokens=tokens,
        compute_s=[s["compute_s"] for s in splits],
        draft_s=[s["draft_s"] for s in splits],
        kv_s=[s["kv_s"] for s in splits],
        idle_s=[s["idle_s"] for s in splits],
        kv_frac=sum(s["kv_s"] for s in splits) / busy if busy > 0 else 0.0,
        reprefill_reasons=dict(reprefill_reasons or {}),
        steps=len(batches),
        mean_batch=sum(batches) / len(batches) if batches else 0.0,
    )


REPORT_KEYS = (
    "makespan_s", "throughput_tok_s", "tail_s", "p50_s", "p90_s", "p99_s",
    "preemptions", "reprefill_tokens", "kv_bytes_moved", "idle_frac",
)


def _row(report: RolloutMetrics | Mapping[str, Any]) -> dict[str, Any]:
    data = report.to_dict() if isinstance(report, RolloutMetrics) else dict(report)
    missing = [k for k in REPORT_KEYS if k not in data]
    if missing:
        raise ValueError(f"policy report lacks {', '.join(missing)}")
    return data


def compare(
    reports: Mapping[str, RolloutMetrics | Mapping[str, Any]], baseline: str = "verl"
) -> dict[str, Any]:
    """The bench JSON: per-policy rows plus speedup (throughput ratio) and tail reduction against `baseline`.

    speedup = throughput / baseline throughput; tail reduction = 1 - tail_s / baseline tail_s (0.84 means an
    84% shorter tail; None when the baseline has no tail).
    """
    if baseline not in reports:
        raise ValueError(f"baseline policy {baseline!r} not among the reports ({', '.join(reports)})")
    rows = {name: _row(rep) for name, rep in reports.items()}
    base = rows[baseline]
    speedup = {n: r["throughput_tok_s"] / base["throughput_tok_s"] for n, r in rows.items()}
    tail = {n: (1.0 - r["tail_s"] / base["tail_s"]) if base["tail_s"] > 0 else None for n, r in rows.items()}
    return {"policies": rows, f"speedup_vs_{baseline}": speedup, f"tail_reduction_vs_{baseline}": tail}


# Throughput ratios reported when both policies ran: how close `context` gets to the references.
REFERENCE_RATIOS = (("context", "oracle"), ("group-oracle", "oracle"), ("context", "group-oracle"))


def ratio_key(ours: str, ref: str) -> str:
    return f"{ours}_vs_{ref}".replace("-", "_")


def reference_ratios(throughputs: Mapping[str, float]) -> dict[str, float]:
    """``{"context_vs_oracle": ..., ...}`` for every pair of REFERENCE_RATIOS whose two policies both ran."""
    return {ratio_key(ours, ref): throughputs[ours] / throughputs[ref]
            for ours, ref in REFERENCE_RATIOS if ours in throughputs and ref in throughputs}
