"""``seer bench soak``: many rollout + weight-update iterations on one coordinator, as a training job runs them.

Why: an RL job runs hundreds of rollouts and weight syncs on the same instances. Memory that grows a little per
iteration, KV left in the pool, counters that accumulate across rollouts or instances that drift apart in weight
version break such a job after hours, and no single-rollout test sees them. Each iteration here rolls out the
same groups, checks what must hold after it (every group has G responses, the pool is empty, the counters are
this rollout's, one weight version everywhere), syncs weights and records the resident memory of the driver and
of every instance process. The report gives the memory growth after warm-up (iteration 5 to the last): a leak
shows as growth that does not level off.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from seer.bench.peers.proc_memory import rss_kb
from seer.models.prepare import resolve_model
from seer.utils.io import write_json
from seer.utils.machine import machine_info

WARMUP = 5  # iterations before memory is expected to be flat (allocator pools, caches, compiled kernels)


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("soak", help="many rollout + weight-update iterations: memory, pool and counters")
    p.add_argument("--model", default=None, help="model directory or known name (default: SmolLM2-135M)")
    p.add_argument("--iterations", type=int, default=50, help="rollout + weight-update iterations")
    p.add_argument("--backend", choices=("inprocess", "local"), default="local",
                   help="where instances run: inprocess or local (one process each)")
    p.add_argument("--instances", type=int, default=2, help="engine instances")
    p.add_argument("--policy", default="seer",
                   help="verl, divided, context, seer or oracle; NAME+critical adds critical-path placement")
    p.add_argument("--groups", type=int, default=4, help="prompts per rollout")
    p.add_argument("--group-size", type=int, default=4, help="responses per prompt (G)")
    p.add_argument("--max-tokens", type=int, default=32, help="most tokens a response may generate")
    p.add_argument("--num-kv-blocks", type=int, default=64, help="KV blocks per instance (small: KV moves)")
    p.add_argument("--dtype", default="auto",
                   help="auto: bf16 where computed natively (AVX512_BF16, AMX, CUDA), else float32")
    p.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    p.set_defaults(func=run)


def _groups(args: argparse.Namespace, iteration: int) -> list:
    from seer.rollout.types import GroupInput
    from seer.sampling_params import SamplingParams, group_seed

    sp = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    return [GroupInput(tuple(range(10 + g, 40 + 3 * g)), args.group_size,
                       SamplingParams(**{**sp.__dict__, "seed": group_seed(iteration, 0, g)}), key=f"soak-{g}")
            for g in range(args.groups)]


def _instance_pids(coordinator) -> list[int]:
    proxies = getattr(coordinator.backend, "proxies", {})
    return [p.proc.pid for p in proxies.values() if hasattr(p, "proc")]


def _check(out, args: argparse.Namespace, version: int) -> list[str]:
    """What must hold after every rollout; returns the violations."""
    problems = []
    sizes = [len(v) for v in out.result.groups().values()]
    if sizes != [args.group_size] * args.groups:
        problems.append(f"responses per group {sizes}")
    versions = {rec["weight_version"] for rec in out.records()} | {out.weight_version}
    if versions != {version}:
        problems.append(f"weight versions {sorted(versions)}, expected {version}")
    generated = sum(len(r.token_ids) for r in out.result.responses)
    counted = sum(st.get("output_tokens", 0) for st in out.result.stats["instances"].values())
    if counted != generated:  # the instances' counters must be this rollout's alone
        problems.append(f"instances counted {counted} output tokens for {generated} generated")
    return problems


def run(args: argparse.Namespace) -> int:
    from seer.engine.config import EngineConfig
    from seer.engine.speculator import SpecConfig
    from seer.rollout.coordinator import RolloutConfig, RolloutCoordinator

    if args.iterations <= WARMUP:
        raise ValueError(f"--iterations must exceed the {WARMUP} warm-up iterations")
    model = resolve_model(args.model)
    cfg = RolloutConfig(policy=args.policy, instances=args.instances, backend=args.backend, chunk_tokens=8,
                        engine=EngineConfig(dtype=args.dtype, num_kv_blocks=args.num_kv_blocks),
                        spec=SpecConfig(adaptive=False))
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with RolloutCoordinator(model, cfg) as c:
        for it in range(1, args.iterations + 1):
            t0 = time.perf_counter()
            out = c.rollout(_groups(args, it), progress=False)
            problems += [f"iteration {it}: {p}" for p in _check(out, args, c.weight_version)]
            pool = c.backend.pool.stats().entries if hasattr(c.backend, "pool") else 0
            if pool:
                problems.append(f"iteration {it}: {pool} KV pool entries left after the rollout")
            version = c.update_weights(model)
            rows.append({"iteration": it, "weight_version": version, "seconds": round(time.perf_counter() - t0, 3),
                         "makespan_s": round(out.metrics.makespan_s, 3), "preemptions": out.metrics.preemptions,
                         "driver_rss_mb": round(rss_kb(os.getpid()) / 1024, 1),
                         "instance_rss_mb": [round(rss_kb(pid) / 1024, 1) for pid in _instance_pids(c)]})
            print(json.dumps(rows[-1]))
    report = {"setup": {**vars(args), "func": None, "model": str(model), "machine": machine_info(cfg.engine.dtype)},
              "growth_after_warmup": growth(rows), "problems": problems, "iterations": rows}
    print(json.dumps({k: report[k] for k in ("growth_after_warmup", "problems")}, indent=1))
    write_json(args.json, report)
    return 0 if not problems else 1


def growth(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Relative RSS growth from iteration WARMUP to the last, for the driver and each instance process."""
    first, last = rows[WARMUP - 1], rows[-1]
    out = {"driver": round(last["driver_rss_mb"] / first["driver_rss_mb"] - 1.0, 4)}
    for i, (a, b) in enumerate(zip(first["instance_rss_mb"], last["instance_rss_mb"])):
        out[f"instance_{i}"] = round(b / a - 1.0, 4) if a else 0.0
    return out

