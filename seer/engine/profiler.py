"""Profile the verify cost T(B, n) of the running engine, for the adaptive draft-length policy.

T(B, n) is the wall time of one step in which B sequences each compute n tokens (n = 1: plain decode; n = 1 +
gamma: verifying gamma draft tokens). It is measured on this machine with this model, dtype and thread count
(the policy's decisions are only as good as this table) and cached on disk keyed by those.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from pathlib import Path

import torch

from seer.engine.llm_engine import LLMEngine
from seer.models.attn_kernel import kernel_available, source_digest
from seer.sampling_params import SamplingParams
from seer.spec.policy import VerifyCostModel

BATCH_SIZES = (1, 4, 16, 64)
TOKENS_PER_SEQ = (1, 2, 3, 5, 9)


def _kernel_source_hash() -> str | None:
    """Identifies the attention kernel build in use (None: the PyTorch path)."""
    if not kernel_available():
        return None
    return source_digest()


def _cache_path(engine: LLMEngine, context: int, cache_dir: Path) -> Path:
    cfg = engine.config
    # the code paths a step takes (packed linears, attention kernel) change its cost, so they are in the key
    paths = sorted({type(m).__name__ for m in engine.model.modules()})
    key = json.dumps([str(Path(cfg.model).resolve()), cfg.dtype, cfg.device, torch.get_num_threads(), context,
                      BATCH_SIZES, TOKENS_PER_SEQ, paths, _kernel_source_hash()])
    return cache_dir / f"verify-cost-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _measure_batch(engine: LLMEngine, batch: int, context: int, repeats: int, rng: random.Random) -> list[float]:
    vocab = engine.model_config.vocab_size
    forced = [rng.randrange(vocab) for _ in range(4 + repeats * len(TOKENS_PER_SEQ) * 10)]
    reqs = [engine.add_request([rng.randrange(vocab) for _ in range(context)],
                               SamplingParams(temperature=0.0, max_tokens=len(forced)), forced_token_ids=forced)
            for _ in range(batch)]
    while any(r.num_output_tokens == 0 for r in reqs):
        engine.step()
    row: list[float] = []
    for n in TOKENS_PER_SEQ:
        times = []
        for _ in range(repeats):
            for r in reqs:
                r.spec_token_ids = [rng.randrange(vocab) for _ in range(n - 1)]
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        row.append(statistics.median(times))
    for r in reqs:
        engine.abort(r.request_id)
    return row


def profile_verify_cost(engine: LLMEngine, context: int = 128, repeats: int = 3,
                        cache_dir: Path | None = None) -> VerifyCostModel:
    """Measure (or load from the cache) the verify cost table of this engine."""
    if engine.has_unfinished():
        raise RuntimeError("profile the verify cost on an idle engine")
    path = _cache_path(engine, context, cache_dir) if cache_dir is not None else None
    if path is not None and path.is_file():
        return VerifyCostModel.from_profile(json.loads(path.read_text()))
    saved, engine.speculator = engine.speculator, None
    rng = random.Random(0)
    sizes = [b for b in BATCH_SIZES
             if engine.block_manager.blocks_needed(context + 64) * b <= engine.block_manager.num_blocks
             and b <= engine.scheduler.config.max_num_seqs]
    try:
        _measure_batch(engine, sizes[0], context, 1, rng)  # warm-up
        table = [_measure_batch(engine, b, context, repeats, rng) for b in sizes]
    finally:
        engine.speculator = saved
    model = VerifyCostModel(sizes, TOKENS_PER_SEQ, table)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(model.to_profile()))
    return model
