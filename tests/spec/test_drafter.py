"""Drafting from occurrences: longest match decides, frequency breaks ties, tree drafts respect their limits."""

from __future__ import annotations

import random

import pytest

from seer.spec.drafter import DrafterConfig, SuffixDrafter
from seer.spec.suffix_tree import SuffixIndex


def make_index(streams: dict) -> SuffixIndex:
    index = SuffixIndex()
    for sid, toks in streams.items():
        index.append(sid, toks)
    return index


def test_majority_continuation_wins() -> None:
    index = make_index({0: [1, 2, 3, 7, 8], 1: [1, 2, 3, 7, 8], 2: [1, 2, 3, 9, 9]})
    d = SuffixDrafter().draft(index, [1, 2, 3], max_tokens=4)
    assert d.token_ids == (7, 8) and d.is_linear and d.match_len == 3
    assert d.probs[0] == pytest.approx(2 / 3.5)  # 2 of 3 occurrences agree, prior 0.5
    assert 0 < d.score <= len(d)


def test_longer_match_beats_more_frequent() -> None:
    index = make_index({0: [5, 1, 2, 3, 4], 1: [6, 2, 3, 9], 2: [6, 2, 3, 9], 3: [6, 2, 3, 9]})
    d = SuffixDrafter().draft(index, [5, 1, 2, 3], max_tokens=1)
    assert d.token_ids == (4,) and d.match_len == 4


def test_follows_reference_up_to_depth() -> None:
    ref = list(range(100, 130))
    index = make_index({0: [1] + ref})
    d = SuffixDrafter(DrafterConfig(gamma_max=8)).draft(index, [1], max_tokens=20)
    assert d.token_ids == tuple(ref[:8])
    assert SuffixDrafter().draft(index, [1], max_tokens=3).token_ids == tuple(ref[:3])
    assert len(SuffixDrafter().draft(index, [999], max_tokens=8)) == 0
    assert len(SuffixDrafter().draft(index, [1], max_tokens=0)) == 0


def test_min_match() -> None:
    index = make_index({0: [1, 2, 3]})
    assert len(SuffixDrafter(DrafterConfig(min_match=2)).draft(index, [9, 1], max_tokens=4)) == 0
    assert len(SuffixDrafter(DrafterConfig(min_match=2)).draft(index, [1, 2], max_tokens=4)) == 1


@pytest.mark.parametrize("seed", range(8))
def test_tree_limits_and_uniqueness(seed: int) -> None:
    rng = random.Random(seed)
    streams = {i: [rng.randrange(4) for _ in range(80)] for i in range(4)}
    index = make_index(streams)
    drafter = SuffixDrafter()
    for _ in range(20):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 6))]
        for k, budget, depth in ((2, 16, 8), (4, 32, 8), (4, 5, 3), (3, 40, 8)):
            d = drafter.draft(index, ctx, budget, k, depth)
            linear = drafter.draft(index, ctx, depth, 1)
            assert len(d) <= budget and d.max_depth <= depth and d.num_leaves <= k
            children = {(p, t) for p, t in zip(d.parents, d.token_ids)}
            assert len(children) == len(d), "two children of one node share a token"
            assert all(0 < p <= 1 for p in d.probs)
            assert d.token_ids[: len(linear)] == linear.token_ids[: min(len(linear), budget)]
            assert d.score >= linear.score - 1e-9 or len(d) < len(linear)


def test_tree_alternative_branch() -> None:
    index = make_index({0: [1, 2, 3, 4], 1: [1, 2, 3, 4], 2: [1, 2, 5, 6]})
    d = SuffixDrafter().draft(index, [1, 2], max_tokens=8, k_branches=2, max_depth=4)
    assert d.token_ids == (3, 4, 5, 6) and d.parents == (-1, 0, -1, 2)
    assert d.accept_greedy([5, 6, 0]) == [2, 3]


def test_config_errors() -> None:
    for bad in (dict(gamma_max=0), dict(length_base=0.5), dict(min_match=0), dict(prob_prior=-1),
                dict(max_match_gap=-1)):
        with pytest.raises(ValueError):
            DrafterConfig(**bad)
