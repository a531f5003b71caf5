"""Policy registry, parsing, unknown names, and veRL's static split."""

from __future__ import annotations

from dataclasses import replace

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
    assert policy_names() == ["verl", "divided", "context", "seer", "seer-nodraft", "seer-paper", "oracle",
                              "seer-oracle", "group-oracle"]
    assert get_policy("seer-nodraft") == replace(get_policy("seer"), name="seer-nodraft", speculative=False)
    assert get_policy("verl") == RolloutPolicy("verl", divided=False, ordering="fifo", speculative=False)
    assert get_policy("verl").preempts and not get_policy("divided").preempts
    assert get_policy("context").ordering == "context" and not get_policy("context").speculative
    assert get_policy("seer").speculative and get_policy("seer").divided
    seer, paper = get_policy("seer"), get_policy("seer-paper")
    assert seer.critical and seer.rank == "attained"  # the default stack: test early, isolate the tail
    assert paper.speculative and not paper.critical and paper.rank == "group"  # the paper's, as published
    assert get_policy("oracle").needs_true_lengths


def test_a_policy_fixes_its_rank_and_critical_placement_once() -> None:
    with pytest.raises(UnknownPolicyError, match="already places the critical path"):
        get_policy("seer+critical")
    assert get_policy("seer-paper+critical").critical and get_policy("context+critical").rank is None
    with pytest.raises(ValueError, match="needs the context ordering"):
        RolloutPolicy("x", divided=True, ordering="fifo", speculative=False, rank="attained")


def test_the_policy_rank_reaches_the_ordering() -> None:
    from types import SimpleNamespace

    from seer.rollout.driver import RolloutDriver
    from seer.rollout.orderings import OrderingConfig
    from seer.rollout.types import GroupInput
    from seer.sampling_params import SamplingParams

    groups = [GroupInput((1, 2), 2, SamplingParams(max_tokens=4))]
    inst = [SimpleNamespace(instance_id=0)]
    for name, rank in (("seer-paper", "group"), ("context", "remaining")):
        drv = RolloutDriver(get_policy(name), inst, groups, ordering_config=OrderingConfig(),  # type: ignore[arg-type]
                            critical_speedup=lambda b: b)
        assert drv.buffer.ordering.config.rank == rank


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
