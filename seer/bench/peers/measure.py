"""Measure the peers alone: `python -m seer.bench.peers.measure --peer vllm --peer hf --json out.json`.

Why a separate entry point: `seer bench engine` runs Seer and the peers side by side; this one runs only the
peers, to check the peer setup and record their figures without the engine (e.g. for the README).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from seer.bench.peers.runner import HF_DEFAULT_PROMPTS, PeerError, run_hf_peer, run_vllm_peer
from seer.bench.workloads import CASES, engine_workload
from seer.models.prepare import DEFAULT_MODEL, prepare_model


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one peer result, per case."""
    out: dict[str, Any] = {"startup_s": result.get("startup_s"), "peak_rss_mb": result.get("peak_rss_mb"),
                           "peak_pss_mb": result.get("peak_pss_mb")}
    for case, r in result.get("cases", {}).items():
        out[case] = {k: r.get(k) for k in ("tok_s", "wall_s", "output_tokens", "num_responses", "mean_len",
                                           "peak_rss_mb", "peak_pss_mb", "other_cpu_cores")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", action="append", choices=["vllm", "hf"], help="repeatable; default both")
    parser.add_argument("--case", action="append", choices=list(CASES), help="repeatable; default both")
    parser.add_argument("--model-dir", type=Path, default=None, help=f"default: prepared {DEFAULT_MODEL}")
    parser.add_argument("--kv-budget-gb", type=float, default=2.0)
    parser.add_argument("--hf-prompts", type=int, default=HF_DEFAULT_PROMPTS)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--quiet-wait-s", type=float, default=120.0)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    model_dir = args.model_dir or prepare_model(DEFAULT_MODEL)
    workload = engine_workload(model_dir)
    cases = args.case or list(CASES)
    report: dict[str, Any] = {"model_dir": str(model_dir), "kv_budget_gb": args.kv_budget_gb, "raw": {}}
    for peer in args.peer or ["vllm", "hf"]:
        try:
            if peer == "vllm":
                raw = run_vllm_peer(workload, model_dir, args.kv_budget_gb, args.timeout_s, cases=cases,
                                    quiet_wait_s=args.quiet_wait_s)
            else:
                raw = run_hf_peer(workload, model_dir, args.timeout_s, cases=cases, num_prompts=args.hf_prompts,
                                  quiet_wait_s=args.quiet_wait_s)
        except PeerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        report["raw"][peer] = raw
        report[peer] = summary(raw)
        print(json.dumps({peer: report[peer]}, indent=1))
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
