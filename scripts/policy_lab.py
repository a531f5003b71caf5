"""Rollout policies on seeded trace samples in seconds: the simulator, its steps priced like this CPU's engine.

Why: at cluster shape (8 instances, 24 groups) one real-engine sample takes most of an hour per policy on a
2-core CPU, too slow to compare design choices. This runs the same control plane (driver, request buffer,
orderings, critical path, scheduler, suffix trees, draft policy) through the engine's rollout template on
simulated instances (``seer.sim.backend.SimBackend``) whose step time is a linear fit of real engine steps,
``fixed + per_seq * B + per_token * N + per_pair * P`` (``seer.rollout.step_cost``: take the constants from a
``seer bench rollout`` report's ``bound.step_fit`` on the CPU at hand), and whose draft policy sees the verify
table the engine would profile (batches 1/4/16, 1/3/9 tokens at a 128-token context, with the per-pair slope).
Length-only traces get random tokens (siblings unalike). A simulation, not a measurement: use it to choose what
to measure, and measure on the engine (``seer bench rollout --samples``); ``seer simulate --replay`` says how
well the simulator predicted a measured run.

    python scripts/policy_lab.py --trace data/math_cot_groups.jsonl --sample 24 --scale 0.5 --samples 6 \\
        --policies verl,seer,seer-paper,seer-oracle,oracle+critical

A policy may name a context rank after a colon (``context+critical:attained``).
"""

from __future__ import annotations

import argparse
import statistics

from seer.bench.rollout_bench import kv_blocks_for
from seer.engine.config import EngineConfig
from seer.rollout.config import RolloutConfig
from seer.rollout.orderings import OrderingConfig
from seer.rollout.policies import get_policy
from seer.rollout.step_cost import LinearStepCost
from seer.rollout.types import GroupInput
from seer.rollout.workload import ReplayOptions, groups_from_trace
from seer.sim.backend import SimBackend
from seer.sim.engine_prices import EnginePrices, FittedCost
from seer.sim.replay import profile_from_fit, with_tokens
from seer.utils.kv_size import kv_bytes_per_token

VOCAB = 49152  # SmolLM2's
KV_BYTES = kv_bytes_per_token(30, 3, 64, 4)  # SmolLM2-135M in fp32


def run(groups: list[GroupInput], spec: str, instances: int, kv_tokens: int, chunk: int,
        fit: LinearStepCost) -> dict[str, float]:
    """One policy through the engine's rollout template on simulated instances priced by ``fit`` (KV at host-copy
    speed, drafting at 0.1 ms a request), drafting by the verify table the engine's profiler would measure."""
    name, _, rank = spec.partition(":")
    engine = EngineConfig(dtype="float32", num_kv_blocks=kv_tokens // 16)
    config = RolloutConfig(instances=instances, chunk_tokens=chunk, engine=engine,
                           ordering=OrderingConfig(rank=rank or "remaining"))
    cost = FittedCost(EnginePrices(fit, KV_BYTES, kv_s_per_byte=1 / 4e9, draft_s_per_request=1e-4))
    backend = SimBackend(config, cost, profile_from_fit(fit), max_model_len=8192)
    m = backend.run(get_policy(name), groups, chunk, False, None).metrics
    return {"makespan": m.makespan_s, "tail": m.tail_s, "idle": sum(m.idle_s) / (instances * m.makespan_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="data/math_cot_groups.jsonl")
    ap.add_argument("--sample", type=int, default=24)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--kv-fraction", type=float, default=1 / 3)
    ap.add_argument("--policies", default="verl,seer,seer-paper")
    ap.add_argument("--fit", default="0.0553,0.00036,0.00367,2.1e-5",
                    help="fixed_s,per_seq_s,per_token_s,per_pair_s (default: the AMD EPYC AVX2 fp32 engine, 1 thread)")
    a = ap.parse_args()
    fit = LinearStepCost(*(float(x) for x in a.fit.split(",")))
    speedups: dict[str, list[float]] = {}
    for s in range(a.samples):
        groups = groups_from_trace(a.trace, VOCAB, ReplayOptions(a.scale, sample=a.sample, seed=s))
        groups = with_tokens(groups, s, VOCAB, None)
        kv = kv_blocks_for(groups, a.instances, a.kv_fraction, 16, a.chunk)[1]["kv_tokens_per_instance"]
        rows = {p: run(groups, p, a.instances, kv, a.chunk, fit) for p in a.policies.split(",")}
        base = rows["verl"]["makespan"] if "verl" in rows else None
        cells = []
        for p, r in rows.items():
            ratio = base / r["makespan"] if base else float("nan")
            speedups.setdefault(p, []).append(ratio)
            cells.append(f"{p} {r['makespan']:.1f}s x{ratio:.2f} tail {r['tail']:.1f} idle {r['idle']:.2f}")
        print(f"sample {s} (kv {kv}, max_tokens {groups[0].params.max_tokens}): " + " | ".join(cells), flush=True)
    for p, v in speedups.items():
        print(f"{p:<28} median x{statistics.median(v):.2f}  worst x{min(v):.2f}")


if __name__ == "__main__":
    main()
