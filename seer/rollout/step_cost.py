"""A step-cost model fitted to the steps a rollout actually ran, so its bound is priced at the real contexts.

Why: the verify-cost profile is measured at short contexts (48-128 tokens), where steps are cheapest. A rollout's
sequences reach contexts of hundreds to thousands of tokens, and there attention makes every step dearer: a
bound priced by the profile is several times below what any policy can reach, which hides the room actually
left. Every in-process step is already measured (its compute time, after drafting and KV movement are taken
out) and its shape is known, so the cost of a step at any context is fitted from those.

Model: ``t = fixed + per_seq * B + per_token * N + per_pair * P + per_read * (R - S) + per_shared_read * S`` for a
step of ``B`` sequences computing ``N`` tokens in all, ``P`` the sum over computed tokens of the context each
attends to (its position), ``R`` the sum over sequences of the context read (its KV length), ``S`` the part of
``R`` in KV blocks an earlier sequence of the step also reads (siblings' shared prompt). On a CPU and at the small
batches of a rollout, linear layers cost per token, attention per (token, context) pair and reading the KV once
per sequence; the fixed part is the weights streamed and the host's per-step work. Reads and pairs are apart
because a sequence's draft tokens share its read, which costs several times a pair (benchmarks/README.md, "Reads
apart from pairs"); one slope for both charged a draft token the whole read. A shared read is cheaper: the kernel
runs siblings back to back and finds their prompt's blocks in cache (benchmarks/README.md, "Siblings' shared KV in
the step price"). Without the split, a fit over a run whose policies share differently (veRL keeps a group on one
instance, divided rollout spreads it) overprices the one and underprices the other. Decode steps alone cannot tell
reads from pairs (one token each: ``R = P``); prefill chunks and verify steps can. The constants are non-negative,
fitted on relative error (short decode steps weigh as much as long prefills) over the compute steps of every
policy of the run, so all policies are priced by the same machine state. The fit's error is reported beside it.
Torch-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from seer.utils.nnls import nnls

MIN_STEPS = 8  # fewer measured steps say nothing about four to six constants


@dataclass(frozen=True)
class StepShape:
    """One measured compute step: sequences, tokens computed, attention pairs, seconds, KV reads."""

    seqs: int
    tokens: float
    pairs: float
    seconds: float
    shared_pairs: float = 0.0  # the pairs over KV blocks an earlier sequence of the step reads too
    reads: float = 0.0         # the KV tokens the step's sequences read, one read per sequence and token
    shared_reads: float = 0.0  # the part of ``reads`` in blocks an earlier sequence of the step reads too

    @classmethod
    def from_trace(cls, trace: Sequence[tuple], seconds: float) -> "StepShape":
        """From a step's decision trace, ``(request_id, start, num_new_tokens, num_spec_tokens, shared_tokens)``
        per chunk: a chunk of ``n`` tokens from position ``start`` attends to ``n * (start + (n + 1) / 2)``
        positions and reads ``start + n`` KV tokens, ``shared_tokens`` of them shared (older traces have no
        fifth field: nothing shared)."""
        tokens = sum(c[2] for c in trace)
        pairs = sum(c[2] * (c[1] + (c[2] + 1) / 2) for c in trace)
        reads = sum(c[1] + c[2] for c in trace)
        shared = [(c[2], c[4]) for c in trace if len(c) > 4]
        return cls(len(trace), tokens, pairs, seconds, sum(n * k for n, k in shared), reads,
                   sum(k for _, k in shared))

    def per_seq(self) -> "StepShape":
        """One sequence's share of the step."""
        n = self.seqs
        return StepShape(1, self.tokens / n, self.pairs / n, self.seconds, self.shared_pairs / n,
                         self.reads / n, self.shared_reads / n)


@dataclass(frozen=True)
class LinearStepCost:
    fixed_s: float
    per_seq_s: float
    per_token_s: float
    per_pair_s: float
    steps: int = 0            # measured steps behind the fit
    mape: float = 0.0         # its mean absolute error relative to them
    per_shared_pair_s: float | None = None  # None: shared pairs cost as others (fits of reads leave it None)
    per_read_s: float = 0.0   # 0: a fit of a run without reads in its traces (pairs carry the read)
    per_shared_read_s: float | None = None  # None: shared reads cost as others (a fit without sharing data)

    def step_time(self, seqs: float, tokens: float, pairs: float, shared_pairs: float = 0.0,
                  reads: float = 0.0, shared_reads: float = 0.0) -> float:
        shared = self.per_pair_s if self.per_shared_pair_s is None else self.per_shared_pair_s
        shared_read = self.per_read_s if self.per_shared_read_s is None else self.per_shared_read_s
        return (self.fixed_s + self.per_seq_s * seqs + self.per_token_s * tokens
                + self.per_pair_s * (pairs - shared_pairs) + shared * shared_pairs
                + self.per_read_s * (reads - shared_reads) + shared_read * shared_reads)

    def of(self, s: StepShape) -> float:
        """``step_time`` of a measured step's shape."""
        return self.step_time(s.seqs, s.tokens, s.pairs, s.shared_pairs, s.reads, s.shared_reads)

    def decode_time(self, seqs: float, contexts: float) -> float:
        """A decode step of ``seqs`` sequences reading ``contexts`` KV tokens in all (one token each)."""
        return self.step_time(seqs, seqs, contexts, reads=contexts)

    def scaled(self, scale: float, steps: int, mape: float) -> "LinearStepCost":
        """Every price times ``scale``."""
        def times(x: float | None) -> float | None:
            return None if x is None else x * scale

        return LinearStepCost(self.fixed_s * scale, self.per_seq_s * scale, self.per_token_s * scale,
                              self.per_pair_s * scale, steps=steps, mape=mape,
                              per_shared_pair_s=times(self.per_shared_pair_s), per_read_s=self.per_read_s * scale,
                              per_shared_read_s=times(self.per_shared_read_s))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def fit(cls, steps: Sequence[StepShape]) -> "LinearStepCost":
        """Non-negative least squares on relative error over ``steps`` (at least ``MIN_STEPS``). Steps with reads
        price sharing on the reads; steps without (an old report's) on the pairs; a sharing column the steps
        never fill is left out (its price is then the unshared one's)."""
        usable = [s for s in steps if s.seqs > 0 and s.seconds > 0]
        if len(usable) < MIN_STEPS:
            raise ValueError(f"a step-cost fit needs at least {MIN_STEPS} measured steps, got {len(usable)}")
        columns = {"fixed_s": [1.0] * len(usable), "per_seq_s": [float(s.seqs) for s in usable],
                   "per_token_s": [float(s.tokens) for s in usable]}
        if any(s.reads > 0 for s in usable):
            columns |= {"per_pair_s": [s.pairs for s in usable],
                        "per_read_s": [s.reads - s.shared_reads for s in usable],
                        "per_shared_read_s": [s.shared_reads for s in usable]}
        else:
            columns |= {"per_pair_s": [s.pairs - s.shared_pairs for s in usable],
                        "per_shared_pair_s": [s.shared_pairs for s in usable]}
        names = [k for k, v in columns.items() if "shared" not in k or any(x > 0 for x in v)]
        x = np.array([columns[k] for k in names]).T
        t = np.array([s.seconds for s in usable])
        scale = np.maximum(x.max(axis=0), 1e-12)  # columns on one scale, so the solver's conditioning is sane
        coef = nnls(x / scale / t[:, None], np.ones_like(t)) / scale
        mape = float(np.mean(np.abs(x @ coef - t) / t))
        prices = {k: float(c) for k, c in zip(names, coef)}
        return cls(prices["fixed_s"], prices["per_seq_s"], prices["per_token_s"], prices["per_pair_s"],
                   steps=len(usable), mape=mape, per_shared_pair_s=prices.get("per_shared_pair_s"),
                   per_read_s=prices.get("per_read_s", 0.0), per_shared_read_s=prices.get("per_shared_read_s"))


def lower_envelope(steps: Sequence[StepShape], rounds: int = 3) -> LinearStepCost:
    """The step cost no measured step beats: the fit's shape refitted on the steps at or below it (``rounds``
    times, so it follows the machine's fastest steps, not its noise), then lowered until every step is at or
    above it. A central fit sits in the middle of the measurements, so a bound it prices can be beaten by a run
    whose steps were faster than average; priced by the envelope, a bound is one no measured run undercuts.
    ``mape`` is the steps' mean distance above it."""
    fit = LinearStepCost.fit(steps)
    usable = [s for s in steps if s.seqs > 0 and s.seconds > 0]
    for _ in range(rounds):
        below = [s for s in usable if s.seconds <= fit.of(s)]
        if len(below) < MIN_STEPS:
            break
        fit = LinearStepCost.fit(below)
    ratios = [s.seconds / fit.of(s) for s in usable]
    scale = min(1.0, min(ratios))
    mape = sum(r / scale - 1.0 for r in ratios) / len(ratios)
    return fit.scaled(scale, len(usable), mape)


def lone_envelope(steps: Sequence[StepShape]) -> LinearStepCost | None:
    """The cost of a step of one sequence that no measured step undercuts; None with fewer than ``MIN_STEPS``
    steps of one sequence. It is the lower envelope of those steps, lowered further until no step of several
    sequences is faster than one of them alone computing its share (a batch costs no less than any one of its
    sequences would). Why: the bound's longest response runs alone, and one straight line under batches of 1 to
    100 sits far below the steps of one on a CPU, whose steps are flat up to a few sequences (27 against 44 ms
    on the EPYC in fp32), which credits the longest response with steps no run can take."""
    lone = [s for s in steps if s.seqs == 1 and s.seconds > 0]
    if len(lone) < MIN_STEPS:
        return None
    fit = lower_envelope(lone)
    ratios = [s.seconds / fit.of(s.per_seq()) for s in steps if s.seqs > 1 and s.seconds > 0]
    scale = min([1.0, *ratios])
    mape = sum(s.seconds / (scale * fit.of(s)) - 1.0 for s in lone) / len(lone)
    return fit.scaled(scale, len(lone), mape)


def measured_steps(decisions: Mapping[int, Sequence[Sequence[tuple]]],
                   busy: Mapping[int, Sequence[tuple[float, float]]],
                   step_costs: Mapping[int, Sequence[tuple[float, float]]]) -> list[StepShape]:
    """The compute steps of one rollout: each instance's j-th step is its j-th decision trace, busy interval
    and (draft_s, kv_s); its compute time is the interval less drafting and KV movement. Steps that computed
    nothing (a transfer charge, an idle tick) are left out."""
    shapes = []
    for iid, traces in decisions.items():
        for trace, (start, end), (draft, kv) in zip(traces, busy[iid], step_costs[iid]):
            seconds = end - start - draft - kv
            if trace and seconds > 0:
                shapes.append(StepShape.from_trace(trace, seconds))
    return shapes


class OnlineStepCost:
    """``LinearStepCost`` fitted while a rollout runs, to the steps it has run so far.

    Why: decisions that weigh one step against another (how many companions a critical request can run beside
    without slowing it) need the machine's prices under the rollout's load, at its contexts. The verify profile
    is measured once, at a short shared context, often on a quiet machine; the steps a rollout runs are measured
    anyway. The first fit comes once ``min_steps`` have run; it covers the last ``window`` steps and is refreshed
    every ``every`` new steps (or an eighth of all steps seen, whichever is more, so a long simulation refits a
    logarithmic number of times)."""

    def __init__(self, window: int = 4096, every: int = 256, min_steps: int = 4 * MIN_STEPS) -> None:
        if window < min_steps or every < 1 or min_steps < MIN_STEPS:
            raise ValueError(f"need window >= min_steps >= {MIN_STEPS} and every >= 1")
        self.steps: deque[StepShape] = deque(maxlen=window)
        self.every, self.min_steps = every, min_steps
        self.seen = 0
        self._fitted_at = 0
        self.fit: LinearStepCost | None = None

    def add(self, trace: Sequence[tuple], seconds: float) -> None:
        """One compute step (its decision trace and compute seconds; a step that computed nothing is ignored)."""
        if not trace or seconds <= 0:
            return
        self.steps.append(StepShape.from_trace(trace, seconds))
        self.seen += 1
        due = 0 if self.fit is None else max(self.every, self._fitted_at // 8)  # the first fit comes at once
        if len(self.steps) >= self.min_steps and self.seen - self._fitted_at >= due:
            self.fit, self._fitted_at = LinearStepCost.fit(list(self.steps)), self.seen

    def check_integrity(self) -> None:
        assert len(self.steps) <= self.seen and self._fitted_at <= self.seen
        assert (self.fit is None) == (self._fitted_at == 0), "a fit without the steps it was fitted to"
