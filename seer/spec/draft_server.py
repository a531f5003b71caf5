"""The draft server: every group's suffix index in one place, fed by all engine instances, read by all of them.

Why one service: a request's best drafts are the tokens its siblings produced, and the siblings may run on any
instance (divided rollout moves requests between instances chunk by chunk). So instances push the tokens they
accept (``feed``, in batches, off the critical path) and ask for drafts (``propose``). Feeds may lag: a draft
may then be a few tokens stale, which costs acceptance, never correctness (verification decides the output).

Beyond the paper: RL revisits every prompt each epoch, so when a group finishes its responses are kept under its
prompt key as a second source; a later group with the same prompt drafts from whichever source scores higher.

Rules the callers keep (the no-own-future rule follows from them): feed only accepted output tokens, in order,
once; ``stream_id`` names one response of the group (the prompt is stream ``"prompt"``, added at registration).
All arguments and results are plain data (tuples, frozen dataclasses), so the server can sit behind a Ray actor.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

from seer.spec.draft import EMPTY_DRAFT, Draft
from seer.spec.drafter import DrafterConfig, SuffixDrafter
from seer.spec.metrics import SpecMetrics
from seer.spec.suffix_tree import SuffixIndex, SuffixIndexConfig

__all__ = ["DraftServerConfig", "DraftRequest", "DraftServer", "UnknownGroupError", "DraftRequestError"]

PROMPT_STREAM = "prompt"


class UnknownGroupError(KeyError):
    """A group id that was never registered (or was finished long ago)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DraftRequestError(ValueError):
    """A malformed draft request or feed (empty context, draft length out of range, ...)."""


@dataclass(frozen=True)
class DraftServerConfig:
    index: SuffixIndexConfig = field(default_factory=SuffixIndexConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    prefix_len: int = 32  # prompt tail put in front of each response stream, so drafts match across the boundary
    max_draft_tokens: int = 64  # largest per-request token budget (all branches together)
    keep_history: bool = True  # keep finished groups' responses per prompt key (previous RL iterations)
    history_streams: int = 32  # per prompt key, the most recent responses kept
    history_prompts: int = 4096  # prompt keys kept (least recently used dropped)
    recently_finished: int = 4096  # finished group ids remembered, so late feeds are dropped quietly

    def __post_init__(self) -> None:
        if self.prefix_len < 0 or self.max_draft_tokens < 1:
            raise ValueError("prefix_len must be >= 0 and max_draft_tokens >= 1")
        if self.history_streams < 1 or self.history_prompts < 1 or self.recently_finished < 0:
            raise ValueError("history_streams and history_prompts must be >= 1, recently_finished >= 0")


@dataclass(frozen=True)
class DraftRequest:
    """Draft up to ``max_tokens`` tokens (all branches together) for one request; ``max_depth`` defaults to
    ``min(max_tokens, gamma_max)``. ``max_tokens == 0`` asks for no draft."""

    group_id: Hashable
    stream_id: Hashable
    context: Sequence[int]
    max_tokens: int
    k_branches: int = 1
    max_depth: int | None = None


class _Group:
    __slots__ = ("index", "prompt", "prompt_key", "tail")

    def __init__(self, index: SuffixIndex, prompt: tuple[int, ...], prompt_key: Hashable, tail: list[int]) -> None:
        self.index, self.prompt, self.prompt_key, self.tail = index, prompt, prompt_key, tail


class DraftServer:
    def __init__(self, config: DraftServerConfig | None = None) -> None:
        self.config = config or DraftServerConfig()
        self.drafter = SuffixDrafter(self.config.drafter)
        self.metrics = SpecMetrics()
        self._groups: dict[Hashable, _Group] = {}
        self._history: OrderedDict[Hashable, SuffixIndex] = OrderedDict()
        self._history_order: dict[Hashable, list[Hashable]] = {}
        self._finished: OrderedDict[Hashable, None] = OrderedDict()
        self._history_serial = 0

    # ---------------------------------------------------------------- groups
    def register_group(self, group_id: Hashable, prompt_tokens: Sequence[int],
                       prompt_key: Hashable | None = None) -> None:
        """Start a group. ``prompt_key`` (default: the prompt tokens) links it to earlier iterations."""
        if group_id in self._groups:
            raise DraftRequestError(f"group {group_id!r} is already registered")
        prompt = tuple(int(t) for t in prompt_tokens)
        index = SuffixIndex(self.config.index)
        if prompt:
            index.append(PROMPT_STREAM, prompt)
        tail = list(prompt[len(prompt) - self.config.prefix_len :]) if self.config.prefix_len else []
        key = prompt if prompt_key is None else prompt_key
        self._groups[group_id] = _Group(index, prompt, key, tail)
        self._finished.pop(group_id, None)

    def has_group(self, group_id: Hashable) -> bool:
        return group_id in self._groups

    def _group(self, group_id: Hashable) -> _Group:
        try:
            return self._groups[group_id]
        except KeyError:
            raise UnknownGroupError(f"unknown group {group_id!r}: register_group() it first") from None

    def finish_group(self, group_id: Hashable) -> None:
        """Free the group's index; keep its responses as history for its prompt key (if enabled)."""
        group = self._groups.pop(group_id, None)
        if group is None:
            raise UnknownGroupError(f"cannot finish unknown group {group_id!r}")
        self._finished[group_id] = None
        while len(self._finished) > self.config.recently_finished:
            self._finished.popitem(last=False)
        if self.config.keep_history:
            for sid in group.index.stream_ids():
                if sid != PROMPT_STREAM:
                    self._add_history(group.prompt_key, group.index.stream(sid))

    def _add_history(self, key: Hashable, tokens: Sequence[int]) -> None:
        hist = self._history.get(key)
        if hist is None:
            hist = self._history[key] = SuffixIndex(self.config.index)
            self._history_order[key] = []
            while len(self._history) > self.config.history_prompts:
                old, _ = self._history.popitem(last=False)
                del self._history_order[old]
        self._history.move_to_end(key)
        self._history_serial += 1
        hist.append(self._history_serial, tokens)
        order = self._history_order[key]
        order.append(self._history_serial)
        while len(order) > self.config.history_streams:
            hist.remove_stream(order.pop(0))

    # ---------------------------------------------------------------- feeding
    def feed(self, updates: Iterable[tuple[Hashable, Hashable, Sequence[int]]]) -> None:
        """Append newly accepted tokens: ``(group_id, stream_id, new_tokens)`` each, in generation order.
        Feeds for a recently finished group are dropped (they can arrive late from another instance)."""
        for group_id, stream_id, tokens in updates:
            group = self._groups.get(group_id)
            if group is None:
                if group_id in self._finished:
                    continue
                raise UnknownGroupError(f"feed for unknown group {group_id!r}")
            if stream_id == PROMPT_STREAM:
                raise DraftRequestError(f"stream id {PROMPT_STREAM!r} is reserved for the prompt")
            if not group.index.has_stream(stream_id):
                group.index.append(stream_id, group.tail)
            group.index.append(stream_id, [int(t) for t in tokens])  # plain ints: numpy ids hash slowly

    # ---------------------------------------------------------------- drafting
    def _validate(self, req: DraftRequest) -> None:
        if len(req.context) == 0:
            raise DraftRequestError(f"group {req.group_id!r} stream {req.stream_id!r}: empty context")
        if not 0 <= req.max_tokens <= self.config.max_draft_tokens:
            raise DraftRequestError(
                f"max_tokens (gamma) {req.max_tokens} out of range [0, {self.config.max_draft_tokens}]")
        if req.k_branches < 1:
            raise DraftRequestError(f"k_branches must be >= 1, got {req.k_branches}")
        gamma_max = self.config.drafter.gamma_max
        if req.max_depth is not None and not 1 <= req.max_depth <= gamma_max:
            raise DraftRequestError(f"max_depth {req.max_depth} out of range [1, gamma_max={gamma_max}]")

    def propose_one(self, req: DraftRequest) -> Draft:
        self._validate(req)
        group = self._group(req.group_id)
        if req.max_tokens == 0:
            return EMPTY_DRAFT
        context = req.context
        if not isinstance(context, (list, tuple)):  # e.g. a numpy array or tensor: plain ints for the lookups
            context = [int(t) for t in context[-self.config.index.max_pattern :]]
        best = self.drafter.draft(group.index, context, req.max_tokens, req.k_branches, req.max_depth,
                                  source="group")
        hist = self._history.get(group.prompt_key)
        if hist is not None:
            other = self.drafter.draft(hist, context, req.max_tokens, req.k_branches, req.max_depth,
                                       source="history")
            if other.score > best.score:
                best = other
        return best

    def propose(self, requests: Sequence[DraftRequest | tuple]) -> list[Draft]:
        """One draft per request (``DraftRequest`` or a tuple of its fields, in order)."""
        start = time.perf_counter()
        reqs = [r if isinstance(r, DraftRequest) else DraftRequest(*r) for r in requests]
        out = [self.propose_one(r) for r in reqs]
        self.metrics.record_propose(time.perf_counter() - start, len(reqs))
        return out

    # ---------------------------------------------------------------- metrics
    def record_verification(self, group_id: Hashable, drafted: int, accepted: int, bonus: int,
                            request_id: Hashable | None = None) -> None:
        """Outcome of one verification step of one request (drafted = draft size, accepted along the path)."""
        if drafted == 0:
            self.metrics.record_plain(group_id, request_id)
        else:
            self.metrics.record(group_id, drafted, accepted, bonus, request_id)

    # ---------------------------------------------------------------- checks
    @property
    def num_groups(self) -> int:
        return len(self._groups)

    def memory_entries(self) -> int:
        return sum(g.index.memory_entries() for g in self._groups.values()) + sum(
            h.memory_entries() for h in self._history.values())

    def check_integrity(self) -> None:
        for gid, group in self._groups.items():
            group.index.check_integrity()
            assert gid not in self._finished, f"group {gid!r} is both running and finished"
            if group.prompt:
                assert tuple(group.index.stream(PROMPT_STREAM)) == group.prompt, f"prompt stream of {gid!r} changed"
        assert set(self._history) == set(self._history_order), "history tables disagree"
        for key, hist in self._history.items():
            hist.check_integrity()
            assert set(hist.stream_ids()) == set(self._history_order[key]), f"history order of {key!r}"
            assert len(hist.stream_ids()) == len(self._history_order[key]), f"history order of {key!r}"
            assert len(self._history_order[key]) <= self.config.history_streams
        self.metrics.check_integrity()
