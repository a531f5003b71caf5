"""HF transformers peer of `seer bench engine`: the benchmark workload through batched `model.generate`.

Run in its own process so its memory is measured alone (the runner starts it):

    python -m seer.bench.peers.hf_peer JOB.json RESULT.json

This is the "no serving engine" baseline: static batches of 64 sequences (prompts x n, left-padded), bf16, all
cores. A static batch runs until its longest member finishes, so for the sampled case only the tokens up to and
including each row's first EOS are counted as useful; the padding steps after it are the cost HF pays.
fixed: min_new_tokens = max_new_tokens = 256 (EOS masked, the HF equivalent of ignore_eos);
sampled: do_sample, temperature 1.0, top_k 0 and top_p 1.0 (transformers would otherwise apply top_k=50),
max_new_tokens 512.
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

BATCH_SIZE = 64


def expand(prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt repeated n times, siblings adjacent (the order a GRPO rollout submits them)."""
    return [list(p) for p in prompts for _ in range(n)]


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-padded input ids and the matching attention mask."""
    width = max(len(p) for p in batch)
    ids = [[pad_id] * (width - len(p)) + p for p in batch]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in batch]
    return ids, mask


def useful_length(generated: list[int], eos_ids: set[int], ignore_eos: bool) -> int:
    """Tokens up to and including the first EOS (all of them when EOS is ignored)."""
    if ignore_eos:
        return len(generated)
    for i, tok in enumerate(generated):
        if tok in eos_ids:
            return i + 1
    return len(generated)


def generate_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """transformers generate() arguments equivalent to one workload case."""
    max_tokens = int(settings["max_tokens"])
    temperature = float(settings.get("temperature", 1.0))
    kwargs: dict[str, Any] = {"max_new_tokens": max_tokens}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_k=int(settings.get("top_k", 0)),
                      top_p=float(settings.get("top_p", 1.0)))
    else:
        kwargs.update(do_sample=False)
    if settings.get("ignore_eos", False):
        kwargs["min_new_tokens"] = max_tokens
    return kwargs


def eos_token_ids(model: Any) -> set[int]:
    """EOS ids from the model's generation config."""
    eos = model.generation_config.eos_token_id
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None}


def run_batch(torch: Any, model: Any, batch: list[list[int]], pad_id: int, kwargs: dict[str, Any]) -> list[list[int]]:
    """Generate for one static batch; the new tokens of each row."""
    ids, mask = left_pad(batch, pad_id)
    input_ids = torch.tensor(ids, dtype=torch.long)
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=torch.tensor(mask, dtype=torch.long),
                             pad_token_id=pad_id, **kwargs)
    return out[:, input_ids.shape[1]:].tolist()


def run_case(torch: Any, model: Any, workload: dict[str, Any], case: str, batch_size: int,
             sampler: TreeMemorySampler, quiet_wait_s: float = 0.0) -> dict[str, Any]:
    """All prompts x n of one case in static batches; useful tokens, tok/s, lengths, memory and CPU use.

    With `quiet_wait_s` > 0 it first waits (up to that long) for other processes to leave the CPUs idle.
    """
    settings = workload[case]
    kwargs = generate_kwargs(settings)
    pad_id = int(model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None
                 else next(iter(eos_token_ids(model))))
    eos = eos_token_ids(model)
    sequences = expand(workload["prompts"], int(workload["n"]))
    lengths: list[int] = []
    batch_times: list[float] = []
    steps = 0
    machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
    sampler.reset()
    cpu = CpuWindow(os.getpid()).start()
    start = time.perf_counter()
    for i in range(0, len(sequences), batch_size):
        t0 = time.perf_counter()
        new_tokens = run_batch(torch, model, sequences[i:i + batch_size], pad_id, kwargs)
        batch_times.append(round(time.perf_counter() - t0, 2))
        steps += len(new_tokens) * (len(new_tokens[0]) if new_tokens else 0)
        lengths += [useful_length(row, eos, bool(settings.get("ignore_eos", False))) for row in new_tokens]
    wall_s = time.perf_counter() - start
    cpu_use = cpu.stop()
    memory = sampler.reset()
    tokens = sum(lengths)
    return {
        "sampling": settings,
        "generate_kwargs": kwargs,
        "num_prompts": len(workload["prompts"]),
        "n": int(workload["n"]),
        "num_responses": len(lengths),
        "batch_size": batch_size,
        "batch_wall_s": batch_times,
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "computed_tokens_incl_padding": steps,
        "tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "mean_len": round(tokens / len(lengths), 1) if lengths else 0.0,
        "response_lengths": lengths,
        **memory.as_dict(),
        **cpu_use,
        "machine_before_start": machine,
    }


def load_model(job: dict[str, Any]) -> tuple[Any, Any]:
    """torch and the model in the job's dtype, eval mode, using every core we may run on."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(int(job.get("seed", 0)))
    dtype = getattr(torch, job.get("dtype", "bfloat16"))
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=dtype).eval()
    return torch, model


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Load the model, warm up, run each requested case; the result dict."""
    workload = job["workload"]
    cases = list(job.get("cases", ["fixed", "sampled"]))
    batch_size = int(job.get("batch_size", BATCH_SIZE))
    load_start = os.getloadavg()[0]
    with TreeMemorySampler(interval_s=float(job.get("memory_interval_s", 0.5))) as sampler:
        start = time.perf_counter()
        torch, model = load_model(job)
        run_batch(torch, model, [list(range(100, 132))], 0, {"max_new_tokens": 4, "do_sample": False})  # warm-up
        startup_s = time.perf_counter() - start
        startup_memory = sampler.reset()
        quiet_wait_s = float(job.get("quiet_wait_s", 0.0))
        results = {case: run_case(torch, model, workload, case, batch_size, sampler, quiet_wait_s)
                   for case in cases}
        overall = sampler.overall
    import transformers

    return {
        "peer": "hf",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "dtype": job.get("dtype", "bfloat16"),
        "startup_s": round(startup_s, 2),
        "startup_memory": startup_memory.as_dict(),
        "cases": results,
        **overall.as_dict(),
        "loadavg_1m_at_start": load_start,
        "workload_source": workload.get("source", {}),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m seer.bench.peers.hf_peer JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(run(job), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
