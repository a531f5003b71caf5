"""Seer's side of `seer bench engine`: the workload through our engine, in its own process like the peers.

    python -m seer.bench.engine_worker JOB.json RESULT.json

Same job format and result shape as the peers (``seer/bench/peers``), so memory and throughput are measured the
same way for everyone: peak RSS/PSS of the process tree, wall time of generation only (model load and a warm-up
excluded and reported separately).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from seer.bench.peers.proc_cpu import CpuWindow, wait_for_quiet
from seer.bench.peers.proc_memory import TreeMemorySampler


def sampling_params(settings: dict[str, Any], n: int):
    from seer import SamplingParams

    return SamplingParams(n=n, temperature=float(settings.get("temperature", 1.0)),
                          top_p=float(settings.get("top_p", 1.0)), top_k=int(settings.get("top_k", -1)),
                          max_tokens=int(settings["max_tokens"]), ignore_eos=bool(settings.get("ignore_eos", False)),
                          seed=settings.get("seed"))


def run_case(llm, workload: dict[str, Any], case: str, sampler: TreeMemorySampler, quiet_wait_s: float) -> dict:
    settings = workload[case]
    params = sampling_params(settings, int(workload["n"]))
    machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
    sampler.reset()
    cpu = CpuWindow(os.getpid()).start()
    steps0 = llm.engine.stats.steps
    pre0 = llm.engine.stats.preemptions
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in workload["prompts"]], params, use_tqdm=False)
    wall_s = time.perf_counter() - start
    cpu_use = cpu.stop()
    memory = sampler.reset()
    lengths = [len(c.token_ids) for o in outs for c in o.outputs]
    tokens = sum(lengths)
    return {"sampling": settings, "num_prompts": len(workload["prompts"]), "n": int(workload["n"]),
            "num_responses": len(lengths), "wall_s": round(wall_s, 3), "output_tokens": tokens,
            "tok_s": round(tokens / wall_s, 2), "mean_len": round(tokens / len(lengths), 1),
            "steps": llm.engine.stats.steps - steps0, "preemptions": llm.engine.stats.preemptions - pre0,
            "response_lengths": lengths, **memory.as_dict(), **cpu_use, "machine_before_start": machine}


def run(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from seer import LLM, SamplingParams

    workload = job["workload"]
    threads = int(job.get("threads") or len(os.sched_getaffinity(0)))
    with TreeMemorySampler(interval_s=float(job.get("memory_interval_s", 0.2))) as sampler:
        start = time.perf_counter()
        llm = LLM(job["model_dir"], dtype=job.get("dtype", "bfloat16"), num_threads=threads,
                  kv_cache_memory_gb=float(job["kv_budget_gb"]), max_num_seqs=int(job.get("max_num_seqs", 256)),
                  max_num_batched_tokens=int(job.get("max_num_batched_tokens", 2048)))
        llm.generate([[100, 101, 102]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up (kernel build)
        startup_s = time.perf_counter() - start
        startup_memory = sampler.reset()
        quiet = float(job.get("quiet_wait_s", 0.0))
        cases = {case: run_case(llm, workload, case, sampler, quiet) for case in job.get("cases", ["fixed", "sampled"])}
        overall = sampler.overall
    return {"peer": "seer", "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "dtype": job.get("dtype", "bfloat16"), "kv_budget_gb": job["kv_budget_gb"],
            "num_kv_blocks": llm.engine.block_manager.num_blocks, "startup_s": round(startup_s, 2),
            "startup_memory": startup_memory.as_dict(), "cases": cases, **overall.as_dict(),
            "workload_source": workload.get("source", {})}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m seer.bench.engine_worker JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(run(job), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
