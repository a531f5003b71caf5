"""`seer bench rollout --samples K`: every policy on K seeded samples of a trace, summarised by median and worst.

Why: one sample of N groups is one draw, and a policy's gain over veRL moves from draw to draw (which groups hold
the runaway responses decides the tail), so a claim needs the spread, not one number. Sample i is exactly what the
single-sample command runs with `--seed S+i` (the groups drawn, their sampling seeds and the engine seed all follow
the seed), so any sample can be rerun alone, and each sample's report is the dict that command writes.

Samples take minutes each on a CPU, so the JSON is rewritten atomically after every sample and the same command
run again resumes after the last recorded one; a file made with other settings is refused, never overwritten. A
crash or Ctrl-C loses only the sample that was running.

The JSON: ``{"setup": {...}, "samples": [report, ...], "summary": {...}}``; the summary gives, per policy and
per sample, the speedup and tail reduction against veRL (where it ran), tail, makespan, makespan over the bound
and the time-split shares, then their median and worst over the samples (``WORST``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seer.bench import rollout_bench

METRICS = ("speedup", "tail_reduction", "tail_s", "makespan_s", "makespan_over_bound",
           "compute_share", "draft_share", "kv_share", "idle_share", "others_cpus")
# the worse end of each metric: less speedup, tail reduction or compute share; more of everything else (others_cpus:
# the CPUs other processes kept busy while the policy ran, seer/utils/cpu_load.py)
WORST: dict[str, Callable[[list[float]], float]] = {
    m: min if m in ("speedup", "tail_reduction", "compute_share") else max for m in METRICS}
UNMATCHED = ("samples", "seeds", "machine")  # setup keys that may differ between a run and its resumption


def check_args(args: argparse.Namespace) -> None:
    """User errors of ``--samples``, before anything runs."""
    if args.sample is None:
        raise ValueError("--samples needs --sample N (the groups in each sample)")
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    if not args.json:
        raise ValueError("--samples needs --json FILE (the samples are recorded there as they finish)")
    if args.peer:
        raise ValueError("--peer cannot be combined with --samples; run the peer on a single sample")


def sample_setup(args: argparse.Namespace, policies: list[str], dtype: str) -> dict[str, Any]:
    """The settings every sample shares, the trace's content hash and the machine."""
    from seer.rollout.arguments import recorded_args
    from seer.utils.machine import machine_info

    # --interleave is recorded only when on, so files written before the flag existed still resume
    setup: dict[str, Any] = {**recorded_args(args), "kv_fraction": args.kv_fraction,
                             **({"interleave": True} if args.interleave else {})}
    setup.update(trace_sha256=file_sha256(args.trace), policies=policies, dtype=dtype, samples=args.samples,
                 seeds=[args.seed + i for i in range(args.samples)], machine=machine_info(dtype))
    return setup


def file_sha256(path: str | Path) -> str:
    from seer.models.prepare import sha256_file

    if not Path(path).is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    return sha256_file(Path(path))


def recorded_samples(path: Path, setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples ``path`` already holds for this setup ([] when it does not exist); ValueError when it holds
    something else, so finished samples are never overwritten. Every rollout flag must match (one the file
    does not record must be at its default now)."""
    from seer.rollout.arguments import rollout_defaults

    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text())
        old, samples = doc["setup"], doc["samples"]
        if not isinstance(old, dict) or not isinstance(samples, list):
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{path} exists and is not a --samples report; pick another --json path") from None
    defaults = vars(rollout_defaults())
    differ = [key for key in {**old, **setup} if key not in UNMATCHED and old.get(key, defaults.get(key))
              != setup.get(key)]  # a flag an older file did not record ran at its default
    if differ:
        def there(key: str) -> str:
            return repr(old[key]) if key in old else f"not recorded (so {defaults.get(key)!r})"

        changes = "; ".join(f"{key}: {there(key)} there, {setup.get(key)!r} now" for key in differ)
        raise ValueError(f"{path} holds samples of another setup ({changes}); pick another --json path "
                         f"or rerun with its settings to resume")
    return list(samples)


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as JSON to a temporary file beside ``path``, then rename it over ``path`` (a crash leaves
    the previous file whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def sample_metrics(report: dict[str, Any], name: str) -> dict[str, float | None]:
    """One policy's figures in one sample's report (None where the report has none: no verl, no bound)."""
    row = report["policies"][name]
    split = row.get("time_split", {})
    return {"speedup": report.get("speedup_vs_verl", {}).get(name),
            "tail_reduction": report.get("tail_reduction_vs_verl", {}).get(name),
            "tail_s": row["tail_s"], "makespan_s": row["makespan_s"],
            "makespan_over_bound": report.get("makespan_over_bound", {}).get(name),
            **{m: split.get(m) for m in METRICS if m.endswith("_share")},
            "others_cpus": (row.get("machine_load") or {}).get("others_cpus")}


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def aggregate(values: list[float | None], pick: Callable[[list[float]], float]) -> float | None:
    """``pick`` (median, min or max) over the samples that have the figure; None when none has it."""
    present = [v for v in values if v is not None]
    return rounded(pick(present)) if present else None


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: each metric per sample, then its median and worst (``WORST``) over the samples."""
    names = list(samples[0]["policies"]) if samples else []
    policies = {}
    for name in names:
        rows = [sample_metrics(report, name) for report in samples]
        per_sample = {m: [rounded(row[m]) for row in rows] for m in METRICS}
        policies[name] = {"per_sample": per_sample,
                          "median": {m: aggregate(v, statistics.median) for m, v in per_sample.items()},
                          "worst": {m: aggregate(v, WORST[m]) for m, v in per_sample.items()}}
    return {"samples": len(samples), "baseline": "verl" if "verl" in names else None, "policies": policies}


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def sample_lines(report: dict[str, Any]) -> str:
    """One line per policy of one sample: speedup, makespan, tail, makespan over the bound."""
    lines = []
    for name in report["policies"]:
        m = sample_metrics(report, name)
        lines.append(f"  {name:<16}{fmt(m['speedup'], '.2f', 'x'):>7} vs verl  makespan {m['makespan_s']:.1f} s  "
                     f"tail {m['tail_s']:.1f} s  /bound {fmt(m['makespan_over_bound'], '.2f')}")
    return "\n".join(lines)


def samples_table(summary: dict[str, Any]) -> str:
    """The policies over all samples, as a fixed-width table of medians and worsts."""
    head = (f"{'policy':<16}{'speedup med':>12}{'worst':>8}{'tail red med':>13}{'/bound med':>11}{'worst':>8}"
            f"{'idle med':>9}")
    lines = [f"over {summary['samples']} samples (speedup and tail reduction vs verl)", head, "-" * len(head)]
    for name, pol in summary["policies"].items():
        med, worst = pol["median"], pol["worst"]
        lines.append(f"{name:<16}{fmt(med['speedup'], '.2f', 'x'):>12}{fmt(worst['speedup'], '.2f', 'x'):>8}"
                     f"{fmt(med['tail_reduction'], '.0%'):>13}{fmt(med['makespan_over_bound'], '.2f'):>11}"
                     f"{fmt(worst['makespan_over_bound'], '.2f'):>8}{fmt(med['idle_share'], '.0%'):>9}")
    return "\n".join(lines)


def plot_samples(summary: dict[str, Any], path: Path, title: str) -> Path:
    """Per policy, every sample's speedup vs verl (makespan over the bound where verl did not run) as points,
    the median as a bar across them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = "speedup" if summary["baseline"] else "makespan_over_bound"
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(summary["policies"]) + 2), 4.5))
    for x, pol in enumerate(summary["policies"].values()):
        values = [v for v in pol["per_sample"][metric] if v is not None]
        ax.scatter([x] * len(values), values, alpha=0.6)
        if pol["median"][metric] is not None:
            ax.hlines(pol["median"][metric], x - 0.3, x + 0.3, color="black", lw=1.5)
    ax.axhline(1.0, color="grey", lw=0.5, ls="--")
    ax.set_xticks(range(len(summary["policies"])), list(summary["policies"]))
    ax.set_ylabel("throughput vs verl" if metric == "speedup" else "makespan / bound")
    ax.set_title(f"{title}\npoints: samples, bars: median", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_one(args: argparse.Namespace, model: Path, index: int) -> dict[str, Any]:
    """Sample ``index``: the single-sample bench with ``--seed`` advanced by ``index``; its report."""
    from seer.rollout.arguments import build_groups

    seed = args.seed + index
    sample_args = argparse.Namespace(**{**vars(args), "seed": seed})
    groups = build_groups(sample_args, model)
    print(f"sample {index + 1}/{args.samples} (seed {seed}): {len(groups)} groups, "
          f"{sum(g.size for g in groups)} responses", flush=True)
    report, results = rollout_bench.run_sample(sample_args, model, groups)
    report["setup"]["seed"] = seed
    rollout_bench.save_sampled_tokens(args.json, seed, groups, results, fresh=index == 0)
    return report


def run_samples(args: argparse.Namespace) -> int:
    """The samples ``--json`` lacks, one after another, the file rewritten after each; then the summary."""
    from seer.models.prepare import resolve_model
    from seer.rollout.arguments import rollout_config
    from seer.rollout.policies import parse_policies

    check_args(args)
    policies = [p.name for p in parse_policies(args.policies)]
    path = Path(args.json)
    model = resolve_model(args.model)
    setup = sample_setup(args, policies, rollout_config(args, policies[0]).engine.dtype)
    samples = recorded_samples(path, setup)
    if samples:
        last = args.seed + len(samples) - 1
        print(f"{path}: {len(samples)} sample(s) already recorded (seeds {args.seed}..{last}), skipping them; "
              f"{'nothing to run' if len(samples) >= args.samples else 'continuing with the next'}")
    setup.update(samples=max(args.samples, len(samples)),
                 seeds=[args.seed + i for i in range(max(args.samples, len(samples)))])
    for index in range(len(samples), args.samples):
        samples.append(run_one(args, model, index))
        write_atomic(path, {"setup": setup, "samples": samples, "summary": summarize(samples)})
        print(sample_lines(samples[-1]), flush=True)
    summary = summarize(samples)
    print(samples_table(summary))
    png = plot_samples(summary, path.with_suffix(".png"),
                       f"{len(samples)} samples of {args.sample} groups from {Path(args.trace).name}")
    print(f"report {path}, plot {png}")
    return 0
