"""Seer's rollout leaves the sampling distribution unchanged: two-sample tests on the real engine.

Why: synchronous on-policy RL assumes every response is a sample of the current policy, exactly as plain sampling
would draw it. Seer changes how responses get made: drafts from sibling responses are verified in place of
sampling, requests pause after every chunk and resume on another instance from KV parked in the global pool,
weights are replaced between iterations. Any of these can bias the samples (a wrong acceptance rule, sampler state
or KV lost in a move, KV of the old weights reused, siblings drawing the same random numbers) with no error and
no visible change in throughput; the trainer would silently learn off-policy. Greedy equality tests
(test_coordinator.py) cannot see such biases, and test_verify_statistics.py checks the verifier alone, on
synthetic logits.

Method: one fixed 12-token prompt, a tiny random-weight Qwen2 (tests/models/helpers.py), RL settings (T = 0.7,
top-p 0.9), max_tokens 4 and stop token 27, which this model samples with ~10% probability at positions 2-4, so
about 14% of responses end early and lengths vary. Each arm draws N = 2000 responses and is compared with plain
sampling (``seer.LLM``, no drafts) on six features: the token at each position 1-4 (or "ended"), the length, and
the pair (token 1, token 2). Each feature gets a Pearson chi-square two-sample (homogeneity) test; categories are
pooled, smallest first, until each pool expects >= 20 responses per arm (<= 100 bins); every test must give
p > 0.001 (the p-value comes from torch's regularised incomplete gamma function; scipy is not a dependency).
Besides distributions, every emitted token's logprob must equal the one plain sampling reported for the same
prefix (exact up to 1e-3, wherever the prefix occurs in the reference sample): that is what a trainer recomputes.

Arms: (b) ``LLM(speculative=SpecConfig(...))`` with fixed-length drafts (unseeded; seeded, which is the
verification path rollouts use; T = 0.3, where most drafts are accepted) and adaptive ones; the fixed ones must
have drafted >= N tokens and accepted >= N / 10 (about 4500 and 400; 3600 and 2100 at T = 0.3). (c) A
``RolloutCoordinator`` rollout on three in-process instances, policy ``divided``, 1-token chunks and
``kv_affinity_spread=0``: ~95% of responses change instance, every instance imports KV from the pool (~12 MB
each), nothing is re-prefilled. (d) ``update_weights`` to another random model, then the same rollout: it must
match plain sampling of the new model and differ from the old one (p ~ 0 on every feature), report weight version
1 and no import fallback, and carry the new model's logprobs (which old prompt KV in a prefix cache would change).
(2) Independence: siblings whose first tokens were sampled on different instances (~280 disjoint pairs) agree on
their first token, and on their first two, as often as two siblings of plain sampling do (1000 pairs; rates ~0.10
and ~0.008, 2x2 homogeneity test), and are almost never identical (siblings sharing a seed always are).
Speculative rollouts (policies ``seer-paper`` and ``seer``, 3-token chunks) are in the slow part.

Power (alpha = 0.001, power 0.9; two samples of N behave like one of N / 2: the Pearson statistic is about
noncentral chi-square with lambda = N/2 * chi2-distance, and a total-variation shift delta on the test's bins has
chi2-distance >= 4 delta^2, so the figures hold for the least detectable direction; ``test_stated_power``
recomputes them): a feature with <= 8 pooled bins (the length, most features at T = 0.3) detects any shift of
total variation >= 0.090; <= 40 bins (token 1) >= 0.117; <= 100 bins (tokens 2-4, the pair) >= 0.140. The
first-token agreement rate of siblings (~0.1, 280 vs 1000 pairs) detects a change of about 0.09. Real bugs sit far
from the least detectable direction. Deliberate breaks tried when this file was written (monkeypatched, not kept):
verification sampling at T = 1.0 instead of 0.7 (logprobs left right) fails every speculative arm (min p ~1e-115,
~1e-70 at T = 0.3); rollout siblings sharing one seed fail independence (agreement 1.0 vs 0.10, p ~1e-188) and
the rollout distributions; keeping the prefix cache across ``update_weights`` fails (d) (p = 0 on token 1); pool
imports that zero the last KV position fail (c) and (d) (p ~1e-21); seeded rows reusing position 0's uniform fail
the seeded arm, (c) and (d). One sampler seed shared by all instances with unseeded requests (what the driver's
per-response seeds prevent) does not make siblings alike here, as they occupy different batch rows; it correlates
responses across instances, which (c) caught at p ~2e-11 in one run and missed in another.

Determinism: engines and rollouts are seeded; the LLM arms replay exactly, and rollout responses draw from
per-response seeds, so their tokens do not depend on which instance ran which chunk (placement follows measured
step times; so does which sibling pairs count as cross-instance in (2)). Speculative rollouts are the exception:
what gets drafted depends on which sibling tokens had been fed, hence on step times, so their p-values vary between
runs; hence they are slow-only (~16 s). Default part: ~40 s of CPU on 2 cores (more wall time on a busy machine).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import pytest

from seer.bench import onpolicy_samples as samples
from seer.bench.onpolicy_samples import Response, agreement, cross_instance_pairs, sibling_pairs
from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator, RolloutOutput
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from seer.utils import stats
from seer.utils.stats import detectable_tv
from tests.conftest import TinyModelDir, one_torch_thread

ALPHA = 1e-3
N = 2000                      # responses per arm
GROUP = 8                     # siblings per group: N // GROUP groups of one prompt
PROMPT = tuple(range(5, 17))
MAX_TOKENS = 4
STOP = 27                     # sampled with ~10% at positions 2-4 by the seed-3 model: lengths vary
RL = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=MAX_TOKENS, stop_token_ids=(STOP,))
COLD = dataclasses.replace(RL, temperature=0.3)  # siblings alike: most drafts accepted
LOGPROB_TOL = 1e-3            # one prefix: float32 rounding across batches and paths; other weights: ~0.1-1
STATED_TV = {8: 0.090, 40: 0.117, 100: 0.140}  # pooled bins -> detectable total variation at N (module docstring)


# ---------------------------------------------------------------------------------------------- fixtures
_one_thread = one_torch_thread("module")  # module scope: the module's fixtures, which do the sampling, run under it


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir: TinyModelDir) -> dict[str, Path]:
    """The policy before ("old") and after ("new") a weight update: two random tiny models of one shape."""
    return {"old": tiny_model_dir("qwen2", 3), "new": tiny_model_dir("qwen2", 4)}


@pytest.fixture(scope="module")
def plain(model_dirs: dict[str, Path]) -> Callable[[str, SamplingParams], list[Response]]:
    """Plain sampling (no drafts) of N responses of ``model`` under ``params``, drawn once per pair."""
    cache: dict[tuple[str, SamplingParams], list[Response]] = {}

    def get(model: str, params: SamplingParams) -> list[Response]:
        if (model, params) not in cache:
            cache[model, params] = llm_sample(model_dirs[model], params, seed=101)[0]
        return cache[model, params]

    return get


@pytest.fixture(scope="module")
def rollouts(model_dirs: dict[str, Path]) -> dict[str, RolloutOutput]:
    """One coordinator, two rollouts of N responses: under the old weights, then after ``update_weights`` to the
    new ones (the first leaves old-weight KV in every instance's prefix cache for the second to misuse)."""
    with coordinator(model_dirs["old"], chunk_tokens=1) as coord:
        before = coord.rollout(groups(RL), policy="divided", progress=False)
        assert coord.update_weights(str(model_dirs["new"])) == 1
        after = coord.rollout(groups(RL), policy="divided", progress=False)
    return {"old": before, "new": after}


# ---------------------------------------------------------------------------------------------- sampling
def llm_sample(model: Path, params: SamplingParams, seed: int, speculative: SpecConfig | None = None,
               group: int = GROUP, max_num_seqs: int = 256) -> tuple[list[Response], dict[str, int]]:
    """N responses to PROMPT through ``seer.LLM`` as N // ``group`` groups (a seeded ``params`` gives group g the
    seed ``seed + g``: groups sharing a seed would repeat each other), and the engine's drafting counters."""
    from seer import LLM

    llm = LLM(model, dtype="float32", block_size=4, num_kv_blocks=2048, seed=seed, max_num_seqs=max_num_seqs,
              speculative=speculative)
    return samples.llm_sample(llm, PROMPT, params, N, group, max_num_seqs)


def coordinator(model: Path, chunk_tokens: int, instances: int = 3) -> RolloutCoordinator:
    """In-process instances with little KV each and no affinity: a request's next chunk goes wherever dispatch
    puts it, its KV through the pool."""
    engine = dataclasses.replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=60, seed=5)
    return RolloutCoordinator(model, RolloutConfig(instances=instances, chunk_tokens=chunk_tokens, engine=engine,
                                                   kv_affinity_spread=0, spec=SpecConfig(adaptive=False, gamma_max=4)))


def groups(params: SamplingParams) -> list[GroupInput]:
    return [GroupInput(PROMPT, GROUP, params, key=f"g{i}") for i in range(N // GROUP)]


def responses(out: RolloutOutput) -> list[Response]:
    return [Response(tuple(r.token_ids), tuple(r.logprobs), r.group_id, tuple(r.instance_history))
            for r in out.result.responses]


# ---------------------------------------------------------------------------------------------- statistics
def homogeneity(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[float, int]:
    """Pearson chi-square two-sample test (``seer.utils.stats.homogeneity``: pools expecting >= 20 per sample):
    (p-value, pooled bins)."""
    result = stats.homogeneity(a, b)
    return result.pvalue, result.bins


def features(sample: Sequence[Response]) -> dict[str, list[Hashable]]:
    """What is compared (``seer.bench.onpolicy_samples.features``): the token at each position (ENDED once
    stopped), the length, the first two tokens."""
    return samples.features(sample, MAX_TOKENS)


def compare(arm: Sequence[Response], reference: Sequence[Response]) -> dict[str, tuple[float, int]]:
    """Feature -> (p-value, pooled bins) of ``arm`` against ``reference``."""
    return {name: (t.pvalue, t.bins) for name, t in samples.compare(arm, reference, MAX_TOKENS).items()}


def assert_same_distribution(arm: Sequence[Response], reference: Sequence[Response], what: str) -> None:
    result = compare(arm, reference)
    assert max(bins for _, bins in result.values()) <= max(STATED_TV), (what, result, "more bins than stated")
    assert min(p for p, _ in result.values()) > ALPHA, (what, result)


def logprob_table(reference: Sequence[Response]) -> dict[tuple[int, ...], float]:
    """Prefix (tokens up to and including one) -> the logprob plain sampling reported for its last token."""
    return {r.tokens[: k + 1]: r.logprobs[k] for r in reference for k in range(len(r.tokens))}


def logprob_agreement(sample: Sequence[Response], table: dict[tuple[int, ...], float]) -> tuple[int, int]:
    """(tokens whose logprob matches the table's for their prefix, tokens that do not); prefixes the table lacks
    are skipped."""
    good = bad = 0
    for r in sample:
        for k in range(len(r.tokens)):
            want = table.get(r.tokens[: k + 1])
            if want is not None:
                good, bad = (good + 1, bad) if abs(r.logprobs[k] - want) <= LOGPROB_TOL else (good, bad + 1)
    return good, bad


def assert_reference_logprobs(sample: Sequence[Response], reference: Sequence[Response], what: str) -> None:
    good, bad = logprob_agreement(sample, logprob_table(reference))
    total = sum(len(r.tokens) for r in sample)
    assert bad == 0 and good >= total // 2, (what, good, bad, total)


# ---------------------------------------------------------------------------------------------- tests
def test_reference_is_informative(plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """The settings make every feature vary: lengths differ, no token position is nearly constant."""
    ref = plain("old", RL)
    lengths = Counter(len(r.tokens) for r in ref)
    assert len(ref) == N and 0.05 * N < N - lengths[MAX_TOKENS] < 0.5 * N, lengths
    for name, values in features(ref).items():
        if name != "length":
            assert Counter(values).most_common(1)[0][1] < 0.5 * N, name


SPEC_ARMS = {
    "fixed": (RL, SpecConfig(adaptive=False, gamma_max=4)),
    "fixed-seeded": (dataclasses.replace(RL, seed=7), SpecConfig(adaptive=False, gamma_max=4)),
    "fixed-cold": (COLD, SpecConfig(adaptive=False, gamma_max=4)),
    "adaptive": (RL, SpecConfig(gamma_max=4)),
}


@pytest.mark.parametrize("arm", list(SPEC_ARMS))
def test_speculative_decoding_matches_plain_sampling(arm: str, model_dirs: dict[str, Path],
                                                     plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """(b) Grouped speculative decoding: groups of N / 8 siblings, at most 32 requests at once, so later siblings
    draft from earlier ones' responses. The seeded arm runs verification's seeded-uniform path (the one rollouts
    use); the cold arm accepts most drafts. The adaptive arm drafts where this machine's cost profile says it pays:
    it checks the policy path, and its counters are reported in failures, not required (each arm has its own
    engine seed, so the arms are independent samples)."""
    params, spec = SPEC_ARMS[arm]
    sample, counters = llm_sample(model_dirs["old"], params, seed=202 + list(SPEC_ARMS).index(arm),
                                  speculative=spec, group=N // 8, max_num_seqs=32)
    if not spec.adaptive:
        assert counters["drafted"] >= N and counters["accepted"] >= N // 10, counters
    reference = plain("old", dataclasses.replace(params, seed=None))
    assert_same_distribution(sample, reference, f"{arm} {counters}")
    assert_reference_logprobs(sample, reference, arm)


def test_divided_rollout_with_migrations_matches_plain_sampling(
        rollouts: dict[str, RolloutOutput], plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """(c) Divided rollout over three instances, 1-token chunks: almost every response is paused after each
    token and resumed on another instance from the KV pool, never recomputed."""
    out = rollouts["old"]
    res = out.result
    sample = responses(out)
    moved = sum(len(set(r.instances)) > 1 for r in sample)
    loaded = {i: st["kv_bytes_loaded"] for i, st in res.stats["instances"].items()}
    assert moved >= N // 2, moved
    assert all(v > 0 for v in loaded.values()), loaded           # every instance imported KV from the pool
    assert res.metrics.kv_bytes_moved > 0 and res.metrics.reprefill_tokens == 0
    assert res.metrics.reprefill_reasons == {}                   # no import fell back to recomputation
    assert_same_distribution(sample, plain("old", RL), "divided rollout")
    assert_reference_logprobs(sample, plain("old", RL), "divided rollout")


def test_rollout_after_weight_update_samples_the_new_policy(
        rollouts: dict[str, RolloutOutput], plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """(d) After ``update_weights``, the rollout matches plain sampling of the new model and not the old one, and
    every token's logprob is the new model's: no KV of the old weights (prefix cache, pool) was used."""
    out = rollouts["new"]
    sample = responses(out)
    old, new = plain("old", RL), plain("new", RL)
    assert {rec["weight_version"] for rec in out.records()} == {1}
    assert out.result.metrics.reprefill_reasons == {} and out.result.metrics.reprefill_tokens == 0
    assert sum(len(set(r.instances)) > 1 for r in sample) >= N // 2
    teeth = compare(new, old)["token1"][0], compare(sample, old)["token1"][0]
    assert max(teeth) < ALPHA, teeth                             # the test can tell the two policies apart
    assert_same_distribution(sample, new, "rollout after update")
    assert_reference_logprobs(sample, new, "rollout after update")


def test_siblings_on_different_instances_are_independent(
        rollouts: dict[str, RolloutOutput], plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """(2) Siblings whose first tokens were sampled on different instances are independent samples: the rate at
    which two of them agree (first token, first two tokens) matches that of two siblings of plain sampling, and
    whole responses are rarely identical (siblings sharing a sampler stream or seed would be identical nearly
    always). Which pairs qualify follows placement (measured step times); the tokens do not."""
    pairs, ref_pairs = cross_instance_pairs(responses(rollouts["old"])), sibling_pairs(plain("old", RL))
    assert len(pairs) >= N // 10 and len(ref_pairs) == N // 2, len(pairs)  # placement spread the siblings
    rates = {}
    for k in (1, 2):
        got, want = agreement(pairs, k), agreement(ref_pairs, k)
        rates[k] = (sum(got) / len(got), sum(want) / len(want), homogeneity(got, want)[0])
    assert min(p for _, _, p in rates.values()) > ALPHA, rates
    identical, ref_identical = sum(agreement(pairs, None)), sum(agreement(ref_pairs, None))
    assert identical <= max(10, 0.1 * len(pairs)), (identical, ref_identical, len(pairs), rates)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["seer-paper", "seer"])
def test_speculative_rollout_matches_plain_sampling(
        policy: str, model_dirs: dict[str, Path], plain: Callable[[str, SamplingParams], list[Response]]) -> None:
    """(b) + (c) Drafting inside a divided rollout (3-token chunks: a draft for tokens 2-3, then a chunk that may
    move): drafts come from siblings on any instance through the shared draft server. Slow and not bit-exact
    (drafts depend on measured step times): see the module docstring."""
    with coordinator(model_dirs["old"], chunk_tokens=3) as coord:
        out = coord.rollout(groups(RL), policy=policy, progress=False)
    res = out.result
    spec = {k: v for k, v in res.stats["spec"].items() if k != "per_group"}
    assert spec["drafted"] > 0 and spec["accepted"] > 0, spec
    assert res.metrics.kv_bytes_moved > 0 and res.metrics.reprefill_tokens == 0
    sample = responses(out)
    assert sum(len(set(r.instances)) > 1 for r in sample) > 0
    assert_same_distribution(sample, plain("old", RL), f"{policy} {spec}")
    assert_reference_logprobs(sample, plain("old", RL), policy)


def test_stated_power() -> None:
    """The detectable differences the module docstring states (two samples of N: like one of N / 2)."""
    for bins, tv in STATED_TV.items():
        assert detectable_tv(N // 2, bins) <= tv + 5e-4, bins
