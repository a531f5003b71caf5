"""Sampling and lossless verification: statistical checks that speculation leaves the distribution unchanged."""

import math

import pytest
import torch

from seer.engine.sampler import TOPK_BLOCK, RowSpec, Sampler, top_k

V = 8
CHI2_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def chi2(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


@pytest.fixture
def logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, V, generator=g) * 1.5  # rows: root, after draft 0, after draft 1, after draft 2


@pytest.mark.parametrize("draft,parents", [([3], None), ([5, 1], None), ([2, 6, 0], [-1, -1, 0])])
def test_verification_keeps_the_first_token_distribution(logits, draft, parents):
    sampler = Sampler(seed=1)
    row = RowSpec(temperature=1.0)
    rows = logits[: len(draft) + 1]
    p = torch.softmax(logits[0], -1).tolist()
    counts = [0] * V
    trials = 20000
    for _ in range(trials):
        tokens, _, _ = sampler.verify(rows, row, draft, parents)
        counts[tokens[0]] += 1
    assert chi2(counts, p) < CHI2_DF7_P001


def test_verification_keeps_the_two_token_joint(logits):
    """Chain draft [d0, d1]: the joint of the first two emitted tokens is p0(a) * p(b | a), where p(b | d0)
    is row 1 and any other first token ends the step (its successor is not emitted this step)."""
    sampler = Sampler(seed=2)
    row = RowSpec(temperature=1.0)
    d0 = int(torch.softmax(logits[0], -1).argmax())
    p0 = torch.softmax(logits[0], -1)
    p1 = torch.softmax(logits[1], -1)
    counts = [0] * V
    trials = 20000
    for _ in range(trials):
        tokens, _, _ = sampler.verify(logits[:3], row, [d0, 4], None)
        if tokens[0] == d0:
            counts[tokens[1]] += 1
    n = sum(counts)
    assert abs(n / trials - float(p0[d0])) < 4 * math.sqrt(p0[d0] * (1 - p0[d0]) / trials)
    assert chi2(counts, p1.tolist()) < CHI2_DF7_P001


def test_top_k_top_p_filtering_and_greedy(logits):
    sampler = Sampler(seed=3)
    rows = [RowSpec(0.0), RowSpec(1.0, top_k=1), RowSpec(1.0, top_p=1e-6)]
    toks, _ = sampler.sample(logits[:1].repeat(3, 1), rows)
    assert toks == [int(logits[0].argmax())] * 3


def test_seeded_rows_do_not_depend_on_the_batch(logits):
    a, _ = Sampler(seed=4).sample(logits[:1], [RowSpec(1.0, seed=11, position=5)])
    b, _ = Sampler(seed=9).sample(logits[[2, 0]], [RowSpec(1.0), RowSpec(1.0, seed=11, position=5)])
    assert a[0] == b[1]


def test_blocked_inverse_cdf_matches_the_full_cumulative_sum() -> None:
    """The two-level draw picks the token a full cumsum would (up to float rounding at a boundary), never a
    zero-weight one, including a vocab that is not a multiple of the block and rows with zeroed tokens."""
    from seer.engine.sampler import Sampler

    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(300, 1000, generator=gen) ** 4
    weights[:, ::7] = 0.0
    uniforms = torch.rand(300, generator=gen, dtype=torch.float64).tolist() + [0.0, 1.0 - 1e-12]
    weights = torch.cat([weights, weights[:2]])
    blocked = Sampler._draw_blocked(weights, uniforms)
    full = Sampler(0)._draw(weights, uniforms)
    assert (blocked == full).float().mean() >= 0.99
    assert bool((weights.gather(1, blocked[:, None]) > 0).all())


def reference_filter(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """top-k then top-p over a full sort of one row, renormalised."""
    sorted_p, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    keep &= (sorted_p.cumsum(0) - sorted_p) < top_p
    out = torch.zeros_like(probs).scatter_(0, order, sorted_p * keep)
    return out / out.sum()


@pytest.mark.parametrize("k", [1, 20, 50, 200])
@pytest.mark.parametrize("ties", [False, True])
def test_block_top_k_selects_what_a_full_selection_does(k: int, ties: bool) -> None:
    g = torch.Generator().manual_seed(k)
    x = torch.randn(6, 768 * TOPK_BLOCK, generator=g) * 6
    x[1] = -math.inf  # a row masked everywhere but a few tokens: the selection may hold -inf
    x[1, ::5000] = 1.0
    if ties:
        x = x.bfloat16().float()  # bf16 logits: many equal values near the cut
    values, idx = top_k(x, k)
    want = x.topk(k, dim=-1).values
    assert torch.equal(values, want)
    assert torch.equal(x.gather(1, idx), values)
    assert all(len(set(row)) == k for row in idx.tolist())  # k distinct tokens


def test_block_top_k_falls_back_where_slices_do_not_pay() -> None:
    x = torch.randn(2, 1000)  # not a whole number of slices
    assert torch.equal(top_k(x, 10)[1], x.topk(10, dim=-1).indices)
    y = torch.randn(2, 16 * TOPK_BLOCK)  # k slices would be most of the row
    assert torch.equal(top_k(y, 8)[1], y.topk(8, dim=-1).indices)


def test_filtering_on_a_sliced_vocab_matches_the_reference() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 768 * TOPK_BLOCK, generator=g) * 6
    rows = [RowSpec(1.0, top_k=20), RowSpec(0.6, top_p=0.9, top_k=50), RowSpec(0.7, top_p=0.8, top_k=20)]
    lp = Sampler.logprobs(logits, rows)
    got = Sampler.probs(lp, rows)
    for j, r in enumerate(rows):
        assert torch.allclose(got[j], reference_filter(lp[j].exp(), r.top_k, r.top_p), atol=1e-6), j


# peaked: the first 256 candidates hold the nucleus; between: 4,096 do (~1,500 tokens); flat: the full sort
@pytest.mark.parametrize(("vocab", "scale"), [(5000, 8.0), (20000, 2.5), (5000, 0.05)])
def test_filtering_on_a_large_vocab_matches_a_full_sort(vocab: int, scale: float) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, vocab, generator=g) * scale
    rows = [RowSpec(1.0, top_k=20), RowSpec(0.7, top_p=0.8, top_k=50), RowSpec(1.0, top_p=0.9), RowSpec(1.0)]
    lp = Sampler.logprobs(logits, rows)
    got = Sampler.probs(lp, rows)
    kept = int((got[2] > 0).sum())
    assert {8.0: kept <= 256, 2.5: 256 < kept <= 4096, 0.05: kept > 4096}[scale], kept
    for j, r in enumerate(rows):
        want = reference_filter(lp[j].exp(), r.top_k, r.top_p) if r.filtered else lp[j].exp()
        assert torch.allclose(got[j], want, atol=1e-6), j
