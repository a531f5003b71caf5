"""An engine request: the unit the scheduler, block manager and model runner agree on.

Like vLLM v1, a request carries only token counts (``num_computed_tokens`` against ``num_tokens``), never a
prefill/decode phase: a chunk of prompt, one decode token, or a decode token plus speculative drafts are all
"compute the next tokens whose KV is missing". Torch-free, so the simulator reuses it unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from seer.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"  # a divided-rollout chunk ended: KV kept, not scheduled until resumed or exported
    FINISHED = "finished"


@dataclass(eq=False)  # identity semantics: queues compare requests by identity, never field by field
class Request:
    """One sequence being generated.

    ``forced_token_ids`` turns on forced-token replay: the model still runs every forward pass, but the
    emitted tokens are the recorded ones, and the request stops where the recording ends. ``stop_after`` (length-only
    replay) stops it once it has that many tokens. Both act like an EOS, found when the token is emitted: nothing
    that plans ahead (draft lengths, admission) may read them, or replay would know what production cannot.
    ``spec_token_ids`` are draft tokens proposed for the next step (verified, then cleared).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    group_id: str | None = None
    arrival: int = 0
    forced_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0
    max_computed_tokens: int = 0  # high-water mark: tokens recomputed below it count as re-prefill
    reprefill_reason: str | None = None  # why they are recomputed (None: preemption)
    block_ids: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    spec_parents: list[int] | None = None  # tree drafts: parent index per draft token (-1 = last token)
    spec_source: str = ""  # where the draft came from: "group" (siblings), "history" (earlier rollouts' responses)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0
    error: str | None = None
    chunk_end: int | None = None  # divided rollout: pause once this many output tokens exist
    reserve_tokens: int = 0       # KV slots to reserve at admission (a whole chunk: no preemption later)
    # divided rollout with part of the chunk reserved: where the instance's KV runs out, the chunk ends early (its
    # KV kept) instead of the request being preempted
    pause_when_full: bool = False
    probe: bool = False           # the group's probe request (served first, drafts get priority)
    remaining_hint: float | None = None  # the rollout's estimate of tokens still to generate (draft priority)
    critical: bool = False        # the rollout gave it an instance of its own: its steps come first in drafting
    stop_after: int | None = None  # length-only replay: the recorded length, an EOS at that position

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def max_output_tokens(self) -> int:
        """Tokens this request may emit in total: its budget, never a replayed recording's length."""
        return self.params.max_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_output_tokens

    def token_at(self, pos: int) -> int:
        p = self.num_prompt_tokens
        return self.prompt_token_ids[pos] if pos < p else self.output_token_ids[pos - p]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output(self, token_id: int, logprob: float) -> None:
        self.output_token_ids.append(token_id)
        self.output_logprobs.append(logprob)

    def check_stop(self, max_model_len: int) -> str | None:
        """The finish reason after the last appended token, or None to go on."""
        if not self.output_token_ids:
            return None
        last = self.output_token_ids[-1]
        if self.forced_token_ids is None:
            if not self.params.ignore_eos and last in self.eos_token_ids:
                return "stop"
            if last in self.params.stop_token_ids:
                return "stop"
        elif self.num_output_tokens >= len(self.forced_token_ids):
            return "stop" if self.num_output_tokens < self.params.max_tokens else "length"
        if self.stop_after is not None and self.stop_after <= self.num_output_tokens < self.params.max_tokens:
            return "stop"
        if self.num_output_tokens >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
