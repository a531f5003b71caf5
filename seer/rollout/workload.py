"""Rollout inputs: groups from a prompts file (real sampling) or from a trace (replay on the real engine).

Trace replay keeps the real compute and the real scheduling problem while the responses come from a recording:
token-id traces replay the recorded tokens (forced), so drafting sees real sibling text; length-only traces use
random prompt tokens of the recorded prompt length and sample real tokens until the recorded length (EOS
ignored, the recorded length acting as the EOS). ``length_scale`` shrinks prompts and responses alike (a prompt
keeps its last tokens) and ``max_len`` caps response lengths, so CPU runs stay short and keep the workload's
prompt/response proportions; token ids outside the model's vocabulary are folded into it (id mod vocab), which
keeps equal tokens equal.

Replay is as blind as production. Every group gets the run's one ``max_tokens``: ``max_tokens`` when given, else
``max_len``, else the trace's generation limit (``generation_limit``: a field of the trace, or the next power of
two at or above its longest response, over the whole file) scaled like the lengths; responses recorded longer are
cut there (finish reason ``length``). Nothing derived from a sample's own lengths sets it: the longest response
of the sample as the budget handed the scheduler the runaway's length, and a per-group cap every group's. The
recorded end of a response reaches the engine only as an EOS at that position. Every group carries a seed derived
from the run's (``group_seed``), so length-only replay samples the same tokens under every policy.
Length-only groups are sampled with the settings the trace recorded for them (CASTILLO keeps each group's
temperature, top_p and top_k) unless ``temperature`` overrides them: siblings' similarity, and with it what
grouped drafting can gain, depends on them as much as on the prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

from seer.data.traces import TraceGroup, generation_limit, load_trace, sample_groups
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams, group_seed
from seer.utils.io import read_jsonl


@dataclass(frozen=True)
class ReplayOptions:
    length_scale: float = 1.0
    max_len: int | None = None
    max_tokens: int | None = None  # the run's budget per response (None: max_len, else the trace's limit, scaled)
    max_prompt_len: int | None = 512
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    temperature: float | None = None  # None: each group's recorded settings, else 1.0

    def __post_init__(self) -> None:
        if not 0 < self.length_scale <= 1.0:
            raise ValueError(f"length_scale must be in (0, 1], got {self.length_scale}")
        for name in ("max_len", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    def sampling(self, meta: dict, max_tokens: int, ignore_eos: bool, seed: int | None) -> SamplingParams:
        """The override temperature (top_p 1, no top_k), else the group's recorded settings, else T=1."""
        if self.temperature is not None:
            return SamplingParams(temperature=self.temperature, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                  seed=seed)
        try:
            return SamplingParams(temperature=float(meta.get("temperature", 1.0)),
                                  top_p=float(meta.get("top_p", 1.0)), top_k=int(meta.get("top_k", -1)),
                                  max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed)
        except (TypeError, ValueError) as err:
            group = meta.get("trace_group")
            raise ValueError(f"trace group {group!r}: bad recorded sampling settings: {err}") from None

    def scale(self, n: int) -> int:
        n = max(1, round(n * self.length_scale))
        return min(n, self.max_len) if self.max_len else n

    def budget(self, trace_limit: int) -> int:
        """The run's ``max_tokens``: given, else ``max_len``, else the trace's generation limit scaled."""
        return self.max_tokens or self.max_len or max(1, round(trace_limit * self.length_scale))


def groups_from_trace(path: str | Path, vocab_size: int, opts: ReplayOptions) -> list[GroupInput]:
    everything = load_trace(path, limit=opts.limit)
    cap = opts.budget(generation_limit(everything))
    trace = sample_groups(everything, opts.sample, opts.seed)
    rng = random.Random(opts.seed)
    return [_group_from_trace(g, vocab_size, opts, rng, cap, group_seed(opts.seed, 0, i))
            for i, g in enumerate(trace)]


def _group_from_trace(g: TraceGroup, vocab: int, opts: ReplayOptions, rng: random.Random, cap: int,
                      seed: int | None) -> GroupInput:
    lengths = tuple(min(opts.scale(r.length), cap) for r in g.responses)
    plen = max(1, round(g.prompt_len * opts.length_scale))
    plen = min(plen, opts.max_prompt_len or plen)
    if g.prompt_token_ids is not None:
        prompt = tuple(t % vocab for t in g.prompt_token_ids[-plen:])
    else:
        prompt = tuple(rng.randrange(vocab) for _ in range(max(1, plen)))
    meta = {"trace_group": g.group_id, **{k: v for k, v in g.metadata.items() if isinstance(v, (str, int, float))}}
    if g.has_token_ids:
        forced = tuple(tuple(t % vocab for t in (r.token_ids or ())[:n]) for r, n in zip(g.responses, lengths))
        sp = opts.sampling(meta, cap, ignore_eos=False, seed=seed)
        return GroupInput(prompt, g.group_size, sp, key=g.group_id, forced=forced, true_lengths=lengths,
                          metadata=meta)
    sp = opts.sampling(meta, cap, ignore_eos=True, seed=seed)
    return GroupInput(prompt, g.group_size, sp, key=g.group_id, true_lengths=lengths, stop_lengths=lengths,
                      metadata=meta)


def groups_from_prompts(path: str | Path, tokenizer, group_size: int, params: SamplingParams,
                        limit: int | None = None) -> list[GroupInput]:
    """Prompts JSONL (``question``/``prompt``/``messages``/``prompt_token_ids``, optional ``answer``)."""
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    groups: list[GroupInput] = []
    for lineno, rec in read_jsonl(path):
        if "prompt_token_ids" in rec:
            ids = [int(t) for t in rec["prompt_token_ids"]]
        elif "messages" in rec:
            ids = tokenizer.apply_chat_template(rec["messages"], add_generation_prompt=True)
        elif "question" in rec or "prompt" in rec:
            text = rec.get("question", rec.get("prompt"))
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}:{lineno}: empty question/prompt")
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            raise ValueError(f"{path}:{lineno}: needs one of question, prompt, messages, prompt_token_ids")
        meta = {k: rec[k] for k in ("id", "answer", "question", "data_source") if k in rec}
        seeded = replace(params, seed=group_seed(params.seed, 0, len(groups)))
        groups.append(GroupInput(tuple(ids), group_size, seeded, key=str(rec.get("id", lineno)), metadata=meta))
        if limit is not None and len(groups) >= limit:
            break
    if not groups:
        raise ValueError(f"{path}: no prompts (the file is empty)")
    return groups
