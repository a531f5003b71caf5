"""The interface every rollout instance implements: a real engine (in-process, a process, a Ray actor) or a
simulated one priced by a cost model.

The rollout driver only ever talks to instances through this interface, so the real engine, trace replay and the
cluster simulator make the same decisions from the same events. Torch-free.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field

from seer.rollout.types import Assignment, InstanceState, KVSource
from seer.sampling_params import SamplingParams


class InstanceLost(RuntimeError):
    """An instance died while answering a synchronous call (its process or actor is gone); the driver then
    treats it as failed, exactly as if the loss had been detected by the backend's liveness check."""

    def __init__(self, instance_id: int) -> None:
        super().__init__(f"instance {instance_id} is gone")
        self.instance_id = instance_id


@dataclass(frozen=True)
class RequestSpec:
    """What an instance needs to know about one response beyond the buffer's bookkeeping."""

    request_id: int
    group_id: int
    index: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams          # max_tokens is the whole response's budget
    forced_token_ids: tuple[int, ...] | None = None  # trace replay: emit these
    group_key: str = ""             # stable prompt key (drafting from earlier iterations of the same prompt)
    stop_after: int | None = None   # length-only replay: stop, as at an EOS, once this many tokens exist


@dataclass(frozen=True)
class ChunkStart:
    """Run ``request`` until it has ``chunk_end`` output tokens (or finishes)."""

    assignment: Assignment
    spec: RequestSpec
    output_token_ids: tuple[int, ...]  # generated so far (needed to recompute when the KV is lost)
    chunk_end: int
    # divided rollout: the output tokens past ``output_token_ids`` whose KV admission reserves; where that is less
    # than the chunk, the rest is allocated as the chunk runs and the chunk ends early where the instance's KV runs
    # out (the KV stays). None: nothing reserved ahead (the baseline admits what fits now and preempts)
    reserve_tokens: int | None
    remaining_hint: float | None = None  # the ordering's estimate of the tokens the response still needs
    critical: bool = False               # the critical path placed it on an instance of its own

    @property
    def kv_source(self) -> KVSource:
        return self.assignment.kv_source


@dataclass
class ChunkEvent:
    """A chunk ended: new tokens since the chunk started, and whether the response is complete."""

    request_id: int
    new_token_ids: list[int]
    new_logprobs: list[float]
    finished: bool
    finish_reason: str | None
    kv_tokens: int                      # tokens of KV still resident on the instance (0 when finished)


@dataclass
class StepReport:
    """One engine step: how long it took and which chunks ended. ``duration_s`` includes the step's drafting
    (``draft_s``) and the KV the instance moved since its previous step (``kv_s``); the rest is compute."""

    duration_s: float
    events: list[ChunkEvent] = field(default_factory=list)
    scheduled_tokens: int = 0
    num_running: int = 0
    preemptions: int = 0
    stalled: bool = False               # work queued but nothing could be scheduled (KV held by paused requests)
    trace: tuple = ()  # (request_id, start, num_new_tokens, num_spec, shared_tokens) per chunk: decision log
    new_tokens: list[tuple[int, list[int]]] = field(default_factory=list)  # committed this step, per request
    draft_s: float = 0.0
    kv_s: float = 0.0


def merge_stalled(stalled: StepReport, retry: StepReport) -> StepReport:
    """A step that could schedule nothing, then its retry after an eviction, as one step: the retry's outcome
    with the time of both (the stalled step's tick and any KV it paid for stay on the clock)."""
    retry.duration_s += stalled.duration_s
    retry.draft_s += stalled.draft_s
    retry.kv_s += stalled.kv_s
    return retry


class Instance(abc.ABC):
    """One engine instance as the driver sees it."""

    instance_id: int

    @abc.abstractmethod
    def state(self) -> InstanceState:
        """Free KV blocks (not counting paused requests' resident KV), running count, capacity."""

    @abc.abstractmethod
    def start(self, chunk: ChunkStart) -> None:
        """Queue a chunk. Its KV comes from ``chunk.kv_source``: fresh prefill, resident here, the pool, or
        recomputation from ``output_token_ids``."""

    @abc.abstractmethod
    def step(self) -> StepReport:
        """Advance one scheduling step (call only when ``has_work``)."""

    @abc.abstractmethod
    def has_work(self) -> bool:
        """Queued or running chunks exist."""

    @abc.abstractmethod
    def resident(self) -> list[int]:
        """Requests whose KV stays here between chunks, least recently used first."""

    @abc.abstractmethod
    def resident_blocks(self, request_id: int) -> int:
        """KV blocks a resident request holds here."""

    @abc.abstractmethod
    def evict(self, request_id: int) -> int:
        """Move a resident request's KV to the global pool and free it here; returns bytes written."""

    @abc.abstractmethod
    def release(self, request_id: int) -> None:
        """Free a resident request's KV without saving it."""

    def join_virtual_time(self, clock: Callable[[], float]) -> None:
        """Virtual time: keep what a step produces hidden until ``step_ended``. A step is computed when it
        starts, so without this the dispatcher would see the KV it frees and the requests it ends, and other
        instances would draft from its tokens, before its end in virtual time. ``clock`` reads the virtual now
        (a simulated instance stamps its timeline with it)."""

    def step_ended(self) -> None:
        """The step begun last has ended: its outcome becomes visible."""

    def stats(self) -> dict:
        return {}
