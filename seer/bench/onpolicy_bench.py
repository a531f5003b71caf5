"""``seer bench onpolicy``: does Seer's rollout sample exactly what plain sampling would, on your model and settings?

Why: on-policy RL assumes every response is a sample of the current policy at the trainer's temperature and
top-p/top-k. Seer makes responses differently from plain sampling (drafts from siblings are verified instead of
sampled, requests pause after a chunk and resume on another instance from KV parked in the global pool), and a
bias from any of these is silent: no error, no change in throughput. The tests check this on tiny random models;
this verb runs the same statistical checks on the user's model and sampling settings, in a few minutes on a CPU:

1. ``verify``: ``Sampler.verify`` on the model's real next-token logits (onpolicy_verify.py), goodness of fit of
   the first emitted token against the filtered target, chain and tree drafts of likely and unlikely tokens.
2. ``end_to_end``: ``--samples`` responses each from plain sampling, from grouped speculative decoding and from a
   divided rollout over ``--instances`` instances with ``--chunk-tokens`` chunks (nearly every response paused and
   resumed elsewhere through the pool); each arm against plain sampling, feature by feature (onpolicy_samples.py).
3. ``independence``: siblings whose first tokens were sampled on different instances agree (first token, first
   two, whole response) as often as plain siblings do; shared random streams would make them agree more.

Every test is a Pearson chi-square test at alpha = 0.001 (seer/utils/stats.py); the report gives each test's
statistic, degrees of freedom, p-value, sample sizes and the total variation it detects with probability 0.9,
and each check's evidence that its mechanism ran. ``passed`` is true only if every check passed (its mechanism
ran, at least one of its tests could see a difference, every p-value above alpha); the exit status is 1 if not.
With ~20 tests at alpha = 0.001, a correct system fails about one run in 50 by chance (``false_alarm_bound``).

Defaults (2000 samples, 4 tokens, 3 instances, 1-token chunks): check 1 detects a total-variation distortion of
the first token >= 0.08 (<= 40 pooled bins), check 2 a shift of a feature >= 0.09-0.14 (8-100 bins), check 3 a
change of the agreement rate of about 0.12-0.15 (300-600 cross-instance pairs), each with probability 0.9; the
report gives each test's own figure. About 4-5 minutes for SmolLM2-135M in float32 on 2 AVX2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seer.bench.onpolicy_samples import Response, agreement, compare, cross_instance_pairs, sibling_pairs
from seer.models.prepare import resolve_model
from seer.sampling_params import SamplingParams
from seer.utils.io import write_json
from seer.utils.machine import machine_info
from seer.utils.stats import ChiSquare, detectable_tv, effective_n, homogeneity

if TYPE_CHECKING:  # torch-heavy: the CLI builds its parser without them
    from seer.engine.sampler import RowSpec
    from seer.llm import LLM

ALPHA = 1e-3
GROUP = 8  # siblings per group (plain and rollout arms)
# completion prompts; the one whose next token is least predictable is used (the most informative comparisons)
PROMPTS = ("Here is a list of random animals: cat, dog,", "My favourite colour is", "Write one random word:",
           "The number I picked is")


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("onpolicy", help="statistical checks that rollouts leave the sampling distribution unchanged")
    p.add_argument("--temperature", type=float, required=True, help="sampling temperature to check (> 0)")
    p.add_argument("--top-p", type=float, required=True, help="nucleus (top-p) filter to check, in (0, 1]")
    p.add_argument("--top-k", type=int, default=-1, help="top-k filter to check (-1: off)")
    p.add_argument("--model", default=None,
                   help="model directory or known name (default: smollm2-135m-instruct, prepared on first use)")
    p.add_argument("--samples", type=int, default=2000,
                   help="responses per arm (checks 2, 3) and verifications per draft (check 1)")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens per response in checks 2 and 3 (>= 2)")
    p.add_argument("--instances", type=int, default=3, help="rollout instances requests move between (>= 2)")
    p.add_argument("--chunk-tokens", type=int, default=1,
                   help="tokens per rollout chunk: a request may move to another instance after each")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the samplers and arms (tokens are reproducible; which siblings count as "
                        "cross-instance pairs in check 3 follows measured step times)")
    p.add_argument("--json", default=None, help="write the report here as JSON")
    p.set_defaults(func=run)


def validate(args: argparse.Namespace) -> None:
    """User errors as ValueError (the CLI prints one line, exit status 2) before anything is loaded."""
    if not math.isfinite(args.temperature) or args.temperature <= 0:
        raise ValueError(f"--temperature must be > 0 (greedy decoding has no distribution), got {args.temperature}")
    if not math.isfinite(args.top_p) or not 0.0 < args.top_p <= 1.0:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k != -1 and args.top_k < 1:
        raise ValueError(f"--top-k must be -1 (off) or >= 1, got {args.top_k}")
    if args.samples < 8 * GROUP:
        raise ValueError(f"--samples must be >= {8 * GROUP}, got {args.samples}")
    if args.max_tokens < 2 or args.instances < 2 or not 1 <= args.chunk_tokens < args.max_tokens:
        raise ValueError("need --max-tokens >= 2, --instances >= 2 and 1 <= --chunk-tokens < --max-tokens")


def pick_prompt(llm: "LLM", row: "RowSpec") -> list[int]:
    """The candidate prompt whose filtered next-token distribution has a collision probability (the chance two
    siblings agree on the first token) closest to 0.25: spread enough for the first-token comparisons to have
    many bins, concentrated enough for the agreement rates of check 3 to be measurable."""
    from seer.bench.onpolicy_verify import next_logits, target

    ids = [llm.tokenizer.encode(text) for text in PROMPTS]
    collision = [float((target(next_logits(llm.engine.model, [p]), row)[0] ** 2).sum()) for p in ids]
    gaps = [abs(c - 0.25) for c in collision]
    return ids[gaps.index(min(gaps))]


def two_sample(name: str, a: Sequence[object], b: Sequence[object], test: ChiSquare) -> dict[str, Any]:
    """One two-sample test's JSON row, with the total variation it detects."""
    return {"name": name, **test.as_dict(), "bins": test.bins, "n": [len(a), len(b)],
            "detectable_tv": round(detectable_tv(effective_n(len(a), len(b)), test.bins, ALPHA), 4)}


def verdict(tests: list[dict[str, Any]], ran: bool, evidence: dict[str, Any]) -> dict[str, Any]:
    """A check's result: it passes when its mechanism ran, at least one test could see a difference (>= 2 pooled
    bins; a feature constant in both samples, e.g. the length when nothing stops early, cannot) and every p-value
    exceeds ALPHA. ``detectable_tv``: the largest over the informative tests."""
    informative = [t for t in tests if t["bins"] >= 2]
    return {"passed": ran and bool(informative) and all(t["pvalue"] > ALPHA for t in tests), "mechanism_ran": ran,
            "informative_tests": len(informative), "min_pvalue": min(t["pvalue"] for t in tests),
            "detectable_tv": max((t["detectable_tv"] for t in informative), default=1.0), "evidence": evidence,
            "tests": tests}


def end_to_end_check(arms: dict[str, list[Response]], plain: list[Response], max_tokens: int,
                     evidence: dict[str, Any]) -> dict[str, Any]:
    """Check 2: every feature of every arm against plain sampling."""
    tests = [two_sample(f"{arm}:{feat}", sample, plain, t) for arm, sample in arms.items()
             for feat, t in compare(sample, plain, max_tokens).items()]
    spec, roll = evidence["speculative"], evidence["rollout"]
    ran = spec["drafted"] > 0 and spec["accepted"] > 0 and roll["responses_changed_instance"] > 0 \
        and roll["kv_imports_from_pool"] > 0
    return verdict(tests, ran, evidence)


def independence_check(rollout: list[Response], plain: list[Response]) -> dict[str, Any]:
    """Check 3: agreement rates of cross-instance sibling pairs against plain sibling pairs."""
    pairs, ref = cross_instance_pairs(rollout), sibling_pairs(plain)
    tests = []
    for label, k in (("first_token", 1), ("first_two_tokens", 2), ("whole_response", None)):
        got, want = agreement(pairs, k), agreement(ref, k)
        row = two_sample(label, got, want, homogeneity(got, want, minimum=5.0))  # 2x2: the classic >= 5 rule
        row["agreement_rates"] = [sum(got) / max(len(got), 1), sum(want) / max(len(want), 1)]
        tests.append(row)
    ran = len(pairs) >= 10
    return verdict(tests, ran, {"cross_instance_pairs": len(pairs), "plain_sibling_pairs": len(ref)})


def engine_stages(model: Path, params: SamplingParams, samples: int, seed: int, progress: bool,
                  seconds: dict[str, float]) -> dict[str, Any]:
    """On one float32 engine: the prompt, check 1, the plain sample and the speculative sample (groups of
    ``samples // 8`` siblings, at most 32 at once, so later siblings draft from earlier ones' responses; seeded
    groups: the verification path rollouts use)."""
    from seer import LLM
    from seer.bench.onpolicy_samples import llm_sample
    from seer.bench.onpolicy_verify import verify_check
    from seer.engine.sampler import RowSpec
    from seer.engine.speculator import SpecConfig
    from seer.llm import make_speculator

    t = time.perf_counter()
    llm = LLM(model, dtype="float32", kv_cache_memory_gb=1.0, seed=seed)
    row = RowSpec(params.temperature, params.top_p, params.top_k)
    prompt = pick_prompt(llm, row)
    out: dict[str, Any] = {"prompt": prompt,
                           "verify": verify_check(llm.engine.model, prompt, row, samples, seed + 11, progress)}
    seconds["verify"], t = time.perf_counter() - t, time.perf_counter()
    out["plain"], _ = llm_sample(llm, prompt, params, samples, GROUP, progress=progress)
    seconds["plain"], t = time.perf_counter() - t, time.perf_counter()
    llm.engine.enable_speculation(make_speculator(llm.engine, SpecConfig(adaptive=False, gamma_max=4)))
    out["speculative"], out["counters"] = llm_sample(llm, prompt, dataclasses.replace(params, seed=seed + 1000),
                                                     samples, samples // 8, max_num_seqs=32, progress=progress)
    seconds["speculative"] = time.perf_counter() - t
    return out


def run_onpolicy(model: Path, params: SamplingParams, samples: int, instances: int, chunk_tokens: int,
                 seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """The three checks on ``model`` under ``params`` (its temperature, top-p, top-k, max_tokens); the report."""
    from seer.bench.onpolicy_samples import rollout_sample

    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    arms = engine_stages(model, params, samples, seed, progress, seconds)
    t = time.perf_counter()
    roll, moved = rollout_sample(model, arms["prompt"], params, samples, GROUP, instances, chunk_tokens,
                                 seed=seed + 5, progress=progress)
    seconds["rollout"] = time.perf_counter() - t
    checks = {"verify": verdict(*arms["verify"]),
              "end_to_end": end_to_end_check({"speculative": arms["speculative"], "rollout": roll}, arms["plain"],
                                             params.max_tokens, {"speculative": arms["counters"], "rollout": moved}),
              "independence": independence_check(roll, arms["plain"])}
    n_tests = sum(len(c["tests"]) for c in checks.values())
    return {"passed": all(c["passed"] for c in checks.values()), "alpha": ALPHA,
            "false_alarm_bound": round(ALPHA * n_tests, 4), "wall_s": round(time.perf_counter() - t0, 1),
            "stage_s": {k: round(v, 1) for k, v in seconds.items()},
            "setup": {"model": str(model), "temperature": params.temperature, "top_p": params.top_p,
                      "top_k": params.top_k, "samples": samples, "max_tokens": params.max_tokens,
                      "instances": instances, "chunk_tokens": chunk_tokens, "group_size": GROUP, "seed": seed,
                      "prompt_token_ids": arms["prompt"], "machine": machine_info("float32")},
            "checks": checks}


def summary(report: dict[str, Any]) -> str:
    """One line per check, then the verdict."""
    lines = []
    for name, c in report["checks"].items():
        worst = min(c["tests"], key=lambda t: t["pvalue"])
        lines.append(f"{name:13s} {'PASS' if c['passed'] else 'FAIL'}  min p = {c['min_pvalue']:.3g} "
                     f"({worst.get('name') or worst.get('draft')}), {len(c['tests'])} tests, detects total "
                     f"variation >= {c['detectable_tv']:.3f}; evidence {json.dumps(c['evidence'])}")
    word = "PASSED" if report["passed"] else "FAILED"
    lines.append(f"{word}: every p-value must exceed {report['alpha']:g} (chance of a false alarm <= "
                 f"{report['false_alarm_bound']:.1%}); {report['wall_s']:.0f} s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    validate(args)
    model = resolve_model(args.model)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens)
    report = run_onpolicy(model, params, args.samples, args.instances, args.chunk_tokens, args.seed)
    print(summary(report))
    write_json(args.json, report)
    return 0 if report["passed"] else 1
