"""GRPO advantages against hand-computed values, and DAPO's dropping of all-equal groups."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seer.rl.advantages import group_advantages, grpo_advantages, uniform_groups


def test_group_normalised_advantages_by_hand():
    # rewards 1,0,0,1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    assert adv.tolist()[0] == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # rewards 3,1,2: mean 2, std 1 -> 1, -1, 0
    adv = group_advantages(torch.tensor([[3.0, 1.0, 2.0]]), eps=1e-6)
    assert adv.tolist()[0] == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0], abs=1e-7)


def test_dr_grpo_only_centres():
    adv = group_advantages(torch.tensor([[3.0, 1.0, 2.0], [0.0, 0.0, 1.0]]), norm_by_std=False)
    assert adv.tolist() == [pytest.approx([1.0, -1.0, 0.0]), pytest.approx([-1 / 3, -1 / 3, 2 / 3])]


def test_groups_are_independent():
    rewards = torch.tensor([[1.0, 0.0], [5.0, 7.0]])
    adv = group_advantages(rewards, eps=0.0)
    # two values a < b: mean (a+b)/2, unbiased std |b-a|/sqrt(2) -> -+1/sqrt(2)
    s = 1 / math.sqrt(2)
    assert adv.tolist() == [pytest.approx([s, -s]), pytest.approx([-s, s])]


def test_uniform_groups_are_dropped_like_dapo():
    res = grpo_advantages([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    assert res.keep == [False, True, False] and res.num_dropped == 2
    assert res.advantages[0] == [0.0] * 4
    assert [g for g, _, _ in res.kept_pairs()] == [1] * 4
    # group 1: mean 0.25, std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert res.advantages[1] == pytest.approx([-0.5, 1.5, -0.5, -0.5], abs=1e-5)
    kept_all = grpo_advantages([[1, 1], [0, 1]], drop_uniform=False)
    assert kept_all.keep == [True, True] and kept_all.advantages[0] == [0.0, 0.0]


def test_ragged_groups_and_singletons():
    res = grpo_advantages([[1.0, 0.0, 0.0], [2.0]])
    assert len(res.advantages[0]) == 3 and res.advantages[1] == [0.0]
    assert res.keep == [True, False]  # a single response has nobody to compare with
    assert uniform_groups(torch.tensor([[0.5, 0.5], [0.5, 0.6]])).tolist() == [True, False]
    with pytest.raises(ValueError, match="no responses"):
        grpo_advantages([[]])
    with pytest.raises(ValueError, match="groups, group_size"):
        group_advantages(torch.tensor([1.0, 2.0]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-10, 10), min_size=2, max_size=8), min_size=1, max_size=5),
       st.floats(0.1, 10), st.floats(-5, 5))
def test_advantages_are_centred_scaled_and_affine_invariant(groups, scale, shift):
    res = grpo_advantages(groups, eps=1e-12)
    moved = grpo_advantages([[scale * r + shift for r in g] for g in groups], eps=1e-12)
    for g, adv, adv2, keep in zip(groups, res.advantages, moved.advantages, res.keep):
        if not keep:
            continue
        assert sum(adv) == pytest.approx(0.0, abs=1e-4)
        if max(g) - min(g) > 1e-3:  # well-conditioned groups: unit unbiased std, same under r -> a r + b
            t = torch.tensor(adv, dtype=torch.float64)
            assert float(t.std(unbiased=True)) == pytest.approx(1.0, abs=1e-4)
            assert adv2 == pytest.approx(adv, abs=1e-3)
