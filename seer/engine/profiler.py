"""Profile the verify cost T(B, n) of the running engine, for the adaptive draft-length policy.

T(B, n) is the wall time of one step in which B sequences each compute n tokens (n = 1: plain decode; n = 1 +
gamma: verifying gamma draft tokens). It is measured on this machine with this model, dtype and thread count
(the policy's decisions are only as good as this table) and cached on disk keyed by those.

Every batch size up to 48 that the KV cache can hold is measured, with a shorter context where the full one does
not fit: a rollout's instance may run 30-60 sequences in a small KV budget, and a table that stopped at batch 4
was extrapolated there into nonsense (verification looked free). Timings are noisy on a shared machine, so the
table is made monotone (a step never gets cheaper with more sequences or more tokens each).

The sequences of one batch share their prompt, as a group's siblings do, so it is computed once: prefilling a
separate prompt per sequence cost more than all the measured steps together. The first run says what it does
and shows its progress; later runs read the cache.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from seer.engine.llm_engine import LLMEngine
from seer.models.attn_kernel import kernel_available, source_digest
from seer.sampling_params import SamplingParams
from seer.spec.policy import VerifyCostModel
from seer.utils.machine import cpu_info

BATCH_SIZES = (1, 4, 16, 48)  # larger batches extrapolate linearly: a step is compute-bound there
# the cost is near linear in tokens per sequence (flat while a step is memory-bound, then a slope), so three points
# interpolate the rest; every point measured adds to a first run's wait (timings: benchmarks/README.md)
TOKENS_PER_SEQ = (1, 3, 9)
MIN_CONTEXT = 16  # shortest context worth measuring
LONG_CONTEXT = 2048  # one sequence is measured here too: the cost of a longer context (read_s, pair_s)
SLOPE_REPEATS = 8  # the long step differs from the short by a few percent of a step: more repeats than the table
GROWTH = 48  # KV tokens a measured sequence may grow by (its outputs plus the largest verify step)
PROFILE_METHOD = 6  # in the cache key: profiles measured another way are measured again


def _kernel_source_hash() -> str | None:
    """Identifies the attention kernel build in use (None: the PyTorch path)."""
    if not kernel_available():
        return None
    return source_digest()


def profile_plan(num_blocks: int, block_size: int, max_num_seqs: int, context: int) -> list[tuple[int, int]]:
    """(batch size, context) pairs to measure: each batch size whose sequences fit the KV cache with at least
    ``MIN_CONTEXT`` tokens of context, at ``context`` or the most that fits."""
    plan = []
    for batch in BATCH_SIZES:
        fits = (num_blocks // batch) * block_size - GROWTH
        if batch > max_num_seqs or min(context, fits) < MIN_CONTEXT:
            break
        plan.append((batch, min(context, fits)))
    return plan


def monotone(table: list[list[float]]) -> list[list[float]]:
    """Running maxima along tokens per sequence, then along batch size."""
    rows = [[max(row[: j + 1]) for j in range(len(row))] for row in table]
    return [[max(r[j] for r in rows[: i + 1]) for j in range(len(rows[i]))] for i in range(len(rows))]


def context_costs(near: list[float], far: list[float], near_context: int, far_context: int) -> tuple[float, float]:
    """``(read_s, pair_s)`` from one sequence's row at two contexts: the plain step's extra time per extra context
    token is one read and one pair, the longest verify step's (most tokens) one read and that many pairs; never
    negative (timing noise)."""
    span, tokens = far_context - near_context, TOKENS_PER_SEQ[-1]
    plain, verify = (far[0] - near[0]) / span, (far[-1] - near[-1]) / span
    pair = max(0.0, (verify - plain) / (tokens - 1))
    return max(0.0, plain - pair), pair


def _cache_path(engine: LLMEngine, plan: list[tuple[int, int]], cache_dir: Path) -> Path:
    cfg = engine.config
    # the code paths a step takes (packed linears, attention kernel) change its cost, so they are in the key
    paths = sorted({type(m).__name__ for m in engine.model.modules()})
    key = json.dumps([str(Path(cfg.model).resolve()), cfg.dtype, cfg.device, torch.get_num_threads(), plan,
                      TOKENS_PER_SEQ, paths, _kernel_source_hash(), cpu_info()["features"], PROFILE_METHOD])
    return cache_dir / f"verify-cost-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _measure_batch(engine: LLMEngine, batch: int, context: int, repeats: int, rng: random.Random,
                   tick: Callable[[], None] = lambda: None) -> list[float]:
    vocab = engine.model_config.vocab_size
    forced = [rng.randrange(vocab) for _ in range(GROWTH)]
    prompt = [rng.randrange(vocab) for _ in range(context)]
    params = SamplingParams(temperature=0.0, max_tokens=len(forced))
    reqs = [engine.add_request(prompt, params, forced_token_ids=forced)]
    for size in (1, batch):  # the first sequence computes the prompt, the others then find it cached
        reqs += [engine.add_request(prompt, params, forced_token_ids=forced) for _ in range(size - len(reqs))]
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
        tick()
    for r in reqs:
        engine.abort(r.request_id)
    return row


def profile_verify_cost(engine: LLMEngine, context: int = 128, repeats: int = 2,
                        cache_dir: Path | None = None, progress: bool = True) -> VerifyCostModel:
    """Measure (or load from the cache) the verify cost table of this engine."""
    if engine.has_unfinished():
        raise RuntimeError("profile the verify cost on an idle engine")
    bm = engine.block_manager
    plan = profile_plan(bm.num_blocks, bm.block_size, engine.scheduler.config.max_num_seqs, context)
    if not plan:
        raise RuntimeError(f"the KV cache ({bm.num_blocks} blocks) cannot hold one sequence to profile")
    path = _cache_path(engine, plan, cache_dir) if cache_dir is not None else None
    if path is not None and path.is_file():
        return VerifyCostModel.from_profile(json.loads(path.read_text()))
    saved, engine.speculator = engine.speculator, None
    rng = random.Random(0)
    where = f", cached in {path.parent}" if path is not None else ""
    bar = tqdm(total=len(plan) * len(TOKENS_PER_SEQ), disable=not progress, unit="point",
               desc=f"profiling step cost at batch {'/'.join(str(b) for b, _ in plan)} (once per model, dtype, "
                    f"threads and CPU{where})")
    long = min(LONG_CONTEXT, bm.num_blocks * bm.block_size, engine.scheduler.config.max_model_len) - GROWTH
    try:
        _measure_batch(engine, *plan[0], 1, rng)  # warm-up
        table = [_measure_batch(engine, b, ctx, repeats, rng, lambda: bar.update(1)) for b, ctx in plan]
        slopes: tuple[list[float], list[float]] | None = None
        if long > 2 * plan[0][1]:  # one sequence, both ends timed alike
            slopes = (_measure_batch(engine, 1, plan[0][1], SLOPE_REPEATS, rng),
                      _measure_batch(engine, 1, long, SLOPE_REPEATS, rng))
    finally:
        bar.close()
        engine.speculator = saved
    read_s, pair_s = (0.0, 0.0) if slopes is None else context_costs(slopes[0], slopes[1], plan[0][1], long)
    model = VerifyCostModel([b for b, _ in plan], TOKENS_PER_SEQ, monotone(table), pair_s=pair_s,
                            context=plan[0][1], read_s=read_s)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(model.to_profile()))
    return model
