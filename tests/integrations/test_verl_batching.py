"""verl rows <-> Seer groups and verl's output layout, without verl or a model."""

import pytest
import torch

from seer.integrations.verl.batching import (
    RowSlot,
    SeerResponse,
    group_rows,
    group_seed,
    left_pad,
    pack_rows,
    position_ids_from_mask,
    sampling_params,
    seer_options,
)


def test_interleaved_rows_fold_into_groups_in_order():
    prompts = [[5, 6]] * 3 + [[7]] * 3
    g = group_rows(prompts, ["a"] * 3 + ["b"] * 3)
    assert g.prompts == [(5, 6), (7,)] and g.sizes == [3, 3]
    assert g.slots == [RowSlot(0, 0), RowSlot(0, 1), RowSlot(0, 2), RowSlot(1, 0), RowSlot(1, 1), RowSlot(1, 2)]


def test_shuffled_rows_and_prompt_grouping_without_uid():
    prompts = [[1, 2], [3], [1, 2], [3], [1, 2]]
    g = group_rows(prompts)
    assert g.sizes == [3, 2]
    assert [s.group for s in g.slots] == [0, 1, 0, 1, 0]
    assert [s.index for s in g.slots] == [0, 0, 1, 1, 2]


def test_same_prompt_different_uid_stays_apart_and_uid_with_two_prompts_fails():
    g = group_rows([[9], [9], [9], [9]], ["x", "x", "y", "y"])
    assert g.sizes == [2, 2] and g.prompts == [(9,), (9,)]
    with pytest.raises(ValueError, match="different prompt"):
        group_rows([[1], [2]], ["u", "u"])
    with pytest.raises(ValueError, match="empty prompt"):
        group_rows([[]])
    with pytest.raises(ValueError, match="uids"):
        group_rows([[1]], ["a", "b"])


def test_sampling_params_follow_verl_config():
    cfg = {"temperature": 0.9, "top_p": 0.8, "top_k": 0, "response_length": 33,
           "val_kwargs": {"temperature": 0.3, "top_p": 1.0, "top_k": 5, "do_sample": False}}
    p = sampling_params(cfg, {"temperature": 0.7}, seed=4)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed) == (0.7, 0.8, -1, 33, 4)
    v = sampling_params(cfg, {"validate": True})
    assert v.temperature == 0.0 and v.top_k == -1  # val_kwargs.do_sample=False -> greedy
    assert sampling_params(cfg, {"do_sample": False}).temperature == 0.0
    vs = sampling_params(dict(cfg, val_kwargs=dict(cfg["val_kwargs"], do_sample=True)), {"validate": True})
    assert (vs.temperature, vs.top_k) == (0.3, 5)
    g = sampling_params(cfg, {}, greedy=True)
    assert (g.temperature, g.top_p, g.top_k) == (0.0, 1.0, -1)


def test_group_seed_distinct_per_step_and_group():
    assert group_seed(None, 1, 2) is None
    seeds = {group_seed(7, s, g) for s in range(3) for g in range(4)}
    assert len(seeds) == 12


def test_pack_rows_layout():
    ids, mask = left_pad([[5, 6, 7], [8]], 4, pad_id=0)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]] and mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    rows = [SeerResponse([10, 11], [-0.5, -0.25]), SeerResponse([12, 13, 14, 15, 16], [-1.0] * 5)]
    out = pack_rows(ids, mask, rows, response_length=4, pad_id=0)
    assert out["responses"].tolist() == [[10, 11, 0, 0], [12, 13, 14, 15]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out["input_ids"].shape == (2, 8) and out["attention_mask"].shape == (2, 8)
    assert out["attention_mask"][:, 4:].tolist() == out["response_mask"].tolist()
    assert out["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 4, 4]
    assert out["rollout_log_probs"][0].tolist() == [-0.5, -0.25, 0.0, 0.0]
    assert out["rollout_log_probs"].dtype == torch.float32
    assert "rollout_log_probs" not in pack_rows(ids, mask, rows, 4, 0, with_logprobs=False)
    pos = position_ids_from_mask(mask)
    cont = pack_rows(ids, mask, rows, 4, 0, prompt_position_ids=pos)
    assert cont["position_ids"][1].tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="prompt_length"):
        left_pad([[1, 2, 3]], 2, 0)


def test_seer_options_from_custom():
    assert seer_options({}) == {}
    assert seer_options({"custom": {"seer": {"url": "http://x"}}}) == {"url": "http://x"}


def test_variants_split_rows_sharing_a_uid():
    """verl's REMAX sends the greedy baseline row with the same uid as the sampled ones."""
    g = group_rows([[4], [4], [4]], ["u", "u", "u"], variants=["", "", "greedy"])
    assert g.sizes == [2, 1] and g.keys == ["uid:u", "uid:u|greedy"]
    assert g.slots[2] == RowSlot(1, 0)
