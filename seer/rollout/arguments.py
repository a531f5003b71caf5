"""The command-line arguments of one rollout, and what they build: its config, its groups, its fault plan.

Why a module of its own: ``seer rollout`` and ``seer bench rollout`` take the same flags and must turn them into
the same ``RolloutConfig`` and groups; kept here, below both, neither command imports the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seer.engine.arguments import add_engine_args, engine_config
from seer.rollout.backends import BACKENDS
from seer.rollout.config import RolloutConfig
from seer.rollout.orderings import CONTEXT_RANKS, OrderingConfig

DEFAULT_MAX_TOKENS = 256  # a prompts file's budget per response unless --max-tokens says otherwise


def add_rollout_args(p: argparse.ArgumentParser) -> None:
    """Flags of one rollout and of its instances' engines; their defaults are ``RolloutConfig``'s, so the CLI and
    the API agree."""
    d = RolloutConfig()
    add_engine_args(p, d.engine)
    p.add_argument("--prompts", default=None, help="prompts JSONL (question/prompt/messages/prompt_token_ids)")
    p.add_argument("--trace", default=None, help="replay a trace (token-id or length-only format)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts / trace groups")
    p.add_argument("--sample", type=int, default=None, help="a random sample of N trace groups")
    p.add_argument("--length-scale", type=length_scale_arg, default=1.0,
                   help="scale every trace length (prompts and responses) by this factor in (0, 1]; auto: measure "
                        "this machine's decode rate and scale the trace to ~20 s of decoding per instance")
    p.add_argument("--max-len", type=int, default=None,
                   help="cap replayed response lengths at this many tokens (default: no cap)")
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    p.add_argument("--instances", type=int, default=d.instances, help="engine instances")
    p.add_argument("--backend", default=d.backend, choices=list(BACKENDS),
                   help="inprocess (virtual clock per instance), local (a process each) or ray (actors)")
    p.add_argument("--chunk-tokens", type=int, default=d.chunk_tokens,
                   help="tokens a request generates per chunk before it returns to the buffer (divided rollout)")
    p.add_argument("--context-rank", default=d.ordering.rank, choices=CONTEXT_RANKS,
                   help="order of non-probes under policies that leave it open (context, divided+critical...): "
                        "hedged remaining length, the paper's group order, or attained (every request tested "
                        "early); seer and seer-paper fix their own")
    p.add_argument("--kv-affinity-spread", type=int, default=d.kv_affinity_spread,
                   help="resume a request where its KV is only while that instance runs at most this many more "
                        "requests than the least loaded one; -1: always")
    p.add_argument("--chunk-reserve-tokens", type=int, default=d.chunk_reserve_tokens,
                   help="KV a chunk reserves at admission, in tokens (a critical request's chunk: all of it); the "
                        "rest is allocated as it runs and the chunk ends early where KV runs out; -1: whole chunks")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="most tokens a response may generate (default 256; a --trace: the trace's generation "
                        "limit, a field of it or the next power of two above its longest response, scaled with "
                        "--length-scale; every group gets the same)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default 1.0; a length-only --trace defaults to each group's "
                        "recorded temperature/top_p/top_k)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: keep the smallest set of tokens with this much probability (1.0: off)")
    p.add_argument("--seed", type=int, default=0, help="random seed (each group and sibling derives its own from it)")
    p.add_argument("--fail-instance", type=int, default=None,
                   help="inject a fault: kill this instance (with --fail-after-s)")
    p.add_argument("--fail-after-s", type=float, default=None, help="... this many seconds into the rollout")


def length_scale_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] or 'auto', got {text!r}") from None


def rollout_config(args: argparse.Namespace, policy: str, num_kv_blocks: int | None = None) -> RolloutConfig:
    spread = args.kv_affinity_spread
    ahead = args.chunk_reserve_tokens
    engine = engine_config(args, num_kv_blocks=num_kv_blocks or args.num_kv_blocks, seed=args.seed)
    return RolloutConfig(policy=policy, instances=args.instances, backend=args.backend,
                         chunk_tokens=args.chunk_tokens, engine=engine, ordering=OrderingConfig(rank=args.context_rank),
                         kv_affinity_spread=None if spread is None or spread < 0 else spread,
                         chunk_reserve_tokens=None if ahead is None or ahead < 0 else ahead)


def build_groups(args: argparse.Namespace, model: Path) -> list:
    """The groups an invocation describes (prompts file or trace); ``--length-scale auto`` is resolved into
    ``args.length_scale`` here, so the report records the scale used."""
    from seer.models.config import ModelConfig
    from seer.models.tokenizer import Tokenizer
    from seer.rollout.workload import groups_from_prompts, groups_from_trace
    from seer.sampling_params import SamplingParams

    if bool(args.prompts) == bool(args.trace):
        raise ValueError("give exactly one of --prompts FILE or --trace FILE")
    if args.prompts and args.length_scale != 1.0:
        raise ValueError("--length-scale applies to --trace replay only")
    if args.group_size < 1:
        raise ValueError(f"--group-size must be >= 1, got {args.group_size}")
    if args.trace:
        if args.length_scale == "auto":
            args.length_scale = resolve_auto_length_scale(args, model)
        return groups_from_trace(args.trace, ModelConfig.from_dir(model).vocab_size, replay_options(args))
    temperature = 1.0 if args.temperature is None else args.temperature
    sp = SamplingParams(temperature=temperature, top_p=args.top_p, max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS,
                        seed=args.seed)
    return groups_from_prompts(args.prompts, Tokenizer.from_dir(model), args.group_size, sp, args.limit)


def rollout_defaults() -> argparse.Namespace:
    """Every rollout flag at its default."""
    parser = argparse.ArgumentParser()
    add_rollout_args(parser)
    return parser.parse_args([])


def recorded_args(args: argparse.Namespace) -> dict:
    """The rollout flags of an invocation, as a report records them (to resume it, or to replay it)."""
    return {key: getattr(args, key) for key in vars(rollout_defaults()) if hasattr(args, key)}


def replay_options(args: argparse.Namespace):  # noqa: ANN201 - ReplayOptions (imported late)
    """How ``--trace`` is replayed: scale, caps, sample, seed and temperature."""
    from seer.rollout.workload import ReplayOptions

    return ReplayOptions(args.length_scale, args.max_len, args.max_tokens, limit=args.limit, sample=args.sample,
                         seed=args.seed, temperature=args.temperature)


def resolve_auto_length_scale(args: argparse.Namespace, model: Path) -> float:
    """``--length-scale auto``: the scale at which the trace is ~TARGET_WORK_S of decoding per instance at the
    rate one instance's engine (as the local backend builds it) decodes here; says what it measured."""
    import sys

    from seer.data.traces import load_trace
    from seer.rollout.length_scale import TARGET_WORK_S, auto_length_scale, measure_decode_rate
    from seer.rollout.workload import ReplayOptions

    trace = load_trace(args.trace, limit=args.limit, sample=args.sample, seed=args.seed)
    lengths = [r.length for g in trace for r in g.responses]
    cfg = rollout_config(args, "verl")
    engine = cfg.instance_engine(str(model), default_threads=cfg.process_threads())
    threads = engine.num_threads or 1
    rate = measure_decode_rate(engine)
    scale = auto_length_scale(lambda s: [ReplayOptions(s, args.max_len).scale(n) for n in lengths],
                              args.instances, rate)
    print(f"--length-scale auto: one instance decodes {rate:.0f} tok/s here ({engine.dtype}, {threads} "
          f"thread{'s' if threads > 1 else ''}, batch 32): lengths x{scale:.2f}, ~{TARGET_WORK_S:.0f} s of decoding "
          f"per instance", file=sys.stderr)
    return scale


def fault_plan(args: argparse.Namespace):
    from seer.rollout.types import FaultPlan

    if args.fail_instance is None:
        return None
    if args.fail_after_s is None:
        raise ValueError("--fail-instance needs --fail-after-s")
    return FaultPlan(args.fail_instance, args.fail_after_s)
