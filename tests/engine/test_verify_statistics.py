"""Speculative verification is lossless under the sampling settings RL uses: chi-square goodness-of-fit tests.

Why: an RL trainer recomputes the logprobs of the tokens the rollout emitted and assumes they were drawn from the
policy's own (temperature-scaled, top-k/top-p filtered) distribution. A verifier that accepts draft tokens with the
wrong probability, or draws the bonus token from the wrong residual, biases every speculated rollout without any
visible error. ``test_sampler.py`` checks temperature 1.0 without filtering on 8 tokens; these tests cover
temperatures 0.6 and 1.0 with top-p 0.9 and top-k 20 (and unfiltered 0.6) on a 64-token vocabulary where both
filters cut, for chains of 1 and 3 tokens and trees with 2 and 4 root branches and two levels, with drafts the target
likes (its top tokens), drafts outside the kept set (never to be emitted) and the least likely kept tokens.

Each case draws N first tokens from ``Sampler.verify`` and compares them with the row's filtered target
distribution (``Sampler.probs``, itself checked against a float64 reference); bins expected below 5 are pooled and
the test asserts p > 0.001. One case checks the joint of the first two tokens of a chain. Two deliberately wrong
verifiers go through the same check and must fail it.

Power (alpha = 0.001, Pearson statistic approximated by a noncentral chi-square with lambda = N * chi2-distance;
by Cauchy-Schwarz a total-variation distortion delta on the test's bins has chi2-distance >= 4 delta^2, so the figure
holds for the least detectable direction): with N = 3000 draws and at most 45 bins after pooling (df <= 44; the
filtered cases have <= 20 bins, the unfiltered ones 44), any distortion of total variation >= 0.069 is detected with
probability >= 0.9 (>= 0.060 for the filtered cases alone); the slow grid (N = 8000, <= 55 bins, about 2.5 minutes
on 2 cores) detects >= 0.044. ``test_stated_power`` recomputes both figures. Real bugs sit far from that worst
direction: at N = 3000 the two broken verifiers below get p-values of 1e-149 and 4e-97 on the first fast case.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from seer.engine.sampler import RowSpec, Sampler
from seer.utils.stats import detectable_tv, goodness_of_fit
from tests.conftest import one_torch_thread
from tests.engine.test_sampler import reference_filter

V = 64
ALPHA = 1e-3
N_FAST = 3000
N_SLOW = 8000
MAX_BINS = {N_FAST: 45, N_SLOW: 55}  # the power statement above holds up to this many bins
STATED_TV = {N_FAST: 0.069, N_SLOW: 0.044}
TOP_P, TOP_K = 0.9, 20

# draft shapes: parents of each draft token (-1 = child of the root); None is a chain (passed as such to verify)
SHAPES: dict[str, tuple[int, list[int] | None]] = {
    "chain1": (1, None),
    "chain3": (3, None),
    "tree2": (2, [-1, -1]),
    "tree4": (4, [-1, -1, -1, -1]),
    "tree2x2": (5, [-1, -1, 0, 0, 1]),  # two root branches, the first with two children, the second with one
}


# the rows are 64 floats: intra-op threads only add synchronisation (7 ms instead of 0.5 ms per verify on a 2-core
# machine with the other core busy)
_one_thread = one_torch_thread()


def logits_table() -> torch.Tensor:
    """Six rows of logits: peaked but not degenerate (top token ~0.3 at T = 0.6); see test_both_filters_cut."""
    return torch.randn(6, V, generator=torch.Generator().manual_seed(1)) * 1.2


# ---------------------------------------------------------------------------------------------- statistics
def gof_pvalue(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """Pearson goodness-of-fit p-value and number of bins (``seer.utils.stats.goodness_of_fit``); 0.0 if anything
    landed where the target has no mass."""
    result = goodness_of_fit(counts, probs)
    return result.pvalue, result.bins


# ---------------------------------------------------------------------------------------------- targets and drafts
def reference_filtered(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Float64 softmax(logits / T), then top-k, then top-p (a token stays while the mass before it is < top_p)."""
    return reference_filter(torch.softmax(logits.double() / temperature, dim=-1), top_k, top_p)


def targets(logits: torch.Tensor, row: RowSpec) -> torch.Tensor:
    """Per logits row, the distribution the row samples from (``Sampler.probs``), float64 [rows, V]."""
    rows = [row] * logits.shape[0]
    got = Sampler.probs(Sampler.logprobs(logits, rows), rows).double()
    for r in range(logits.shape[0]):
        want = reference_filtered(logits[r], row.temperature, row.top_p, row.top_k)
        assert torch.equal(got[r] > 0, want > 0) and torch.allclose(got[r], want, atol=1e-5), r
    return got


def ranked_tokens(p: torch.Tensor, logits: torch.Tensor, kind: str) -> list[int]:
    """Draft candidates of one row: ``likely`` most probable first; ``tail`` the least probable kept tokens first;
    ``outside`` the tokens the filters drop, most probable (just past the cut) first."""
    if kind == "likely":
        return p.argsort(descending=True).tolist()
    if kind == "tail":
        return [t for t in p.argsort().tolist() if p[t] > 0]
    assert kind == "outside"
    return [t for t in logits.argsort(descending=True).tolist() if p[t] == 0]


def build_draft(table: torch.Tensor, logits: torch.Tensor, parents: list[int], kind: str) -> list[int]:
    """The i-th child of a node gets the i-th candidate of that node's logits row (row parent + 1)."""
    used: dict[int, int] = {}
    draft = []
    for parent in parents:
        i = used.get(parent, 0)
        used[parent] = i + 1
        draft.append(ranked_tokens(table[parent + 1], logits[parent + 1], kind)[i])
    return draft


@dataclass(frozen=True)
class Case:
    temperature: float
    filtered: bool
    shape: str
    kind: str
    seeded: bool = False  # a per-trial request seed (the seeded-uniform path) instead of the sampler's stream

    def row(self, trial: int = 0) -> RowSpec:
        seed = 1000 + trial if self.seeded else None
        if self.filtered:
            return RowSpec(self.temperature, top_p=TOP_P, top_k=TOP_K, seed=seed)
        return RowSpec(self.temperature, seed=seed)

    def __str__(self) -> str:
        filt = f"p{TOP_P}k{TOP_K}" if self.filtered else "unfiltered"
        return f"T{self.temperature}-{filt}-{self.shape}-{self.kind}" + ("-seeded" if self.seeded else "")


def first_token_pvalue(sampler: Sampler, case: Case, n: int) -> float:
    """Draw ``n`` verifications of the case's draft; the p-value of the first emitted token against the target."""
    size, parents = SHAPES[case.shape]
    full_parents = parents if parents is not None else list(range(-1, size - 1))
    logits = logits_table()[: size + 1]
    table = targets(logits, case.row())
    draft = build_draft(table, logits, full_parents, case.kind)
    counts = [0] * V
    for trial in range(n):
        tokens, _, _ = sampler.verify(logits, case.row(trial), draft, parents)
        counts[tokens[0]] += 1
    pvalue, bins = gof_pvalue(counts, table[0].tolist())
    assert bins <= MAX_BINS[n], (bins, "the stated power does not cover this many bins")
    return pvalue


# ---------------------------------------------------------------------------------------------- broken verifiers
class NoResidualSampler(Sampler):
    """The classic bug: each child is accepted with p(c) and the bonus token is drawn from p itself, instead of
    from p with the rejected children removed and renormalised."""

    def _choose(self, lp: torch.Tensor, probs: torch.Tensor | None, row: RowSpec, depth: int,
                draft: list[int], kids: list[int], forced_tok: int | None) -> tuple[int | None, int]:
        assert probs is not None
        for k in kids:
            if self.rng.random() < float(probs[draft[k]]):
                return k, draft[k]
        return None, int(self._draw(probs[None], [self.rng.random()])[0])


class RawAcceptSampler(Sampler):
    """Accepts a child with its probability under the raw softmax (no temperature, no top-k/top-p), renormalised
    over the children not yet rejected; the bonus token comes from the correct residual."""

    def _choose(self, lp: torch.Tensor, probs: torch.Tensor | None, row: RowSpec, depth: int,
                draft: list[int], kids: list[int], forced_tok: int | None) -> tuple[int | None, int]:
        assert probs is not None
        raw = torch.softmax(lp.double() * row.temperature, dim=-1)  # lp * T is the logits up to a constant
        p = probs.clone()
        for k in kids:
            c = draft[k]
            if self.rng.random() * float(raw.sum()) < float(raw[c]):
                return k, c
            raw[c] = 0.0
            p[c] = 0.0
        return None, int(self._draw(p[None], [self.rng.random()])[0])


# ---------------------------------------------------------------------------------------------- cases
FAST = [
    Case(0.6, True, "chain1", "likely"),
    Case(0.6, True, "tree4", "tail"),
    Case(0.6, True, "tree2x2", "outside"),
    Case(1.0, True, "chain3", "outside"),
    Case(1.0, True, "tree2", "likely"),
    Case(1.0, True, "tree4", "likely", seeded=True),
    Case(0.6, False, "tree2", "tail"),
    Case(0.6, False, "chain3", "likely"),
]
GRID = [Case(t, f, s, k) for t, f in ((0.6, True), (1.0, True), (0.6, False)) for s in SHAPES
        for k in ("likely", "outside", "tail") if f or k != "outside"]
BROKEN_CASES = [Case(0.6, True, "chain1", "likely"), Case(1.0, True, "tree2", "likely")]


def test_both_filters_cut() -> None:
    """The table exercises the filters in the rows whose distributions are tested (the root's and, for the two-token
    joint, the next): at T = 0.6 top-p keeps fewer than top-k tokens, at T = 1.0 top-k keeps fewer than top-p
    would, and the root's top token is likely but far from certain."""
    logits = logits_table()[:2]
    cold = (targets(logits, RowSpec(0.6, top_p=TOP_P, top_k=TOP_K)) > 0).sum(dim=-1)
    warm = (targets(logits, RowSpec(1.0, top_p=TOP_P, top_k=TOP_K)) > 0).sum(dim=-1)
    warm_p_only = (targets(logits, RowSpec(1.0, top_p=TOP_P)) > 0).sum(dim=-1)
    assert bool((cold < TOP_K).all()) and bool((cold >= 5).all())
    assert bool((warm == TOP_K).all()) and bool((warm_p_only > TOP_K).all())
    top = float(targets(logits, RowSpec(0.6, top_p=TOP_P, top_k=TOP_K))[0].max())
    assert 0.2 < top < 0.5


@pytest.mark.parametrize("case", FAST, ids=str)
def test_first_token_matches_the_filtered_target(case: Case) -> None:
    pvalue = first_token_pvalue(Sampler(seed=11), case, N_FAST)
    assert pvalue > ALPHA, (str(case), pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in GRID if c not in FAST], ids=str)
def test_first_token_matches_the_filtered_target_grid(case: Case) -> None:
    pvalue = first_token_pvalue(Sampler(seed=12), case, N_SLOW)
    assert pvalue > ALPHA, (str(case), pvalue)


@pytest.mark.parametrize("broken", [NoResidualSampler, RawAcceptSampler], ids=lambda c: c.__name__)
def test_a_broken_verifier_fails_the_same_check(broken: type[Sampler]) -> None:
    pvalues: dict[str, float] = {}
    for case in BROKEN_CASES:  # stops at the first case that catches it
        pvalues[str(case)] = first_token_pvalue(broken(seed=11), case, N_FAST)
        if pvalues[str(case)] < ALPHA:
            break
    assert min(pvalues.values()) < ALPHA, pvalues


def two_token_pvalue(sampler: Sampler, row: RowSpec, kind: str, n: int) -> float:
    """Chain [d0, d1] with d0 the root's top token: the joint of the first two emitted tokens is p0(d0) p1(b) for
    (d0, b), and p0(a) for a first token a != d0, which ends the step. Bins: (a, b) flattened, b = V for 'none'."""
    logits = logits_table()[:3]
    table = targets(logits, row)
    draft = build_draft(table, logits, [-1, 0], kind)
    draft[0] = int(table[0].argmax())
    d0 = draft[0]
    expected = [0.0] * (V * (V + 1))
    for a in range(V):
        if a == d0:
            for b in range(V):
                expected[a * (V + 1) + b] = float(table[0, a] * table[1, b])
        else:
            expected[a * (V + 1) + V] = float(table[0, a])
    counts = [0] * len(expected)
    for _ in range(n):
        tokens, _, _ = sampler.verify(logits, row, draft, None)
        second = tokens[1] if len(tokens) > 1 else V
        counts[tokens[0] * (V + 1) + second] += 1
    pvalue, bins = gof_pvalue(counts, expected)
    assert bins <= MAX_BINS[n], bins
    return pvalue


@pytest.mark.parametrize("kind", ["likely", pytest.param("tail", marks=pytest.mark.slow)])
def test_first_two_tokens_of_a_chain_match_the_target(kind: str) -> None:
    pvalue = two_token_pvalue(Sampler(seed=13), RowSpec(0.6, top_p=TOP_P), kind, N_FAST)
    assert pvalue > ALPHA, pvalue


def test_stated_power() -> None:
    for n, tv in STATED_TV.items():
        assert detectable_tv(n, MAX_BINS[n]) == pytest.approx(tv, abs=5e-4), n
