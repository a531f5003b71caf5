"""Suffix index: invariants under random operations, lookups equal a brute-force reference, own-future rule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seer.spec.suffix_tree import Match, SuffixIndex, SuffixIndexConfig

SMALL = SuffixIndexConfig(levels=(1, 2, 4), max_pattern=6, max_candidates=10_000, min_candidates=1)


def brute_matches(streams: dict, context: list[int], cfg: SuffixIndexConfig) -> set[tuple]:
    """Occurrences (with a continuation) of the context suffix, gathered level by level like the index does."""
    occ = []
    for sid, toks in streams.items():
        for end in range(len(toks) - 1):
            m = 0
            while m < min(cfg.max_pattern, len(context)) and m <= end and toks[end - m] == context[-1 - m]:
                m += 1
            if m:
                occ.append((sid, end, m))
    chosen: list[tuple] = []
    for level in reversed(cfg.levels):
        if level > len(context):
            continue
        chosen = [o for o in occ if o[2] >= level]
        if len(chosen) >= cfg.min_candidates:
            break
    return set(chosen)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3), st.lists(st.integers(0, 3), max_size=6)),
        st.tuples(st.just("remove"), st.integers(0, 3), st.just([])),
        st.tuples(st.just("lookup"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, min_candidates=st.sampled_from([1, 3]))
def test_random_operations_keep_integrity_and_match_brute_force(ops: list, min_candidates: int) -> None:
    cfg = SuffixIndexConfig(levels=(1, 2, 4), max_pattern=6, max_candidates=10_000, min_candidates=min_candidates)
    index = SuffixIndex(cfg)
    shadow: dict[int, list[int]] = {}
    for op, sid, toks in ops:
        if op == "append":
            index.append(sid, toks)
            shadow.setdefault(sid, []).extend(toks)
        elif op == "remove" and sid in shadow:
            index.remove_stream(sid)
            del shadow[sid]
        elif op == "lookup":
            got = {tuple(m) for m in index.find_matches(toks)}
            assert got == brute_matches(shadow, toks, cfg)
        index.check_integrity()
        assert index.num_tokens == sum(map(len, shadow.values()))


def test_longest_first_and_exact_lengths() -> None:
    index = SuffixIndex(SuffixIndexConfig(levels=(1, 2, 4), max_pattern=6, min_candidates=2))
    index.append("a", [1, 2, 3, 4, 9])
    index.append("b", [7, 3, 4, 5])
    found = index.find_matches([0, 1, 2, 3, 4])
    assert found == [Match("a", 3, 4), Match("b", 2, 2)]
    alone = SuffixIndex(SMALL)  # min_candidates=1: the level-4 occurrence alone is enough
    alone.append("a", [1, 2, 3, 4, 9])
    alone.append("b", [7, 3, 4, 5])
    assert alone.find_matches([0, 1, 2, 3, 4]) == [Match("a", 3, 4)]


def test_match_at_stream_end_is_not_returned() -> None:
    index = SuffixIndex(SMALL)
    index.append("own", [5, 6, 7])
    assert index.find_matches([5, 6, 7]) == []  # the only occurrence is the context itself: nothing after it
    index.append("own", [5, 6, 7])
    assert index.find_matches([5, 6, 7]) == [Match("own", 2, 3)]  # its own past: 5 6 7 -> 5


def test_own_stream_holds_only_the_past() -> None:
    """Replaying a response token by token, a token unique to its future never appears in a lookup."""
    rng = random.Random(0)
    sibling = [rng.randrange(20) for _ in range(200)]
    own = [rng.randrange(20) for _ in range(60)] + [100 + i for i in range(40)]  # 100+ only in its future
    prompt = [0, 1, 2]
    index = SuffixIndex(SMALL)
    index.append("prompt", prompt)
    index.append("sib", sibling)
    for pos, tok in enumerate(own):
        context = prompt + own[:pos]
        for m in index.find_matches(context):
            nxt = index.stream(m.stream_id)[m.end + 1]
            assert nxt < 100 or (m.stream_id == "own" and m.end + 1 < pos)
        index.append("own", [tok])
    index.check_integrity()


def test_exclude_stream() -> None:
    index = SuffixIndex(SMALL)
    index.append("a", [1, 2, 3])
    index.append("b", [1, 2, 4])
    assert {m.stream_id for m in index.find_matches([1, 2], exclude_stream="a")} == {"b"}


def test_remove_fast_and_slow_paths() -> None:
    index = SuffixIndex(SMALL)
    index.append("x", [1, 2, 1, 2])
    index.append("y", [1, 2, 3])
    index.append("y", [1, 2])
    index.remove_stream("y")  # sole writer since creation: popped off the ends
    index.check_integrity()
    index.append("z", [2, 1])
    index.append("x", [3])
    index.remove_stream("z")  # not the sole writer any more: filtered
    index.check_integrity()
    assert index.stream_ids() == ["x"] and index.num_tokens == 5


def test_errors() -> None:
    index = SuffixIndex(SMALL)
    with pytest.raises(ValueError, match="context"):
        index.find_matches([])
    with pytest.raises(KeyError, match="unknown stream"):
        index.remove_stream("nope")
    with pytest.raises(ValueError, match="levels"):
        SuffixIndexConfig(levels=(2, 4))
    with pytest.raises(ValueError, match="max_pattern"):
        SuffixIndexConfig(levels=(1, 8), max_pattern=4)
