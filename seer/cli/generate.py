"""``seer generate``: sample from a model for prompts given on the command line or in a JSONL file.

Each JSONL line is an object with ``prompt`` (raw text), ``question``/``messages`` (rendered with the chat
template) or ``prompt_token_ids``. Results go to ``--out`` as JSONL with token ids and logprobs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seer.cli.common import read_jsonl, resolve_model, write_json
from seer.engine.arguments import add_engine_args, engine_kwargs


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (chat template applied); repeatable")
    p.add_argument("--prompts", default=None, help="JSONL file of prompts")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts of the file")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to --prompt text")
    p.add_argument("-n", "--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: keep the smallest set of tokens with this much probability (1.0: off)")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k most likely tokens (-1: off)")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens a response may generate")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed (each group and sibling derives its own from it)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="keep generating past the end-of-sequence token, up to --max-tokens")
    p.add_argument("--out", default=None, help="write results as JSONL here")
    p.add_argument("--json", default=None, help="write a run report (throughput, counts) here")
    p.set_defaults(func=run)


def load_prompts(args: argparse.Namespace) -> list[dict]:
    prompts: list[dict] = []
    for text in args.prompt:
        prompts.append({"prompt": text} if args.raw else {"messages": [{"role": "user", "content": text}]})
    if args.prompts:
        for lineno, rec in read_jsonl(args.prompts):
            if "prompt_token_ids" in rec:
                prompts.append({"prompt_token_ids": rec["prompt_token_ids"]})
            elif "messages" in rec:
                prompts.append({"messages": rec["messages"]})
            elif "question" in rec:
                prompts.append({"messages": [{"role": "user", "content": rec["question"]}]})
            elif "prompt" in rec:
                prompts.append({"prompt": rec["prompt"]})
            else:
                raise ValueError(f"{args.prompts}:{lineno}: needs one of prompt, question, messages, "
                                 f"prompt_token_ids")
            if args.limit is not None and len(prompts) >= args.limit:
                break
    if not prompts:
        raise ValueError("no prompts: give --prompt TEXT or --prompts FILE with at least one line")
    return prompts


def run(args: argparse.Namespace) -> int:
    from seer import LLM, SamplingParams

    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
    prompts = load_prompts(args)
    llm = LLM(resolve_model(args.model), **engine_kwargs(args))
    outputs = llm.generate(prompts, params)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for o in outputs:
                f.write(json.dumps(o.to_dict()) + "\n")
    else:
        for o in outputs[:8]:
            for c in o.outputs:
                print(f"--- {o.request_id}[{c.index}] ({len(c.token_ids)} tokens, {c.finish_reason})\n{c.text}")
    stats = dict(llm.last_stats, prompts=len(prompts), responses=sum(len(o.outputs) for o in outputs),
                 preemptions=llm.engine.stats.preemptions, prefix_hit_tokens=llm.engine.block_manager.prefix_hit_tokens)
    print(f"{stats['responses']} responses, {stats['output_tokens']} tokens in {stats['wall_s']:.1f} s "
          f"= {stats['tok_s']:.1f} tok/s")
    write_json(args.json, stats)
    return 0
