"""Policy registry, parsing, unknown names, and veRL's static split."""

from __future__ import annotations

import pytest

from seer.rollout.policies import (
    RolloutPolicy,
    UnknownPolicyError,
    get_policy,
    instance_of_group,
    parse_policies,
    policy_names,
    split_groups_evenly,
)


def test_the_policies() -> None:
    assert policy_names() == ["verl", "divided", "context", "seer", "oracle", "group-oracle"]
    assert get_policy("verl") == RolloutPolicy("verl", divided=False, ordering="fifo", speculative=False)
    assert get_policy("verl").preempts and not get_policy("divided").preempts
    assert get_policy("context").ordering == "context" and not get_policy("context").speculative
    assert get_policy("seer").speculative and get_policy("seer").divided
    assert get_policy("oracle").needs_true_lengths


def test_unknown_policy_lists_known_names() -> None:
    with pytest.raises(UnknownPolicyError, match="unknown policy 'vllm'; known policies: verl, divided"):
        get_policy("vllm")
    with pytest.raises(ValueError, match="unknown ordering"):
        RolloutPolicy("x", divided=True, ordering="random", speculative=False)


def test_parse_policies() -> None:
    assert [p.name for p in parse_policies(" verl,seer ,verl")] == ["verl", "seer"]
    with pytest.raises(UnknownPolicyError, match="no policy"):
        parse_policies(" , ")
    with pytest.raises(UnknownPolicyError, match="'nope'"):
        parse_policies("verl,nope")


def test_split_groups_evenly() -> None:
    assert split_groups_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_groups_evenly([1, 2], 3) == [[1], [2], []]
    assert instance_of_group([10, 11, 12], 2) == {10: 0, 11: 0, 12: 1}
    with pytest.raises(ValueError):
        split_groups_evenly([1], 0)
