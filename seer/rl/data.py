"""Prompts for training and the seeded groups of one iteration.

The data order is a pure function of (seed, cursor): epoch e visits the prompts in a permutation seeded by
(seed, e), and iteration k takes the next ``prompts_per_iter`` of that endless stream. Saving the cursor in a
checkpoint is then enough to resume on the very same prompts.

Sampling is seeded per response, from (seed, iteration, prompt, sibling index): the engine draws a seeded
request's random numbers from (seed, position) alone, so a response does not depend on batch composition or
on which instance ran it, and a resumed run samples what the uninterrupted run sampled. ``SeededGroup`` gives
each sibling its own seed (a plain ``GroupInput`` hands all siblings the group's one ``SamplingParams``, and
siblings with one seed would be identical).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from seer.rl.config import DataConfig, SamplingConfig
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams

_SYNTHETIC_WORDS = ("apple", "river", "stone", "cloud", "green", "seven", "light", "table", "music", "north")


@dataclass(frozen=True)
class Prompt:
    key: str
    question: str | None                      # rendered with the template + chat template
    messages: tuple[dict, ...] | None = None  # or a full chat, used as is
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SeededGroup(GroupInput):
    """A group whose sibling i samples with ``seeds[i]``."""

    seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.seeds) != self.size:
            raise ValueError(f"group {self.key}: {len(self.seeds)} seeds for group size {self.size}")

    def response_params(self, index: int) -> SamplingParams:
        return dataclasses.replace(super().response_params(index), seed=self.seeds[index])


def load_prompts(cfg: DataConfig, seed: int) -> list[Prompt]:
    """Every prompt of the configured source (``ValueError`` naming the file line for bad records)."""
    if cfg.source == "jsonl":
        prompts = _from_jsonl(cfg)
    elif cfg.source == "reasoning_gym":
        prompts = _from_reasoning_gym(cfg, seed)
    else:
        prompts = _synthetic(cfg, seed)
    if not prompts:
        raise ValueError(f"data source {cfg.source} gave no prompts")
    return prompts


def _from_jsonl(cfg: DataConfig) -> list[Prompt]:
    from pathlib import Path

    from seer.utils.io import read_jsonl

    prompts: list[Prompt] = []
    stem = Path(cfg.path or "").stem
    for lineno, rec in read_jsonl(cfg.path or ""):
        key = str(rec.get("id", f"{stem}-{lineno}"))
        meta = {"data_source": rec.get("data_source", stem), "answer": rec.get("answer"), "id": key}
        if "messages" in rec:
            prompts.append(Prompt(key, None, tuple(rec["messages"]), rec.get("answer"), meta))
        elif isinstance(rec.get("question", rec.get("prompt")), str):
            prompts.append(Prompt(key, rec.get("question", rec.get("prompt")), None, rec.get("answer"), meta))
        else:
            raise ValueError(f"{cfg.path}:{lineno}: needs a question, prompt or messages field")
        if cfg.limit is not None and len(prompts) >= cfg.limit:
            break
    return prompts


def _from_reasoning_gym(cfg: DataConfig, seed: int) -> list[Prompt]:
    import reasoning_gym

    try:
        dataset = reasoning_gym.create_dataset(cfg.task, size=cfg.size, seed=seed, **cfg.task_kwargs)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"data: reasoning-gym task {cfg.task!r} with {cfg.task_kwargs}: {err}") from None
    prompts = []
    for i, entry in enumerate(dataset):
        meta = {"data_source": cfg.task, "answer": entry["answer"], "entry": entry, "id": f"{cfg.task}-{i}"}
        prompts.append(Prompt(f"{cfg.task}-{i}", entry["question"], None, entry["answer"], meta))
    return prompts[: cfg.limit] if cfg.limit else prompts


def _synthetic(cfg: DataConfig, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    out = []
    for i in range(cfg.size):
        words = " ".join(rng.choice(_SYNTHETIC_WORDS) for _ in range(3))
        out.append(Prompt(f"synthetic-{i}", f"Say {words}.", None, None, {"data_source": "synthetic"}))
    return out


class PromptStream:
    """The endless, seeded order in which iterations take prompts; ``cursor`` counts prompts taken."""

    def __init__(self, prompts: list[Prompt], seed: int, shuffle: bool = True) -> None:
        if not prompts:
            raise ValueError("no prompts")
        self.prompts = prompts
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time is all a batch ever needs
        return self._orders[epoch]

    def take(self, cursor: int, n: int) -> list[Prompt]:
        n_prompts = len(self.prompts)
        return [self.prompts[self._order(c // n_prompts)[c % n_prompts]] for c in range(cursor, cursor + n)]


def render_prompt(prompt: Prompt, tokenizer: Any, cfg: DataConfig) -> list[int]:
    """Prompt token ids: template + optional system prompt through the model's chat template."""
    if prompt.messages is not None:
        messages = [dict(m) for m in prompt.messages]
    else:
        messages = [{"role": "user", "content": cfg.prompt_template.format(question=prompt.question)}]
        if cfg.system_prompt:
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def response_seed(seed: int, iteration: int, prompt_index: int, sibling: int, group_size: int) -> int:
    return ((seed * 1_000_003 + iteration) * 1_000_033 + prompt_index * group_size + sibling) % (2**62)


def make_groups(prompts: list[Prompt], tokenizer: Any, data: DataConfig, sampling: SamplingConfig, seed: int,
                iteration: int) -> list[SeededGroup]:
    """The groups of one iteration, every sibling with its own seed."""
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                            max_tokens=sampling.max_tokens)
    groups = []
    for p, prompt in enumerate(prompts):
        seeds = tuple(response_seed(seed, iteration, p, j, data.group_size) for j in range(data.group_size))
        groups.append(SeededGroup(tuple(render_prompt(prompt, tokenizer, data)), data.group_size, params,
                                  key=f"it{iteration}-{prompt.key}", metadata=dict(prompt.metadata), seeds=seeds))
    return groups
