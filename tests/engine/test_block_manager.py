from hypothesis import given, settings
from hypothesis import strategies as st

from seer.engine.block_manager import BlockManager
from seer.engine.request import Request
from seer.sampling_params import SamplingParams


def _req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4))


def test_prefix_hits_share_blocks_and_refcount():
    bm = BlockManager(16, 4)
    a = _req("a", range(10))
    assert bm.allocate_cached_prefix(a) == 0
    bm.allocate(a, 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)
    b = _req("b", list(range(10)) + [99])
    assert bm.allocate_cached_prefix(b) == 8
    assert b.block_ids[:2] == a.block_ids[:2]
    assert bm.ref_counts[a.block_ids[0]] == 2
    bm.check_integrity([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_integrity([])
    c = _req("c", range(9))  # cached blocks survive being freed until evicted
    assert bm.allocate_cached_prefix(c) == 8


def test_fully_cached_prompt_still_computes_last_block():
    bm = BlockManager(16, 4)
    a = _req("a", range(8))
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.cache_full_blocks(a)
    b = _req("b", range(8))
    assert bm.allocate_cached_prefix(b) == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), min_size=1, max_size=40))
def test_random_alloc_free_keeps_integrity(ops):
    bm = BlockManager(20, 4)
    live: list[Request] = []
    for n, (prefix, extra, free) in enumerate(ops):
        if free and live:
            bm.free(live.pop(0))
        else:
            r = _req(f"r{n}", [prefix] * 6 + [n] * extra)
            bm.allocate_cached_prefix(r)
            if bm.allocate(r, r.num_tokens - r.num_computed_tokens):
                r.num_computed_tokens = r.num_tokens
                bm.cache_full_blocks(r)
                live.append(r)
            else:
                bm.free(r)
        bm.check_integrity(live)
