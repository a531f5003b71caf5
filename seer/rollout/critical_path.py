"""Critical-path placement: the responses that will end last get an instance of their own.

Why: a step's cost grows with its batch. On a CPU a step is compute-bound almost from batch 1, and on an
accelerator at least the attention part grows. A response advances one step at a time at its instance's pace, so a
response that will end last (a runaway, or the longest member of a long group) sharing its instance with a full
batch stretches the whole rollout, however early the ordering started it. Giving it an instance alone costs that
instance's throughput, which pays only while the other instances can absorb the rest of the work in the time the
isolated response still needs.

Rule. Let ``W`` be the estimated remaining work of the ``N`` unfinished requests, ``R_1 >= R_2 >= ...`` the
estimated remaining lengths of those with a belief (below), ``I`` the live instances and ``s(b)`` the speedup of an
instance running ``b`` sequences over one sequence alone (tokens per unit of time, from the engine's step profile).
The ``j``-th longest is critical when, with it and the ``j - 1`` before it each on an instance of its own, the ``I - j``
shared instances would still finish the rest no later even at ``1 / margin`` of their ideal rate: ``R_j * (s(b_j) *
(I - j) + j * m) >= margin * (W - R_1 - ... - R_j)``, where ``b_j = min((N - j) / (I - j), K / c)``: the waiting
requests spread over the shared instances, but no more than an instance's KV (``K`` tokens) holds at the unfinished
requests' mean context ``c``. Without that cap, a cluster whose batches are bounded by memory (hundreds of requests
waiting per instance) counts on batches it can never run, and isolates requests whose instances it cannot spare. The
margin (1.5) covers what the ideal rate still ignores (prefill, uneven loads): without it, requests whose estimate
is only just long enough are isolated and the instance's throughput is lost for little.
Each critical instance also runs ``m`` companions, other requests in their turn, where the step profile says ``m``
more sequences beside one slow its step by under 5% (``lone_companions``; the draft planner holds their drafts to
the same slack, ``seer.spec.budget``): where small-batch steps are bound by reading the weights, a step of four
costs what a step of one does, so the critical request still runs at the speed of a lone one and its instance
keeps working off the rest at ``m`` sequences' worth; where steps grow with every sequence, ``m`` is 0 and the
instance is the request's alone. ``m`` is priced each round at the contexts the requests have, by a fit of the
steps the rollout has run so far (``OnlineStepCost``, ``fitted_companions``), and by the profile only until enough
have run: the profile is measured at a short context its sequences share, often on a quiet machine, and leaves
out what a companion costs under the rollout's load, its own KV included (benchmarks/README.md).
At most ``I - 1`` requests are critical, so one instance always stays shared. The set is recomputed every dispatch
round (estimates sharpen as siblings finish; remaining.py keeps them current without re-estimating every request
each round); a request that stays critical keeps its instance. That instance takes no other chunk but its
companions' (while it keeps room for the critical request's next chunk), and the driver moves the paused KV of
other requests off it, so the requests running there finish their chunk and continue elsewhere.

Estimates are the ordering's ``remaining_hint`` (the oracle's is exact). Where it has none (no sibling of the
request has finished) the request buffer falls back to the population of finished responses
(``PopulationLength``), once enough have finished to fit it: a group all of whose members are far longer than
every finished response is the critical path, and its siblings cannot say so. Before that, the request counts
with its whole budget ``max_tokens - generated`` in ``W`` but is never made critical on a budget alone, nor does
it keep a request with a belief from being considered: early in a rollout ``W`` is then so large that nothing is
critical. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from seer.rollout.remaining import RemainingWork
from seer.rollout.step_cost import LinearStepCost, OnlineStepCost
from seer.rollout.types import InstanceState, RolloutRequest
from seer.spec.budget import CRITICAL_SLACK


class CriticalPath:
    """The critical requests of a rollout and the instance each one holds alone."""

    def __init__(self, speedup: Callable[[float], float], margin: float = 1.5, companions: int = 0) -> None:
        """``speedup(b)``: tokens per second of an instance running ``b`` sequences over one sequence alone.
        ``margin``: how much slower than ideal the shared instances may be and the request still be critical.
        ``companions``: requests a critical request's instance also runs without slowing it by the step profile
        (``lone_companions``), until the rollout's measured steps price them; 0 keeps it alone throughout."""
        if margin < 1.0:
            raise ValueError(f"critical-path margin must be >= 1, got {margin}")
        if companions < 0:
            raise ValueError(f"critical-path companions must be >= 0, got {companions}")
        self.speedup = speedup
        self.margin = margin
        self.companions = companions
        self.instance_of: dict[int, int] = {}  # critical request id -> its instance
        self.request_on: dict[int, int] = {}   # instance id -> its critical request
        self.companions_on: dict[int, int] = {}  # instance id -> companions it may run this round
        self.isolated = 0                      # requests made critical (a report counter)
        self.work = RemainingWork()            # the estimates the rule reads; their owner keeps them current
        self.measured = OnlineStepCost()       # the rollout's steps so far, which price companions; its driver
        #                                        feeds it

    def critical_on(self, instance_id: int) -> int | None:
        return self.request_on.get(instance_id)

    def update(self, instances: Sequence[InstanceState]) -> None:
        """Recompute the critical set for this dispatch round from the rollout's current estimates (``work``, which
        its owner has refreshed); a request that stays critical keeps its instance."""
        work = self.work
        live = {i.instance_id: i for i in instances if i.alive}
        held = self._batch_held(list(live.values()), work.mean_context)
        rest = work.total
        # a budget is no evidence that this request, rather than its siblings, ends last: only beliefs compete,
        # while budgets still count in the rest of the work
        chosen: list[tuple[RolloutRequest, int]] = []
        beside = 0  # companions of the requests considered so far
        longest = work.longest()
        try:
            for j, (est, req) in enumerate(longest, start=1):
                if j >= len(live):
                    break
                rest -= est
                shared = len(live) - j
                batch = min((len(work) - j) / shared, held)
                m = self._companions_of(req, work.mean_context)
                beside += m
                if est * (self.speedup(batch) * shared + beside) < rest * self.margin:
                    break
                chosen.append((req, m))
        finally:
            longest.close()
        keep = {r.request_id for r, _ in chosen}
        for rid, iid in list(self.instance_of.items()):
            if rid not in keep or iid not in live:
                self._release(rid)
        self.companions_on = {}
        for req, m in chosen:
            if req.request_id not in self.instance_of:
                iid = self._choose(req, live)
                self.instance_of[req.request_id], self.request_on[iid] = iid, req.request_id
                self.isolated += 1
            self.companions_on[self.instance_of[req.request_id]] = m

    def _companions_of(self, req: RolloutRequest, mean_context: float) -> int:
        """Companions beside ``req``: none where the profile allows none, else as the measured steps price them
        at its context and the unfinished requests' mean, once there is a fit."""
        fit = self.measured.fit
        if not self.companions or fit is None:
            return self.companions
        return fitted_companions(fit, float(req.context_len), mean_context, most=self.companions)

    @staticmethod
    def _batch_held(live: Sequence[InstanceState], mean_context: float) -> float:
        """The batch a shared instance's KV holds at the unfinished requests' mean context: the shared
        instances run no larger batches than that, however many requests wait (unbounded where an instance does
        not report its size)."""
        if not live or mean_context <= 0 or any(i.total_blocks is None for i in live):
            return math.inf
        return max(1.0, min(i.total_blocks * i.block_size for i in live) / mean_context)  # type: ignore[operator]

    def _choose(self, req: RolloutRequest, live: dict[int, InstanceState]) -> int:
        """Where the request runs or holds its KV if that instance is free to reserve, else the least loaded."""
        for iid in (req.running_on, req.kv_instance):
            if iid is not None and iid in live and iid not in self.request_on:
                return iid
        free = [i for i in live.values() if i.instance_id not in self.request_on]
        return min(free, key=lambda i: (i.running, -i.free_blocks, i.instance_id)).instance_id

    def _release(self, request_id: int) -> None:
        iid = self.instance_of.pop(request_id)
        del self.request_on[iid]
        self.companions_on.pop(iid, None)

    def check_integrity(self) -> None:
        self.work.check_integrity()
        self.measured.check_integrity()
        assert len(self.instance_of) == len(self.request_on), "critical map and its inverse differ in size"
        assert set(self.companions_on) <= set(self.request_on), "companions counted for an unreserved instance"
        for rid, iid in self.instance_of.items():
            assert self.request_on.get(iid) == rid, f"instance {iid} is not reserved for request {rid}"


def batch_speedup(batch_sizes: Sequence[float], step_time: Callable[[float], float]) -> Callable[[float], float]:
    """``speedup(b)`` from a step-time profile: ``b' / T(b') * T(1)`` at the best profiled ``b' <= b`` (batches
    between profiled sizes are interpolated; an instance cannot use a larger batch than it has sequences)."""
    alone = step_time(1.0)
    sizes = sorted(float(b) for b in batch_sizes)

    def speedup(b: float) -> float:
        points = [x for x in sizes if x <= b] + ([b] if 1.0 < b < sizes[-1] else [])
        return max([1.0] + [x * alone / step_time(x) for x in points])

    return speedup


def lone_companions(batch_sizes: Sequence[float], step_time: Callable[[float], float],
                    tolerance: float = CRITICAL_SLACK, most: int = 7) -> int:
    """How many sequences an instance can run beside one without slowing its step by more than ``tolerance``
    (at most ``most``): where a step is bound by reading the weights, a few more sequences cost nearly nothing,
    and leaving them out of a critical request's instance throws that throughput away. Counted only inside the
    profiled batches (no extrapolation)."""
    alone, largest = step_time(1.0), max(batch_sizes)
    n = 0
    while n < most and n + 2 <= largest and step_time(n + 2.0) <= (1.0 + tolerance) * alone:
        n += 1
    return n


def fitted_companions(fit: LinearStepCost, critical_context: float, companion_context: float,
                      tolerance: float = CRITICAL_SLACK, most: int = 7) -> int:
    """``lone_companions`` priced by a fit of measured steps: decode steps of one sequence at
    ``critical_context`` and of ``n`` more at ``companion_context`` each."""

    def decode(batch: float) -> float:
        return fit.decode_time(batch, critical_context + (batch - 1.0) * companion_context)

    return lone_companions([1.0, most + 1.0], decode, tolerance, most)
