"""``seer train``: GRPO training with Seer rollouts, from a YAML config plus ``key.sub=value`` overrides.

``--compare-policies verl,seer`` runs the same training (same seed, data and sampling seeds) once per rollout
policy, each in ``<output_dir>/<policy>``, and writes one JSON and one plot comparing them: on-policy fidelity
shows as agreeing reward curves, Seer's gain as a lower rollout time per iteration.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seer.cli.common import write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="GRPO training with Seer rollouts (synchronous, on-policy)")
    p.add_argument("--config", default=None, help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. optim.lr=1e-6 iterations=5")
    p.add_argument("--json", default=None, help="summary JSON {policies: {name: {reward_first, ...}}}; a PNG "
                                                "report is written next to it")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--compare-policies", default=None, help="comma-separated rollout policies, e.g. verl,seer")
    p.set_defaults(func=run)


def parse_policies(text: str | None) -> list[str]:
    from seer.rollout.policies import get_policy

    if text is None:
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--compare-policies needs at least one policy name")
    if len(set(names)) != len(names):
        raise ValueError(f"--compare-policies lists a policy twice: {text}")
    for name in names:
        get_policy(name)
    return names


def train_runs(config, policies: list[str], resume: bool) -> dict[str, list[dict]]:
    """Train once per policy (or once with the config's policy); returns every run's metrics rows."""
    from seer.rl.trainer import Trainer, with_policy

    runs: dict[str, list[dict]] = {}
    if not policies:
        with Trainer(config, resume=resume) as trainer:
            runs[config.rollout.policy] = trainer.run()
        return runs
    for policy in policies:
        cfg = with_policy(config, policy, str(Path(config.output_dir) / policy))
        print(f"=== rollout policy {policy}: {cfg.output_dir}", flush=True)
        with Trainer(cfg, resume=resume) as trainer:
            runs[policy] = trainer.run()
    return runs


def run(args: argparse.Namespace) -> int:
    from seer.rl.config import load_config
    from seer.rl.report import comparison, plot_training

    config = load_config(args.config, args.overrides)
    policies = parse_policies(args.compare_policies)
    runs = train_runs(config, policies, args.resume)
    report = comparison(runs)
    title = f"seer train: {Path(args.config).stem if args.config else 'config'}"
    png = plot_training(runs, Path(config.output_dir) / "report.png", title)
    print(json.dumps({name: {k: s[k] for k in ("reward_first", "reward_last", "rollout_s_mean",
                                                  "iteration_s_mean")}
                      for name, s in report["policies"].items()}, indent=1))
    if args.json:
        write_json(args.json, report)
        png = plot_training(runs, Path(args.json).with_suffix(".png"), title)
    print(f"report {png}" + (f", summary {args.json}" if args.json else ""))
    return 0
