"""``--length-scale auto``: shrink a replayed trace so its rollout takes about the same time on any CPU.

Why: a demo or quick benchmark replays a fixed trace, and CPUs differ several-fold in decode speed (fp32 on
AVX2 against native bf16). A scale that gives a policy 40 s of work on one leaves 7 s on another, where the
per-step and per-process costs no policy removes weigh as much as the long tail that divided rollout and
grouped drafting shorten, so the gain drowns in run-to-run noise. The scale is therefore derived from a decode
rate measured here and now on one instance's engine (same model, dtype and threads): the trace's response
tokens, divided evenly over the instances, should take about ``target_s`` of decoding at that rate.

The rate is a short greedy decode at a fixed batch from distinct random prompts (no prefix sharing, short
contexts). It only sizes the workload; no reported figure depends on it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from seer.engine.config import EngineConfig

TARGET_WORK_S = 20.0  # decoding seconds per instance and policy (a demo runs two policies): at 12 the gain fell
# within noise on CPUs without native bf16 (benchmarks/README.md)
MIN_SCALE = 0.05  # below this a trace's responses are a few tokens long: nothing left to schedule
CALIBRATION_BATCH = 32
CALIBRATION_PROMPT = 32
CALIBRATION_STEPS = 16


def measure_decode_rate(config: EngineConfig, batch: int = CALIBRATION_BATCH, steps: int = CALIBRATION_STEPS,
                        seed: int = 0) -> float:
    """Output tokens per second of one engine built from ``config`` decoding ``batch`` sequences (the prefill
    step and the first decode step, which may build kernels or allocate, are not timed). The caller's torch
    thread count is restored: the engine sets its own."""
    import torch

    if batch < 1 or steps < 1:
        raise ValueError(f"batch and steps must be >= 1, got {batch} and {steps}")
    threads = torch.get_num_threads()
    try:
        return _decode_rate(config, batch, steps, seed)
    finally:
        torch.set_num_threads(threads)


def _decode_rate(config: EngineConfig, batch: int, steps: int, seed: int) -> float:
    from seer.engine.llm_engine import LLMEngine
    from seer.sampling_params import SamplingParams

    tokens = batch * (CALIBRATION_PROMPT + steps + 2)
    blocks = -(-tokens // config.block_size) + batch
    engine = LLMEngine(replace(config, num_kv_blocks=blocks, max_num_seqs=max(batch, config.max_num_seqs),
                               max_num_batched_tokens=max(config.max_num_batched_tokens,
                                                          batch * CALIBRATION_PROMPT)))
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(vocab) for _ in range(CALIBRATION_PROMPT)], params)
    engine.step()  # prefill (and each sequence's first token)
    engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return batch * steps / (time.perf_counter() - start)


def auto_length_scale(scale_lengths: Callable[[float], Sequence[int]], instances: int, rate_tok_s: float,
                      target_s: float = TARGET_WORK_S) -> float:
    """The largest scale in [MIN_SCALE, 1], rounded down to 0.01, at which the response lengths
    ``scale_lengths(scale)``, spread over ``instances``, take at most ``target_s`` at ``rate_tok_s`` each
    (MIN_SCALE when even that takes longer)."""
    if rate_tok_s <= 0 or instances < 1 or target_s <= 0:
        raise ValueError(f"rate, instances and target must be positive (got {rate_tok_s}, {instances}, {target_s})")

    def work_s(scale: float) -> float:
        return sum(scale_lengths(scale)) / instances / rate_tok_s

    lo, hi = MIN_SCALE, 1.0
    if work_s(hi) <= target_s:
        return hi
    for _ in range(30):  # work grows with the scale: bisect for the largest one within the target
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if work_s(mid) <= target_s else (lo, mid)
    return max(MIN_SCALE, int(lo * 100) / 100)
