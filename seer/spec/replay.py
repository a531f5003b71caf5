"""Model-free acceptance replay of a token-id trace: how many tokens per verification step would drafting give?

Why: acceptance depends only on the drafts and the tokens the target emits. With greedy semantics a draft token
is accepted iff it equals the recorded next token (tree drafts: along the path that matches), and the bonus
token is the recorded token after the accepted prefix. So recorded RL responses measure a drafter exactly,
without a model, in seconds. Modes (issue 3):

* ``n0``/``n1``/``n3``/``n7``: each response is replayed after ``n`` of its siblings finished and sit in the
  group's index (what a late, tail request sees); ``n0`` has only the prompt and the request's own past.
* ``interleaved``: all G responses of a group advance together, one verification step per round, and feed the
  index as they go (what requests see while the whole group is running).

tau and accept_rate are computed from summed counters exactly as docs/design.md defines them.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from seer.data.traces import TraceGroup, load_trace
from seer.spec.draft import Draft
from seer.spec.drafter import DrafterConfig, SuffixDrafter
from seer.spec.metrics import SpecCounters
from seer.spec.naive import NaiveDrafter
from seer.spec.suffix_tree import SuffixIndex, SuffixIndexConfig

__all__ = ["ReplayConfig", "Cursor", "replay_trace", "replay_naive", "drafter_speed", "spec_replay_report",
           "BRANCHES"]

BRANCHES = {"linear": 1, "k2": 2, "k4": 4}
Proposer = Callable[[list[int]], Draft]


@dataclass(frozen=True)
class ReplayConfig:
    gamma_max: int = 8
    prefix_len: int = 32  # prompt tail placed in front of every response stream (matches across the boundary)
    modes: tuple[str, ...] = ("n0", "n1", "n3", "n7", "interleaved")
    drafters: tuple[str, ...] = ("linear", "k2", "k4")
    index: SuffixIndexConfig = field(default_factory=SuffixIndexConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def __post_init__(self) -> None:
        for mode in self.modes:
            if mode != "interleaved" and not (mode.startswith("n") and mode[1:].isdigit()):
                raise ValueError(f"unknown replay mode {mode!r} (use n<int> or 'interleaved')")
        for name in self.drafters:
            if name not in BRANCHES:
                raise ValueError(f"unknown drafter {name!r}; choose from {sorted(BRANCHES)}")
        if self.gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1, got {self.gamma_max}")


class Cursor:
    """One response being replayed: forced tokens, greedy acceptance, counters."""

    def __init__(self, prompt: Sequence[int], response: Sequence[int], counters: SpecCounters, gamma: int) -> None:
        self.context: list[int] = list(prompt)
        self.response = response
        self.pos = 0
        self.counters = counters
        self.gamma = gamma

    @property
    def done(self) -> bool:
        return self.pos >= len(self.response)

    def step(self, draft: Draft) -> list[int]:
        """Verify ``draft`` against the recorded tokens; return the tokens emitted by this step."""
        resp, pos = self.response, self.pos
        if len(draft) == 0:
            self.counters.plain_steps += 1
            new = [resp[pos]]
        else:
            accepted = len(draft.accept_greedy(resp[pos : pos + self.gamma]))
            bonus = 1 if pos + accepted < len(resp) else 0
            self.counters.add(len(draft), accepted, bonus)
            new = list(resp[pos : pos + accepted + bonus])
        self.pos += len(new)
        self.context.extend(new)
        return new


def _siblings(i: int, n: int, group_size: int) -> list[int]:
    return [(i + 1 + j) % group_size for j in range(min(n, group_size - 1))]


def _run_alone(cursor: Cursor, propose: Proposer, feed: Callable[[list[int]], None]) -> None:
    while not cursor.done:
        feed(cursor.step(propose(cursor.context)))


def _ours(index: SuffixIndex, drafter: SuffixDrafter, gamma: int, k: int) -> Proposer:
    budget = gamma * k
    return lambda ctx: drafter.draft(index, ctx, budget, k, gamma)


def _replay_n(group: TraceGroup, ns: Sequence[int], cfg: ReplayConfig,
              counters: dict[int, dict[str, SpecCounters]]) -> None:
    """For each response, grow its index sibling by sibling; at each requested ``n`` replay every drafter.

    Siblings are taken cyclically after the response, so the n=1 set is inside the n=3 set and so on."""
    prompt = list(group.prompt_token_ids or ())
    tail = prompt[-cfg.prefix_len :] if cfg.prefix_len else []
    responses = [r.token_ids or () for r in group.responses]
    drafter = SuffixDrafter(cfg.drafter)
    for i, resp in enumerate(responses):
        index = SuffixIndex(cfg.index)
        index.append("prompt", prompt)
        added = 0
        for n in sorted(ns):
            for j in _siblings(i, n, len(responses))[added:]:
                index.append(j, tail + list(responses[j]))
                added += 1
            for name in cfg.drafters:
                index.append("own", tail)
                cursor = Cursor(prompt, resp, counters[n][name], cfg.gamma_max)
                _run_alone(cursor, _ours(index, drafter, cfg.gamma_max, BRANCHES[name]),
                           functools.partial(index.append, "own"))
                index.remove_stream("own")


def _replay_interleaved(group: TraceGroup, cfg: ReplayConfig, counters: dict[str, SpecCounters]) -> None:
    prompt = list(group.prompt_token_ids or ())
    tail = prompt[-cfg.prefix_len :] if cfg.prefix_len else []
    drafter = SuffixDrafter(cfg.drafter)
    for name in cfg.drafters:
        index = SuffixIndex(cfg.index)
        index.append("prompt", prompt)
        cursors = []
        for i, r in enumerate(group.responses):
            index.append(i, tail)
            cursors.append(Cursor(prompt, r.token_ids or (), counters[name], cfg.gamma_max))
        propose = _ours(index, drafter, cfg.gamma_max, BRANCHES[name])
        while any(not c.done for c in cursors):
            active = [(i, c) for i, c in enumerate(cursors) if not c.done]
            drafts = [propose(c.context) for _, c in active]  # all drafts of a round see the same index
            for (i, c), d in zip(active, drafts):
                index.append(i, c.step(d))


def _require_token_ids(groups: Sequence[TraceGroup]) -> None:
    for g in groups:
        if not g.has_token_ids:
            raise ValueError(f"group {g.group_id!r} has no token ids: replay needs a token-id trace")


def replay_trace(groups: Sequence[TraceGroup], config: ReplayConfig | None = None) -> dict:
    """Replay every mode and drafter; ``{"tau": {mode: {drafter: x}}, "accept_rate": ..., "counters": ...}``."""
    cfg = config or ReplayConfig()
    _require_token_ids(groups)
    counters = {mode: {name: SpecCounters() for name in cfg.drafters} for mode in cfg.modes}
    ns = [int(m[1:]) for m in cfg.modes if m != "interleaved"]
    for group in groups:
        if ns:
            _replay_n(group, ns, cfg, {int(m[1:]): counters[m] for m in cfg.modes if m != "interleaved"})
        if "interleaved" in cfg.modes:
            _replay_interleaved(group, cfg, counters["interleaved"])
    return _report(counters)


def _report(counters: dict[str, dict[str, SpecCounters]]) -> dict:
    out: dict[str, dict] = {"tau": {}, "accept_rate": {}, "tokens_per_step": {}, "counters": {}}
    for mode, by_name in counters.items():
        out["tau"][mode] = {name: c.tau for name, c in by_name.items()}
        out["accept_rate"][mode] = {name: c.accept_rate for name, c in by_name.items()}
        out["tokens_per_step"][mode] = {name: c.tokens_per_step for name, c in by_name.items()}
        out["counters"][mode] = {name: c.as_dict() for name, c in by_name.items()}
    return out


def replay_naive(groups: Sequence[TraceGroup], ns: Sequence[int] = (1, 3, 7), gamma: int = 8) -> dict:
    """The naive baseline (complete sibling references only, linear): ``{"tau": {"n1": x, ...}, ...}``."""
    _require_token_ids(groups)
    out: dict[str, dict] = {"tau": {}, "accept_rate": {}, "tokens_per_step": {}, "counters": {}}
    for n in ns:
        c = SpecCounters()
        for group in groups:
            prompt = list(group.prompt_token_ids or ())
            responses = [r.token_ids or () for r in group.responses]
            for i, resp in enumerate(responses):
                naive = NaiveDrafter([responses[j] for j in _siblings(i, n, len(responses))], gamma)
                _run_alone(Cursor(prompt, resp, c, gamma), naive.draft, lambda toks: None)
        out["tau"][f"n{n}"], out["accept_rate"][f"n{n}"] = c.tau, c.accept_rate
        out["tokens_per_step"][f"n{n}"] = c.tokens_per_step
        out["counters"][f"n{n}"] = c.as_dict()
    return out


def drafter_speed(groups: Sequence[TraceGroup], cfg: ReplayConfig | None = None, chunk: int = 4) -> dict:
    """CPU microseconds per appended token and per lookup: all siblings but one in the index, the last one
    streamed in ``chunk``-token feeds, a linear and a k=4 lookup before each feed."""
    cfg = cfg or ReplayConfig()
    drafter, clock = SuffixDrafter(cfg.drafter), time.process_time
    bulk_s = stream_s = linear_s = tree_s = 0.0
    bulk_n = stream_n = lookups = entries = 0
    for group in groups:
        prompt = list(group.prompt_token_ids or ())
        responses = [list(r.token_ids or ()) for r in group.responses]
        index = SuffixIndex(cfg.index)
        t0 = clock()
        index.append("prompt", prompt)
        for j, resp in enumerate(responses[1:]):
            index.append(j, resp)
        bulk_s += clock() - t0
        bulk_n += index.num_tokens
        context = list(prompt)
        for pos in range(0, len(responses[0]), chunk):
            t0 = clock()
            drafter.draft(index, context, cfg.gamma_max, 1)
            t1 = clock()
            drafter.draft(index, context, 4 * cfg.gamma_max, 4, cfg.gamma_max)
            t2 = clock()
            new = responses[0][pos : pos + chunk]
            index.append("own", new)
            stream_s, linear_s, tree_s = stream_s + clock() - t2, linear_s + t1 - t0, tree_s + t2 - t1
            stream_n, lookups = stream_n + len(new), lookups + 1
            context.extend(new)
        entries += index.memory_entries()
    us = 1e6
    return {"append_us_per_token_bulk": us * bulk_s / max(bulk_n, 1),
            "append_us_per_token_stream": us * stream_s / max(stream_n, 1),
            "lookup_us_linear": us * linear_s / max(lookups, 1), "lookup_us_k4": us * tree_s / max(lookups, 1),
            "index_entries_per_group": entries / max(len(groups), 1)}


def spec_replay_report(trace: str | Path | Sequence[TraceGroup], config: ReplayConfig | None = None,
                       limit: int | None = None, naive: bool = True) -> dict:
    """What ``seer bench spec --trace FILE`` reports: ours for every mode and drafter (``tau``, ``accept_rate``,
    ``tokens_per_step``), the naive baseline for the same ``n`` modes, counters and CPU seconds."""
    cfg = config or ReplayConfig()
    groups = list(trace) if not isinstance(trace, (str, Path)) else load_trace(trace, limit=limit)
    start = time.process_time()
    ours = replay_trace(groups, cfg)
    ours_s = time.process_time() - start
    report = {"trace": str(trace) if isinstance(trace, (str, Path)) else "<groups>", "groups": len(groups),
              "group_size": groups[0].group_size if groups else 0, "gamma_max": cfg.gamma_max,
              "tau": ours["tau"], "accept_rate": ours["accept_rate"], "tokens_per_step": ours["tokens_per_step"],
              "counters": ours["counters"], "cpu_s": {"ours": ours_s}}
    if naive:
        ns = [int(m[1:]) for m in cfg.modes if m != "interleaved" and int(m[1:]) > 0]
        start = time.process_time()
        report["naive"] = replay_naive(groups, ns, cfg.gamma_max)
        report["cpu_s"]["naive"] = time.process_time() - start
    report["speed"] = drafter_speed(groups[:10], cfg)
    return report
