"""The rollout's types: what users pass in and get back, and the control plane's shared vocabulary.

Public (the API of ``RolloutCoordinator``, the server and the trainer): ``GroupInput`` in; ``RolloutResult`` of
``ResponseResult`` out; ``RolloutListener`` to stream and abort; ``FaultPlan`` to inject a fault;
``RolloutStalled`` when a rollout cannot progress. Internal: requests, groups, instance snapshots, assignments.

Why a separate module: the real engine rollout, trace replay and the cluster simulator all drive the same
request buffer and orderings, so the vocabulary they exchange (what a request is, what an instance reports,
what a dispatch decision says) must live in one torch-free place that every side imports unchanged.

A `RolloutRequest` is one response of a group (GRPO samples each prompt G times). Under divided rollout it runs
in chunks; between chunks it waits in the request buffer, and its KV cache is either still resident on the
instance that ran it (`kv_instance`), parked in the global KV pool (`kv_in_pool`), both, or lost (then the next
instance must recompute it from the token ids).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from seer.rollout.metrics import RolloutMetrics
from seer.sampling_params import SamplingParams, sibling_seed

if TYPE_CHECKING:
    from seer.rollout.driver import RolloutDriver


class RequestState(enum.Enum):
    """Where a request is: waiting in the buffer, running a chunk on an instance, or done."""

    BUFFERED = "buffered"
    RUNNING = "running"
    FINISHED = "finished"


class KVSource(str, enum.Enum):
    """How the instance that runs the next chunk gets the request's KV cache."""

    FRESH = "fresh"  # nothing generated and no KV yet: an ordinary prefill of the prompt
    LOCAL = "local"  # the KV is still resident on the chosen instance: no transfer
    POOL = "pool"  # load it from the global KV pool: bytes move, nothing is recomputed
    RECOMPUTE = "recompute"  # KV lost: re-prefill prompt + generated tokens (counts as reprefill)


FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `tokens` tokens (ceil division)."""
    return -(-tokens // block_size) if tokens > 0 else 0


@dataclass(eq=False)
class RolloutRequest:
    """One response of a group; mutated only by the request buffer (and its ordering's bookkeeping)."""

    request_id: int
    group_id: int
    index: int  # position in the group; index 0 is the group's probe
    prompt_len: int
    max_tokens: int
    prompt_token_ids: tuple[int, ...] | None = None
    true_length: int | None = None  # known only when replaying a trace (oracle ordering)
    generated: int = 0
    state: RequestState = RequestState.BUFFERED
    finish_reason: str | None = None
    running_on: int | None = None  # instance running its current chunk
    kv_instance: int | None = None  # instance whose KV cache still holds this request's KV
    kv_in_pool: bool = False  # a copy of its KV lives in the global KV pool
    kv_tokens: int = 0  # tokens covered by the resident / pooled KV
    instance_history: list[int] = field(default_factory=list)
    chunks: int = 0
    # Ordering bookkeeping (written by orderings only): arrival order, pops served at arrival, live heap ticket.
    arrival_seq: int = -1
    arrival_served: int = 0
    ticket: int = -1

    @property
    def is_probe(self) -> bool:
        """The first request of each group is its probe (speculative request of context-aware scheduling)."""
        return self.index == 0

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def context_len(self) -> int:
        """Prompt plus generated tokens: the sequence length the next chunk starts from."""
        return self.prompt_len + self.generated

    @property
    def remaining_budget(self) -> int:
        return self.max_tokens - self.generated

    def chunk_max_tokens(self, chunk_tokens: int | None) -> int:
        """`min(chunk_tokens, max_tokens - generated)`; `None` means no chunking (the whole remaining budget)."""
        if chunk_tokens is None:
            return self.remaining_budget
        return min(chunk_tokens, self.remaining_budget)


@dataclass(eq=False)
class Group:
    """G requests sampled from one prompt, plus what their finished siblings reveal about length."""

    group_id: int
    size: int
    max_tokens: int
    requests: list[RolloutRequest] = field(default_factory=list)
    finished_lengths: list[int] = field(default_factory=list)  # lengths of siblings that ended on their own
    true_lengths: tuple[int, ...] | None = None
    aborted: int = 0  # members ended by an abort: their partial lengths say nothing about the group's length

    @property
    def length_estimate(self) -> int:
        """L_g: the longest finished response so far, or max_tokens before any has finished."""
        return max(self.finished_lengths) if self.finished_lengths else self.max_tokens

    @property
    def num_finished(self) -> int:
        return len(self.finished_lengths)

    @property
    def done(self) -> bool:
        return len(self.finished_lengths) + self.aborted == self.size


@dataclass
class InstanceState:
    """What an engine instance reports before a dispatch round; `select` reserves on it as it assigns."""

    instance_id: int
    free_blocks: int
    block_size: int
    running: int = 0
    max_running: int = 1 << 30
    total_blocks: int | None = None  # lets the dispatcher reject chunks that could never fit
    alive: bool = True

    @property
    def has_slot(self) -> bool:
        return self.alive and self.running < self.max_running


@dataclass(frozen=True)
class Assignment:
    """One dispatch decision: run up to `max_new_tokens` of `request` on `instance_id`."""

    request: RolloutRequest
    instance_id: int
    max_new_tokens: int
    kv_source: KVSource
    blocks_reserved: int
    reserve_tokens: int | None = None  # the chunk's tokens whose KV the placement reserved (None: all of them)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def reprefill_tokens(self) -> int:
        """Tokens this chunk recomputes because the KV was lost (0 unless `kv_source` is RECOMPUTE)."""
        return self.request.context_len if self.kv_source is KVSource.RECOMPUTE else 0


def chunk_blocks_needed(req: RolloutRequest, inst: InstanceState, chunk: int) -> int:
    """New KV blocks `inst` must find for `chunk` more tokens of `req` (blocks resident there are reused)."""
    total = blocks_for(req.context_len + chunk, inst.block_size)
    if req.kv_instance == inst.instance_id:
        total -= blocks_for(req.kv_tokens, inst.block_size)
    return max(total, 0)


# ---------------------------------------------------------------------- public: what a rollout takes and returns
class RolloutStalled(RuntimeError):
    """No instance can make progress while responses remain (never hang: report instead)."""


@dataclass(frozen=True)
class GroupInput:
    """One prompt sampled ``size`` times."""

    prompt_token_ids: tuple[int, ...]
    size: int
    params: SamplingParams
    key: str = ""
    forced: tuple[tuple[int, ...], ...] | None = None   # per response: recorded tokens to replay
    true_lengths: tuple[int, ...] | None = None          # oracle ordering only
    stop_lengths: tuple[int, ...] | None = None          # length-only replay: response i stops after this many
    metadata: dict | None = None                          # reference answer etc., passed through to results

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"group {self.key or '?'}: group size must be >= 1, got {self.size}")
        if not self.prompt_token_ids:
            raise ValueError(f"group {self.key or '?'}: empty prompt")
        for name in ("forced", "true_lengths", "stop_lengths"):
            value = getattr(self, name)
            if value is not None and len(value) != self.size:
                raise ValueError(f"group {self.key or '?'}: {len(value)} {name} for group size {self.size}")
        if self.stop_lengths is not None and any(not 0 < n <= self.params.max_tokens for n in self.stop_lengths):
            raise ValueError(f"group {self.key or '?'}: stop lengths must be in [1, max_tokens]")

    def response_params(self, index: int) -> SamplingParams:
        """The params one response runs with: its own seed derived from the group's, and in length-only replay
        EOS ignored (the recorded length ends it instead: ``stop_after``). ``max_tokens`` stays the group's: a
        per-response budget would tell the engine, its drafts and its admission each response's true length."""
        params = replace(self.params, seed=sibling_seed(self.params.seed, index))
        return params if self.stop_lengths is None else replace(params, ignore_eos=True)

    def stop_after(self, index: int) -> int | None:
        """Length-only replay: response ``index`` ends, as at an EOS, once it has this many tokens."""
        return None if self.stop_lengths is None else self.stop_lengths[index]


@dataclass
class ResponseResult:
    request_id: int
    group_id: int
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    finish_time_s: float | None = None
    instance_history: list[int] = field(default_factory=list)


@dataclass
class RolloutResult:
    responses: list[ResponseResult]
    metrics: RolloutMetrics
    decisions: dict[int, list[tuple]]
    stats: dict

    def groups(self) -> dict[int, list[ResponseResult]]:
        out: dict[int, list[ResponseResult]] = {}
        for r in self.responses:
            out.setdefault(r.group_id, []).append(r)
        return out


@dataclass
class DriverCounters:
    """What one rollout's driver counted. ``tokens`` are returned at chunk ends; ``emitted`` are committed by
    steps (a response running as one chunk, as in verl, returns its tokens only when it finishes, so progress
    reads ``emitted``)."""

    preemptions: int = 0
    evictions: int = 0
    kv_bytes_moved: int = 0
    steps: int = 0
    tokens: int = 0
    emitted: int = 0
    failed_instances: int = 0


FAULT_POINTS = ("step", "evict", "import")


@dataclass(frozen=True)
class FaultPlan:
    """Kill ``instance_id`` (tests, demos and ``seer bench faults``). ``during``: ``step`` kills it at rollout
    time ``at_s`` (virtual time in process, wall time for processes and Ray actors), wherever its step is;
    ``evict`` in the middle of its first KV eviction to the pool, and ``import`` in the middle of its first
    chunk start that loads KV from the pool (``at_s`` does not apply to those two)."""

    instance_id: int
    at_s: float = 0.0
    during: str = "step"

    def __post_init__(self) -> None:
        if self.during not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {self.during!r}; choose one of {', '.join(FAULT_POINTS)}")
        if self.at_s < 0 or self.instance_id < 0:
            raise ValueError("a fault needs instance_id >= 0 and at_s >= 0")


class RolloutListener:
    """Callbacks from the driver's own thread while a rollout runs; every one is optional (no-ops here).

    ``group_id`` is the group's position in the rollout's ``groups`` list. Callbacks must be quick and must not
    raise (they run inside the driver loop); anything slow belongs on another thread.
    """

    def on_start(self, driver: "RolloutDriver") -> None:
        """The driver exists (before the first dispatch): keep it to call ``abort`` from another thread."""

    def on_tokens(self, group_id: int, index: int, new_token_ids: list[int], new_logprobs: list[float],
                  finished: bool, finish_reason: str | None) -> None:
        """A chunk of response ``index`` of ``group_id`` ended (tokens may be empty, e.g. for an abort)."""

    def on_group_done(self, group_id: int) -> None:
        """Every response of the group has finished (after its last ``on_tokens``)."""
