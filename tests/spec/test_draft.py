"""Draft arrays: validation, derived depths and masks, greedy acceptance along a tree."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from seer.spec.draft import EMPTY_DRAFT, Draft


def tree() -> Draft:
    #   -1 -> 0:a(10) -> 1:b(11) -> 2:c(12)
    #      -> 3:x(20) -> 4:y(21)
    #         0 -> 5:z(30)
    return Draft((10, 11, 12, 20, 21, 30), (-1, 0, 1, -1, 3, 0), (0.6, 0.9, 0.9, 0.3, 0.5, 0.1))


def test_linear_and_score() -> None:
    d = Draft.linear([5, 6, 7], [0.5, 0.5, 1.0], match_len=4)
    assert d.parents == (-1, 0, 1) and d.is_linear and d.depths == (1, 2, 3)
    assert d.score == pytest.approx(0.5 + 0.25 + 0.25) and d.match_len == 4
    assert Draft.linear([1, 2]).score == 2.0
    assert len(EMPTY_DRAFT) == 0 and EMPTY_DRAFT.accept_greedy([1, 2]) == []


def test_tree_shape() -> None:
    d = tree()
    assert not d.is_linear and d.depths == (1, 2, 3, 1, 2, 2) and d.max_depth == 3 and d.num_leaves == 3
    assert d.path_to(2) == [0, 1, 2] and d.path_probs()[4] == pytest.approx(0.15)
    mask = d.attention_mask()
    expect = np.zeros((6, 6), dtype=bool)
    for i in range(6):
        for j in d.path_to(i):
            expect[i, j] = True
    assert (mask == expect).all()


def test_accept_greedy_follows_matching_path() -> None:
    d = tree()
    assert d.accept_greedy([10, 11, 12, 99]) == [0, 1, 2]
    assert d.accept_greedy([10, 30, 1]) == [0, 5]
    assert d.accept_greedy([20, 21]) == [3, 4]
    assert d.accept_greedy([20, 99]) == [3]
    assert d.accept_greedy([99]) == []
    assert d.accept_greedy([10]) == [0]  # target shorter than the draft


def test_validation_and_pickle() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        Draft((1, 2), (-1,), (1.0, 1.0))
    with pytest.raises(ValueError, match="parents must precede"):
        Draft((1, 2), (-1, 1), (1.0, 1.0))
    d = tree()
    assert pickle.loads(pickle.dumps(d)) == d
