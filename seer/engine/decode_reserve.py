"""Admission that keeps KV blocks free for the tokens running requests have yet to generate.

Admitting a request the moment its prompt fits fills the KV cache with requests that all still grow; once it is
full the newest is preempted and later recomputes its whole context. Where every response runs to
``max_tokens`` (a fixed-length batch) that recomputation is pure waste. Reserving the whole remainder is wrong
when lengths vary, though: most sampled responses stop long before ``max_tokens`` and a full reservation halves
the batch. So admission reserves a *ratio* of the remainder, learnt
from the requests that finish: each pulls the ratio toward the share of its own budget it used (an ignore_eos
batch keeps it at 1, sampled responses that stop early lower it), and a preemption, the sign that it is too low,
halves its distance to 1. It starts at 1: before anything finished, nothing says the responses will be short.

Torch-free, owned by the scheduler; the simulator and trace replay keep it off because there ``max_tokens`` is
each response's recorded length, which a real scheduler cannot know. Measurements: benchmarks/README.md,
"Admission with an adaptive KV reserve".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from seer.engine.request import Request


@dataclass(frozen=True)
class DecodeReserveConfig:
    """``init``: the ratio before any request finished; each finished request moves it ``1 / window`` of the way to
    the share of its budget it used; it never drops below ``floor``."""

    init: float = 1.0
    floor: float = 0.1
    window: int = 32

    def __post_init__(self) -> None:
        if not 0.0 <= self.floor <= self.init <= 1.0:
            raise ValueError(f"DecodeReserveConfig needs 0 <= floor <= init <= 1, got floor={self.floor}, "
                             f"init={self.init}")
        if self.window < 1:
            raise ValueError(f"DecodeReserveConfig.window must be >= 1, got {self.window}")


class DecodeReserve:
    """The current ratio and the blocks it asks admission to leave free."""

    def __init__(self, config: DecodeReserveConfig, block_size: int, max_model_len: int) -> None:
        self.config = config
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.ratio = config.init

    def budget(self, req: Request) -> int:
        """The output tokens ``req`` may generate: ``max_tokens`` within the model length."""
        return max(1, min(req.max_total_tokens, self.max_model_len) - req.num_prompt_tokens)

    def observe_finish(self, req: Request) -> None:
        """Learn from a finished request how much of its budget responses use."""
        used = min(1.0, req.num_output_tokens / self.budget(req))
        self.ratio = max(self.config.floor, self.ratio + (used - self.ratio) / self.config.window)

    def observe_preemption(self) -> None:
        self.ratio += (1.0 - self.ratio) / 2

    def future_blocks(self, req: Request, allocated_tokens: int) -> int:
        """Blocks ``req`` may still need beyond the slots it holds: up to its chunk end in divided rollout (whose
        chunk is reserved at admission, so usually none), else up to ``max_tokens`` or the model length."""
        end = min(req.max_total_tokens, self.max_model_len)
        if req.chunk_end is not None:
            end = min(end, req.num_prompt_tokens + req.chunk_end)
        return -(-max(0, end - allocated_tokens) // self.block_size)

    def held_blocks(self, reqs: Iterable[Request]) -> float:
        """The reserve, in blocks, for requests already admitted (their allocated slots counted as held)."""
        return self.ratio * sum(self.future_blocks(r, len(r.block_ids) * self.block_size) for r in reqs)

    def check_integrity(self) -> None:
        assert self.config.floor <= self.ratio <= 1.0, f"ratio {self.ratio} outside [{self.config.floor}, 1]"
