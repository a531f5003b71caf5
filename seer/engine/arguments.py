"""The engine's command-line flags, defined once for every verb that builds engines.

Why one place: ``seer generate`` (one engine), ``seer rollout``, ``seer serve`` and the rollout benchmarks (an
engine per instance) must accept the same settings under the same names, or they drift apart. Each flag sets the
``EngineConfig`` field of the same meaning with that field's default, so a new engine setting reaches every verb
at once. It lives in the library, below the command line, because the benchmarks share the rollout's flags
through ``seer.rollout.arguments``, which may not import ``seer.cli``. Torch-free: argparse and the config only.
"""

from __future__ import annotations

import argparse
from typing import Any

from seer.engine.config import EngineConfig

DTYPE_HELP = ("auto (default): bf16 on CUDA or where the CPU computes it natively (AVX512_BF16, AMX), else "
              "float32; or float32, bfloat16, float16")


def add_engine_args(p: argparse.ArgumentParser, defaults: EngineConfig | None = None) -> None:
    """The model and every engine setting, as one ``engine`` group of ``p``; defaults are those of ``defaults``
    (a plain engine's unless given; a rollout passes its instances' template, which holds less KV)."""
    d = defaults or EngineConfig()
    g = p.add_argument_group("engine", "the model and the settings of each engine instance")
    g.add_argument("--model", default=None,
                   help="model directory or known name (default: smollm2-135m-instruct, prepared on first use)")
    g.add_argument("--dtype", default=EngineConfig.dtype, help=DTYPE_HELP)
    g.add_argument("--device", default=d.device, help="cpu or cuda[:N]")
    g.add_argument("--kv-cache-gb", type=float, default=d.kv_cache_memory_gb,
                   help="KV cache memory per engine instance, GiB (default: %(default)s)")
    g.add_argument("--num-kv-blocks", type=int, default=d.num_kv_blocks,
                   help="KV cache blocks per engine instance (overrides --kv-cache-gb)")
    g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV cache block")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="most sequences an instance runs in one step")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="most tokens an instance computes in one step (prefill chunks included)")
    g.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="longest prompt + response (default: the model's context length, at most 8192)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching,
                   help="reuse the KV of shared prompt prefixes (--no-enable-prefix-caching: off)")
    g.add_argument("--threads", type=int, default=d.num_threads,
                   help="torch threads per engine instance (default: torch's own in process; the local backend "
                        "splits the cores among its processes, ray gives each actor one)")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EngineConfig`` fields (``LLM`` keyword arguments) the engine flags set; the model is left to the verb,
    which resolves a known name to its directory."""
    return dict(dtype=args.dtype, device=args.device, kv_cache_memory_gb=args.kv_cache_gb,
                num_kv_blocks=args.num_kv_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                enable_prefix_caching=args.enable_prefix_caching, num_threads=args.threads)


def engine_config(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """The engine the flags describe (model unset: a rollout's template), with ``overrides`` (e.g. ``seed``)."""
    return EngineConfig(**{**engine_kwargs(args), **overrides})
