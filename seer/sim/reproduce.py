"""The paper's results, predicted: every policy on every preset with the fitted baseline, next to the paper.

Why a module: the reproduction table of the README must come from one command anyone can rerun
(``python -m seer.sim.reproduce --json runs/sim/reproduce.json``), with the fitted unknowns of ``fitted.json``
and nothing else adjusted. It reports simulated veRL against the paper's veRL (what was fitted), Seer's predicted
speedup and tail reduction against the paper's (what was predicted), ``context`` against ``oracle`` (neither
speculates), and the ablation ladder of the paper's Table 4 (divided, + context, + grouped speculation).
``group-oracle`` (``context`` told each group's true median length) shows how much of the context-oracle gap a
better estimate from siblings could still close.

``--sensitivity F1,F2,...`` asks how the prediction depends on the one Seer input the paper gives for all its
workloads at once, the acceptance of sibling drafts (Table 2): it reruns ``seer-paper`` (the paper's stack) with
the acceptance model's tokens gained per verification scaled by each factor (``AcceptanceModel.scaled``), against
one veRL run, and reports the factor at which the predicted speedup would equal the paper's. An explanation, not a
fit: the reproduction above keeps factor 1.

``--length-sweep ICC1,... [--seeds S1,...]`` does the same for the length distribution: the within-group
correlation of log length (measured on CASTILLO, not published for the paper's workloads) and the sample drawn,
with veRL rerun on each draw, since lengths move veRL too.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from seer.rollout.orderings import CONTEXT_RANKS, OrderingConfig
from seer.sim.fitted import preset_setup
from seer.sim.simulate import SimConfig, run_policy, simulate
from seer.sim.workloads import PRESETS
from seer.utils.io import write_json

POLICIES = ("verl", "divided", "context", "seer-paper", "seer", "oracle", "group-oracle")


def reproduce_preset(name: str, config: SimConfig | None = None, progress: bool = False,
                     plots_dir: str | None = None) -> dict:
    workload, cluster, constants = preset_setup(name)
    out = simulate(workload, POLICIES, cluster, constants, config or SimConfig(record=plots_dir is not None),
                   progress=progress, plots_dir=plots_dir)
    paper = PRESETS[name].paper
    rows = out["policies"]
    out["paper"] = {"verl_total_s": paper.verl_total_s, "verl_tail_s": paper.verl_tail_s,
                    "verl_preemptions": paper.verl_preemptions, "seer_speedup": paper.seer_speedup,
                    "seer_tail_reduction": paper.seer_tail_reduction}
    out["prediction"] = {
        "verl_total_err": rows["verl"]["makespan_s"] / paper.verl_total_s - 1,
        "verl_tail_err": rows["verl"]["tail_s"] / paper.verl_tail_s - 1,
        "seer_speedup_err": out["speedup_vs_verl"]["seer-paper"] / paper.seer_speedup - 1,
        "seer_tail_reduction_pts": out["tail_reduction_vs_verl"]["seer-paper"] - paper.seer_tail_reduction,
    }
    if paper.verl_preemptions:
        out["prediction"]["verl_preemptions_err"] = rows["verl"]["preemptions"] / paper.verl_preemptions - 1
    return out


def acceptance_sensitivity(name: str, factors: Sequence[float], config: SimConfig | None = None) -> dict:
    """``seer-paper``'s predicted speedup over one veRL run with the acceptance model scaled by each factor, and the
    factor (linear interpolation between neighbours) at which it equals the paper's speedup, if in range."""
    workload, cluster, constants = preset_setup(name)
    config = config or SimConfig(record=False)
    verl = run_policy(workload, "verl", cluster, constants, config).result.metrics.makespan_s
    rows = {}
    for f in sorted(factors):
        run = run_policy(workload, "seer-paper", cluster, constants, replace(config, accept_scale=f))
        spec = run.spec
        assert spec is not None  # seer-paper speculates
        rows[f] = {"speedup": verl / run.result.metrics.makespan_s, "tau": spec["tau"],
                   "accept_rate": spec["accept_rate"], "makespan_s": run.result.metrics.makespan_s}
    target = PRESETS[name].paper.seer_speedup
    return {"verl_makespan_s": verl, "paper_speedup": target, "factors": {str(f): r for f, r in rows.items()},
            "matching_factor": matching_factor({f: r["speedup"] for f, r in rows.items()}, target)}


LENGTH_POLICIES = ("verl", "seer-paper", "seer")


def length_sensitivity(name: str, iccs: Sequence[float], seeds: Sequence[int],
                       config: SimConfig | None = None, instances: int | None = None) -> dict:
    """veRL, ``seer-paper`` and ``seer`` on the preset's lengths drawn with each within-group correlation (ICC of
    log length) and each seed, the fitted unknowns unchanged: how much the prediction rests on the length
    distribution the paper does not publish (its spread is fitted to veRL; how alike siblings are is not).
    ``instances``: a smaller cluster with the same load per instance (tests)."""
    config = config or SimConfig(record=False)
    paper = PRESETS[name].paper
    rows = {}
    for icc in iccs:
        for seed in seeds:
            workload, cluster, constants = preset_setup(name, seed=seed, icc=icc, instances=instances)
            runs = {p: run_policy(workload, p, cluster, constants, config).result.metrics for p in LENGTH_POLICIES}
            verl = runs["verl"].makespan_s
            rows[f"icc {icc:g}, seed {seed}"] = {
                "icc": icc, "seed": seed, "verl_makespan_s": verl, "verl_err": verl / paper.verl_total_s - 1,
                "verl_tail_s": runs["verl"].tail_s,
                **{f"{p}_speedup": verl / runs[p].makespan_s for p in LENGTH_POLICIES[1:]}}
    return {"paper_speedup": paper.seer_speedup, "paper_verl_total_s": paper.verl_total_s, "rows": rows}


def length_markdown(results: dict[str, dict]) -> str:
    lines = ["| workload | lengths | veRL sim / paper | veRL tail | seer-paper / paper | seer |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        for label, row in r["rows"].items():
            lines.append(f"| {name} | {label} | {row['verl_makespan_s']:,.0f} / {r['paper_verl_total_s']:,.0f} s "
                         f"({100 * row['verl_err']:+.0f}%) | {row['verl_tail_s']:,.0f} s | "
                         f"{row['seer-paper_speedup']:.2f}x / {r['paper_speedup']:.2f}x | {row['seer_speedup']:.2f}x |")
    return "\n".join(lines)


def matching_factor(speedups: dict[float, float], target: float) -> float | None:
    """The factor at which the speedup crosses ``target``, interpolated between the two measured neighbours;
    None when no measured interval brackets it."""
    points = sorted(speedups.items())
    for (f0, s0), (f1, s1) in zip(points, points[1:]):
        if (s0 - target) * (s1 - target) <= 0 and s1 != s0:
            return f0 + (target - s0) * (f1 - f0) / (s1 - s0)
    return None


def sensitivity_markdown(results: dict[str, dict]) -> str:
    factors = sorted({f for r in results.values() for f in r["factors"]}, key=float)
    lines = ["| workload | paper | " + " | ".join(f"scale {f}" for f in factors) + " | scale matching the paper |",
             "|---|---|" + "---|" * (len(factors) + 1)]
    for name, r in results.items():
        cells = [f"{r['factors'][f]['speedup']:.2f}x (tau {r['factors'][f]['tau']:.2f})" if f in r["factors"]
                 else "-" for f in factors]
        match = f"{r['matching_factor']:.2f}" if r["matching_factor"] is not None else "out of range"
        lines.append(f"| {name} | {r['paper_speedup']:.2f}x | " + " | ".join(cells) + f" | {match} |")
    return "\n".join(lines)


def markdown(results: dict[str, dict]) -> str:
    """The README tables: fit and prediction, then the ablation."""
    lines = ["| workload | veRL total sim / paper | veRL tail sim / paper | preemptions sim / paper | "
             "seer-paper speedup sim / paper | seer-paper tail cut sim / paper | context / oracle | "
             "group-oracle / oracle |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        v, p = r["policies"]["verl"], r["paper"]
        paper_pre = f"{p['verl_preemptions']:,}" if p["verl_preemptions"] else "-"
        pre = f"{v['preemptions']:,} / {paper_pre}"
        lines.append(f"| {name} | {v['makespan_s']:,.0f} / {p['verl_total_s']:,.0f} s | {v['tail_s']:,.0f} / "
                     f"{p['verl_tail_s']:,.0f} s | {pre} | {r['speedup_vs_verl']['seer-paper']:.2f}x / "
                     f"{p['seer_speedup']:.2f}x | -{100 * r['tail_reduction_vs_verl']['seer-paper']:.0f}% / "
                     f"-{100 * p['seer_tail_reduction']:.0f}% | {100 * r['context_vs_oracle']:.1f}% | "
                     f"{100 * r['group_oracle_vs_oracle']:.1f}% |")
    lines += ["", "| workload | veRL | divided | + context | + grouped SD (seer-paper) | seer | oracle (no SD) | "
              "group-oracle (no SD) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        cells = []
        for pol in POLICIES:
            row = r["policies"][pol]
            cells.append(f"{r['speedup_vs_verl'][pol]:.2f}x, tail {row['tail_s']:,.0f} s")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="predict the paper's results with the fitted baseline")
    ap.add_argument("--workloads", default=",".join(PRESETS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--plots", default=None, help="directory: one subdirectory of PNGs per workload")
    ap.add_argument("--quantum", type=int, default=0)
    ap.add_argument("--context-rank", default=OrderingConfig.rank, choices=CONTEXT_RANKS,
                    help="context ordering of non-probes (OrderingConfig.rank)")
    ap.add_argument("--accept-scale", type=float, default=1.0,
                    help="scale the acceptance model's tokens gained per verification (not the reproduction)")
    ap.add_argument("--sensitivity", default=None, metavar="F1,F2,...",
                    help="only veRL and seer-paper, once per acceptance scale factor (see the module docstring)")
    ap.add_argument("--length-sweep", default=None, metavar="ICC1,ICC2,...",
                    help="only veRL, seer-paper and seer, on lengths drawn with each within-group correlation")
    ap.add_argument("--seeds", default="0", help="with --length-sweep: comma list of length-sampling seeds")
    args = ap.parse_args(argv)
    if args.sensitivity and args.length_sweep:
        raise SystemExit("give one of --sensitivity and --length-sweep")
    if args.sensitivity and args.accept_scale != 1:
        raise SystemExit("--sensitivity sets the acceptance scale itself; drop --accept-scale")
    names = args.workloads.split(",")
    for name in names:
        if name not in PRESETS:
            raise SystemExit(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}")
    results = {}
    if args.length_sweep:
        iccs = [float(x) for x in args.length_sweep.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
        config = SimConfig(quantum=args.quantum, record=False, ordering=OrderingConfig(rank=args.context_rank))
        for name in names:
            results[name] = length_sensitivity(name, iccs, seeds, config)
            print(f"{name}: done", flush=True)
        print(length_markdown(results))
    elif args.sensitivity:
        factors = [float(f) for f in args.sensitivity.split(",")]
        config = SimConfig(quantum=args.quantum, record=False, ordering=OrderingConfig(rank=args.context_rank))
        for name in names:
            results[name] = acceptance_sensitivity(name, factors, config)
            print(f"{name}: matching factor {results[name]['matching_factor']}", flush=True)
        print(sensitivity_markdown(results))
    else:
        for name in names:
            plots = str(Path(args.plots) / name) if args.plots else None
            config = SimConfig(quantum=args.quantum, record=plots is not None,
                               ordering=OrderingConfig(rank=args.context_rank),
                               accept_scale=args.accept_scale)
            results[name] = reproduce_preset(name, config, progress=sys.stderr.isatty(), plots_dir=plots)
            print(f"{name}: {json.dumps(results[name]['prediction'])}", flush=True)
        print(markdown(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
