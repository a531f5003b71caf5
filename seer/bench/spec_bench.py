"""`seer bench spec`: grouped speculative decoding, measured two ways.

``--trace FILE``: acceptance on recorded sibling responses (tau and accept_rate for n = 0, 1, 3, 7 finished
siblings and interleaved groups; linear, k=2 and k=4 drafts; gamma_max 8). In forced-token replay a draft token
is accepted iff it equals the recorded token, so acceptance does not depend on the model: the replay runs
model-free (a test checks the engine's forced-replay verification gives the same counts on a subset).

``--engine``: wall-clock effect on the real engine (SmolLM2, sampled GSM8K groups of 8): output tokens/s with
adaptive grouped speculation against none, at each concurrent batch size, in the same process and run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

from seer.models.prepare import resolve_model
from seer.utils.io import write_json
from seer.utils.machine import machine_info


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("spec", help="grouped speculative decoding: trace acceptance and engine speedup")
    p.add_argument("--trace", default=None, help="token-id trace (math_cot_groups.jsonl format)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N groups")
    p.add_argument("--engine", action="store_true", help="measure the real engine's speedup")
    p.add_argument("--model", default=None,
                   help="model directory or known name (default: smollm2-135m-instruct, prepared on first use)")
    p.add_argument("--batch-sizes", default="1,4,16,64", help="comma list of batch sizes to measure")
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature of the siblings")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens a response may generate")
    p.add_argument("--k-branches", type=int, default=1, help="draft tree branches (1: single-path drafts)")
    p.add_argument("--repeats", type=int, default=1, help="alternate off/on runs this many times (median)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per engine instance (default: the cores divided among instances)")
    p.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    p.set_defaults(func=run)


def trace_report(path: str, limit: int | None) -> dict[str, Any]:
    from seer.data.traces import load_trace
    from seer.spec.replay import spec_replay_report

    return spec_replay_report(load_trace(path, limit=limit))


def _one_run(llm, prompts: list[dict], params, speculator) -> dict[str, float]:
    llm.engine.enable_speculation(speculator)
    s0 = llm.engine.stats
    before = (s0.spec_drafted, s0.spec_accepted, s0.spec_bonus, s0.spec_steps, s0.steps)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    s = llm.engine.stats
    drafted, accepted, bonus, spec_steps, steps = (a - b for a, b in zip(
        (s.spec_drafted, s.spec_accepted, s.spec_bonus, s.spec_steps, s.steps), before))
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "steps": steps, "spec_steps": spec_steps,
            "drafted": drafted, "accepted": accepted,
            "tau": (accepted + bonus) / spec_steps if spec_steps else None,
            "accept_rate": accepted / drafted if drafted else None,
            "draft_s": speculator.draft_s if speculator is not None else 0.0}


def engine_report(args: argparse.Namespace) -> dict[str, Any]:
    from seer import LLM, SamplingParams
    from seer.bench.workloads import load_gsm8k_questions
    from seer.engine.speculator import SpecConfig
    from seer.llm import make_speculator

    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    model = resolve_model(args.model)
    llm = LLM(model, dtype="bfloat16", num_threads=args.threads, max_num_seqs=max(sizes))
    spec_cfg = SpecConfig(k_branches=args.k_branches)
    t0 = time.perf_counter()
    make_speculator(llm.engine, spec_cfg)  # profile (or load) the verify cost before timing anything
    profile_s = time.perf_counter() - t0
    rows: dict[str, Any] = {}
    questions = load_gsm8k_questions(limit=max(1, max(sizes) // args.group_size) * 4)
    for b in sizes:
        num_groups = max(1, b // args.group_size)
        prompts = [{"messages": [{"role": "user", "content": q["question"]}]} for q in questions[:num_groups]]
        llm.engine.scheduler.config = dataclasses.replace(llm.engine.scheduler.config, max_num_seqs=b)
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for rep in range(args.repeats):
            params = SamplingParams(n=args.group_size, temperature=args.temperature, max_tokens=args.max_tokens,
                                    seed=1000 + rep)
            runs["off"].append(_one_run(llm, prompts, params, None))
            runs["on"].append(_one_run(llm, prompts, params, make_speculator(llm.engine, spec_cfg)))
        off = statistics.median(r["tok_s"] for r in runs["off"])
        on = statistics.median(r["tok_s"] for r in runs["on"])
        rows[f"b{b}"] = {"batch_size": b, "groups": num_groups, "off_tok_s": round(off, 2), "on_tok_s": round(on, 2),
                         "speedup": round(on / off, 3), "runs": runs}
    return {"model": str(model), "temperature": args.temperature, "max_tokens": args.max_tokens,
            "group_size": args.group_size, "k_branches": args.k_branches, "profile_s": round(profile_s, 1),
            "batch_sizes": rows}


def run(args: argparse.Namespace) -> int:
    if not args.trace and not args.engine:
        raise ValueError("give --trace FILE and/or --engine")
    report: dict[str, Any] = {}
    if args.trace:
        report.update(trace_report(args.trace, args.limit))
        print(json.dumps({k: report[k] for k in ("tau", "accept_rate") if k in report}, indent=1))
    if args.engine:
        report["engine"] = engine_report(args)
        print(json.dumps({k: {kk: v[kk] for kk in ("off_tok_s", "on_tok_s", "speedup")}
                          for k, v in report["engine"]["batch_sizes"].items()}, indent=1))
    report["machine"] = machine_info()
    write_json(args.json, report)
    return 0
