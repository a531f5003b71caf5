"""``seer simulate``: rollout policies on a simulated cluster (presets or trace files), plus calibration and the
baseline fit.

    seer simulate --workload qwen2vl-72b --policies verl,divided,context,seer,oracle --json out.json --plots DIR
    seer simulate --trace data/castillo_sample.jsonl.gz --instances 4 --policies verl,seer --json out.json
    seer simulate --calibrate steps.jsonl --model smollm2-135m --accelerator cpu-2core --json calib.json
    seer simulate --fit-baseline --workload all        # refit the unknowns, rewrite seer/sim/fitted.json
    seer simulate --replay benchmarks/rollout_x.json --json replay.json   # a measured run, simulated beside it

The JSON has the keys of ``seer bench rollout`` (policies, speedup_vs_verl, tail_reduction_vs_verl) plus
``sim`` (workload, cost model, quantum, simulator speed). Torch is never imported.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from seer.cli.common import write_json
from seer.rollout.metrics import REFERENCE_RATIOS, ratio_key
from seer.rollout.orderings import CONTEXT_RANKS, OrderingConfig
from seer.sim.simulate import SimConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate rollout policies on a cluster with a GPU cost model")
    src = p.add_argument_group("workload")
    src.add_argument("--workload", default=None, help="preset: moonlight, qwen2vl-72b, kimi-k2 ('all' with "
                                                      "--fit-baseline)")
    src.add_argument("--trace", default=None, help="trace file (token-id or length-only JSONL[.gz])")
    src.add_argument("--limit", type=int, default=None, help="first N groups of the trace")
    src.add_argument("--sample", type=int, default=None, help="N random groups of the trace (seeded)")
    src.add_argument("--max-tokens", type=int, default=None, help="response cap for a trace (default: longest)")
    src.add_argument("--seed", type=int, default=0, help="random seed (each group and sibling derives its own from it)")
    src.add_argument("--no-fitted", action="store_true", help="presets: ignore fitted.json (neutral defaults)")
    cl = p.add_argument_group("cluster")
    cl.add_argument("--instances", type=int, default=None, help="number of instances (default: the preset's)")
    cl.add_argument("--gpus-per-instance", type=int, default=None,
                    help="accelerators per instance (default: the preset's)")
    cl.add_argument("--accelerator", default=None, help="h800, h100, h200, a100, cpu-2core")
    cl.add_argument("--model", default=None, help="model profile (see seer.sim.hardware.MODELS)")
    cl.add_argument("--kv-tokens", type=int, default=None, help="KV capacity per instance in tokens")
    cl.add_argument("--constants", default=None, help="cost constants JSON (a --calibrate report)")
    run = p.add_argument_group("run")
    run.add_argument("--policies", default=None,
                     help="comma list of policies to run side by side (default verl,divided,context,seer,oracle; "
                          "with --replay, the ones the report ran)")
    run.add_argument("--chunk-tokens", type=int, default=None, help="divided-rollout chunk (default 8192 for "
                                                                   "presets, max_tokens/8 for traces)")
    run.add_argument("--quantum", type=int, default=SimConfig.quantum,
                     help="real tokens per simulated token (0: automatic)")
    run.add_argument("--acceptance", default=SimConfig.acceptance, help="auto, replay, paper, math_cot")
    run.add_argument("--accept-scale", type=float, default=SimConfig.accept_scale,
                     help="scale the acceptance model's tokens gained per verification (tau - 1), e.g. 0.5")
    run.add_argument("--context-rank", default=OrderingConfig.rank, choices=CONTEXT_RANKS,
                     help="context ordering of non-probes: hedged remaining length, or the paper's group order")
    run.add_argument("--json", default=None, help="write the report here")
    run.add_argument("--plots", default=None, help="write PNG plots into this directory")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--calibrate", default=None, metavar="STEPS_JSONL",
                   help="fit cost constants to measured steps {num_seqs, num_tokens, context_tokens, seconds}")
    p.add_argument("--fit-baseline", action="store_true", help="fit the presets' unknowns to the paper's veRL")
    p.add_argument("--replay", default=None, metavar="REPORT",
                   help="a `seer bench rollout` report: its samples and policies simulated, priced by what its "
                        "engine paid, beside the measured figures (--trace: the trace's path if it moved)")
    p.set_defaults(func=run_cli)


def _cluster(args: argparse.Namespace, base):  # noqa: ANN001, ANN202 - Cluster
    from seer.sim.hardware import get_accelerator, get_model
    inst = base.instance
    if args.accelerator:
        inst = replace(inst, accelerator=get_accelerator(args.accelerator))
    if args.model:
        inst = replace(inst, model=get_model(args.model))
    if args.gpus_per_instance:
        inst = replace(inst, gpus=args.gpus_per_instance)
    if args.kv_tokens is not None:
        if args.kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be >= 1, got {args.kv_tokens}")
        inst = replace(inst, kv_tokens=args.kv_tokens)
    n = args.instances if args.instances is not None else base.num_instances
    if n < 1:
        raise ValueError(f"--instances must be >= 1, got {n}")
    return replace(base, instance=inst, num_instances=n)


def _setup(args: argparse.Namespace):  # noqa: ANN202 - (Workload, Cluster, CostConstants, chunk)
    from seer.sim.cost_model import CostConstants
    from seer.sim.fitted import preset_setup
    from seer.sim.hardware import InstanceSpec, get_accelerator, get_model
    from seer.sim.workloads import Cluster, trace_workload

    if (args.workload is None) == (args.trace is None):
        raise ValueError("give exactly one of --workload PRESET or --trace FILE")
    if args.trace is not None:
        base = Cluster(InstanceSpec(get_accelerator("h100"), get_model("qwen2.5-7b"), 1), 4)
        cluster = _cluster(args, base)
        workload = trace_workload(args.trace, cluster, args.limit, args.sample, args.seed, args.max_tokens)
        constants = CostConstants()
        chunk = args.chunk_tokens or max(16, min(8192, workload.max_tokens // 8))
    else:
        workload, cluster, constants = preset_setup(args.workload, fitted=not args.no_fitted, seed=args.seed)
        cluster = _cluster(args, cluster)
        chunk = args.chunk_tokens or 8192
    if args.constants:
        data = json.loads(Path(args.constants).read_text())
        constants = CostConstants(**data.get("constants", data))
    return workload, cluster, constants, chunk


def run_cli(args: argparse.Namespace) -> int:
    if args.calibrate:
        return _calibrate(args)
    if args.fit_baseline:
        from seer.sim.fit import fit_presets
        names = None if args.workload in (None, "all") else [args.workload]
        record = fit_presets(names, progress=not args.no_progress)
        write_json(args.json, record)
        return 0
    from seer.rollout.policies import parse_policies
    from seer.sim.simulate import simulate

    if args.replay:
        return _replay(args)
    policies = [p.name for p in parse_policies(args.policies or "verl,divided,context,seer,oracle")]
    workload, cluster, constants, chunk = _setup(args)
    if args.quantum < 0:
        raise ValueError(f"--quantum must be >= 0, got {args.quantum}")
    config = SimConfig(quantum=args.quantum, chunk_tokens=chunk, acceptance=args.acceptance,
                       accept_scale=args.accept_scale,
                       ordering=OrderingConfig(rank=args.context_rank))
    out = simulate(workload, policies, cluster, constants, config, progress=not args.no_progress,
                   plots_dir=args.plots)
    write_json(args.json, out)
    _print_summary(out)
    return 0


def _print_summary(out: dict) -> None:
    speed = out["sim"]["speed"]
    base = next(k.removeprefix("speedup_vs_") for k in out if k.startswith("speedup_vs_"))
    for name, row in out["policies"].items():
        sp, tr = out[f"speedup_vs_{base}"].get(name), out[f"tail_reduction_vs_{base}"].get(name)
        extra = f"  tau {row['spec']['tau']:.2f}" if "spec" in row else ""
        print(f"{name:8s} makespan {row['makespan_s']:9.1f} s  tail {row['tail_s']:8.1f} s  "
              f"preempt {row['preemptions']:6d}  vs {base} {sp:5.2f}x  tail -{100 * (tr or 0):4.1f}%  "
              f"[{speed[name]['wall_s']:.1f} s, {speed[name]['events_per_s']:.0f} events/s]{extra}")
    for ours, ref in REFERENCE_RATIOS:
        if ratio_key(ours, ref) in out:
            print(f"{ours} reaches {100 * out[ratio_key(ours, ref)]:.1f}% of {ref} throughput")


def _calibrate(args: argparse.Namespace) -> int:
    from seer.sim.calibrate import calibrate, load_samples
    from seer.sim.hardware import InstanceSpec, get_accelerator, get_model

    inst = InstanceSpec(get_accelerator(args.accelerator or "cpu-2core"), get_model(args.model or "smollm2-135m"),
                        args.gpus_per_instance or 1, kv_tokens=args.kv_tokens or 1)
    report = calibrate(inst, load_samples(args.calibrate), seed=args.seed)
    d = report.to_dict()
    print(f"fitted on {d['n_train']} steps: held-out MAPE {100 * d['heldout_mape']:.1f}% "
          f"(max {100 * d['heldout_max_ape']:.1f}%) over {d['n_heldout']} steps; constants {d['constants']}")
    write_json(args.json, d)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from seer.rollout.policies import parse_policies
    from seer.sim.replay import replay, table

    policies = [p.name for p in parse_policies(args.policies)] if args.policies else None
    out = replay(args.replay, policies, trace=args.trace, progress=not args.no_progress)
    write_json(args.json, out)
    print(table(out))
    return 0
