"""``seer rollout``: one synchronous RL rollout (groups of G responses per prompt) over N engine instances.

Writes every response (token ids, logprobs, text, finish reason, weight version, timing, instance history) as
JSONL to ``--out``, the metrics as JSON to ``--json`` and a plot next to it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seer.cli.common import resolve_model, write_json
from seer.rollout.arguments import add_rollout_args, build_groups, fault_plan, rollout_config
from seer.rollout.config import RolloutConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="run a rollout over several engine instances")
    add_rollout_args(p)
    p.add_argument("--policy", default=RolloutConfig.policy,
                   help="seer (default), seer-paper, verl, divided, context or oracle; a divided one without "
                        "placement as NAME+critical adds critical-path placement")
    p.add_argument("--out", default=None, help="responses as JSONL")
    p.add_argument("--json", default=None, help="metrics report (a PNG plot is written next to it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from seer.rollout.coordinator import RolloutCoordinator
    from seer.rollout.plots import plot_rollout

    model = resolve_model(args.model)
    groups = build_groups(args, model)
    with RolloutCoordinator(model, rollout_config(args, args.policy)) as coord:
        out = coord.rollout(groups, fault=fault_plan(args))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for rec in out.records():
                f.write(json.dumps(rec) + "\n")
    m = out.metrics.to_dict()
    report = {"policy": out.policy, "weight_version": out.weight_version, "wall_s": round(out.wall_s, 2),
              "groups": len(groups), "responses": len(out.result.responses), **m,
              "stats": {k: v for k, v in out.result.stats.items() if k not in ("busy", "instances")},
              "instances": out.result.stats.get("instances"), "onpolicy": out.onpolicy}
    print(json.dumps({k: report[k] for k in ("policy", "responses", "makespan_s", "throughput_tok_s", "tail_s",
                                             "preemptions", "kv_bytes_moved")}, indent=1))
    if args.json:
        write_json(args.json, report)
        png = plot_rollout({out.policy: out.result}, Path(args.json).with_suffix(".png"), f"rollout: {out.policy}")
        print(f"report {args.json}, plot {png}")
    return 0
