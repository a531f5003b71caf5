"""Time one full-model decode step (random weights, a real model's shape) and its attention share.

Why: the engine's throughput target is set at batch-256 decode on CPU, where attention over ~300-token contexts
competes with the weight GEMMs; this measures both on the exact code path the engine runs (paged forward,
shared prompt blocks between G siblings as prefix caching produces them), without needing a checkpoint.

    python -m seer.models.profile_step --batch 1 16 64 256 --context 300 --threads 2 [--dtype D] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch

from seer.models.attention import AttentionMetadata
from seer.models.config import ModelConfig
from seer.models.packed_linear import prepack_linears
from seer.models.paged_attention import paged_attention
from seer.models.registry import build_model
from seer.utils.machine import auto_dtype
from seer.utils.malloc import keep_freed_memory

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M(-Instruct) config.json, the default model of the project
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class StepTiming:
    batch: int
    context: int
    step_ms: float  # forward + logits of the last token of every sequence
    attention_ms: float  # the 30 paged_attention calls of that step (KV write included)
    logits_ms: float

    @property
    def attention_share(self) -> float:
        return self.attention_ms / self.step_ms


def decode_meta(batch: int, context: int, group: int, prompt: int, block_size: int
                ) -> tuple[AttentionMetadata, int]:
    """One decode token per sequence; sequences in groups of ``group`` share ``prompt`` tokens of blocks."""
    shared = prompt // block_size
    own = -(-context // block_size) - shared
    groups = -(-batch // group)
    num_blocks = groups * shared + batch * own + 1
    perm = torch.randperm(num_blocks - 1) + 1
    tables = torch.zeros(batch, shared + own, dtype=torch.int64)
    for b in range(batch):
        g = b // group
        tables[b, :shared] = perm[g * shared:(g + 1) * shared]
        start = groups * shared + b * own
        tables[b, shared:] = perm[start:start + own]
    p = context - 1
    slots = tables[:, p // block_size] * block_size + p % block_size
    meta = AttentionMetadata(slot_mapping=slots, query_lens=[1] * batch, seq_lens=[context] * batch,
                             block_tables=tables, block_size=block_size)
    return meta, num_blocks


_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: robust to other load, 1 thread only
_clock = time.perf_counter


def _best_ms(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs: on a shared machine other processes only ever add time."""
    fn()  # warm-up (oneDNN primitives, kernel build, plan caches)
    times = []
    for _ in range(repeats):
        t = _clock()
        fn()
        times.append((_clock() - t) * 1e3)
    return min(times)


@torch.inference_mode()
def time_step(model: torch.nn.Module, config: ModelConfig, batch: int, context: int, repeats: int = 5,
              group: int = 8, prompt: int = 192, block_size: int = 16) -> StepTiming:
    dtype = model.dtype
    meta0, num_blocks = decode_meta(batch, context, group, prompt, block_size)
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    caches = [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(config.num_hidden_layers)]
    ids = torch.randint(0, config.vocab_size, (batch,))
    pos = torch.full((batch,), context - 1)

    def fresh_meta() -> AttentionMetadata:  # the engine builds a new one each step, so plans are rebuilt too
        return AttentionMetadata(meta0.slot_mapping, meta0.query_lens, meta0.seq_lens, meta0.block_tables,
                                 block_size)

    def step() -> None:
        model.compute_logits(model(ids, pos, fresh_meta(), caches))

    q = torch.randn(batch, config.num_attention_heads, config.head_dim).to(dtype)
    kv = torch.randn(batch, config.num_key_value_heads, config.head_dim).to(dtype)
    scale = config.head_dim ** -0.5

    def attention_only() -> None:
        meta = fresh_meta()
        for k_cache, v_cache in caches:
            paged_attention(q, kv, kv, k_cache, v_cache, meta, scale)

    hidden = torch.randn(batch, config.hidden_size).to(dtype)
    return StepTiming(batch, context, _best_ms(step, repeats), _best_ms(attention_only, repeats),
                      _best_ms(lambda: model.compute_logits(hidden), repeats))


def random_model(raw: dict, dtype: torch.dtype) -> tuple[torch.nn.Module, ModelConfig]:
    config = ModelConfig.from_dict(raw)
    model = build_model(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model = model.to(dtype).eval().requires_grad_(False)
    prepack_linears(model)  # as the engine does
    return model, config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=auto_dtype(),
                    help="default: what dtype='auto' picks on this CPU")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clock", choices=sorted(_CLOCKS), default="wall",
                    help="cpu = process CPU time (meaningful with --threads 1 on a loaded machine)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    global _clock
    _clock = _CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the engine does: else the LM head's output page-faults anew every step
    model, config = random_model(SMOLLM2_135M, getattr(torch, args.dtype))
    rows = []
    print(f"{'batch':>5} {'step ms':>9} {'attn ms':>9} {'attn %':>7} {'logits ms':>9} {'tok/s':>8}")
    for b in args.batch:
        t = time_step(model, config, b, args.context, args.repeats)
        rows.append({**asdict(t), "attention_share": t.attention_share})
        print(f"{b:>5} {t.step_ms:>9.1f} {t.attention_ms:>9.1f} {100 * t.attention_share:>6.0f}% "
              f"{t.logits_ms:>9.1f} {1000 * b / t.step_ms:>8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "dtype": args.dtype, "clock": args.clock, "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
