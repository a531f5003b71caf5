"""The trainer's recomputed logprobs equal the engine's sampling logprobs (temperature-scaled), and padding in
a batch does not change them."""

from dataclasses import replace

import pytest
import torch

from seer.engine.speculator import SpecConfig
from seer.models.loader import load_model
from seer.rl.logprobs import response_logprobs, response_logprobs_batched
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams


def test_recomputed_logprobs_match_the_rollout(tiny):
    sp = SamplingParams(temperature=0.7, max_tokens=10)
    groups = [GroupInput(tuple(range(5 + i, 12 + 3 * i)), 3, sp, key=f"g{i}") for i in range(3)]
    engine = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=64)
    cfg = RolloutConfig(policy="context", instances=2, chunk_tokens=3, engine=engine, spec=SpecConfig(adaptive=False))
    with RolloutCoordinator(tiny, cfg) as coord:
        records = coord.rollout(groups, progress=False).records()
    model, _ = load_model(tiny, torch.float32)
    with torch.no_grad():
        out = response_logprobs(model, [r["prompt_token_ids"] for r in records], [r["token_ids"] for r in records],
                                temperature=0.7, with_entropy=True)
    engine = torch.tensor([lp for r in records for lp in r["logprobs"]])
    assert out.logprobs.shape == engine.shape
    torch.testing.assert_close(out.logprobs, engine, atol=2e-5, rtol=0)
    assert out.entropy is not None and bool((out.entropy > 0).all())
    # a different temperature is a different distribution
    with torch.no_grad():
        hot = response_logprobs(model, [records[0]["prompt_token_ids"]], [records[0]["token_ids"]], 1.0)
    assert not torch.allclose(hot.logprobs, engine[: len(records[0]["token_ids"])], atol=1e-3)


def test_padding_and_batching_do_not_change_logprobs(tiny):
    model, _ = load_model(tiny, torch.float32)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    responses = [[20, 21, 22, 23, 24], [30, 31]]
    alone = [response_logprobs(model, [p], [r]).logprobs.detach() for p, r in zip(prompts, responses)]
    batched = response_logprobs_batched(model, prompts, responses, 1.0, micro_batch_size=2)
    for a, b in zip(alone, batched):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="at least one token"):
        response_logprobs(model, [[1]], [[]])
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(model, [[1]], [[2]], temperature=0.0)
