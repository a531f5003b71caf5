"""Reward scorers: ``RewardInput -> float``. The registry and the error/timeout handling live in ``rewards``.

- ``math_verify``: GSM8K / MATH answers with HuggingFace's math-verify (the reference wrapped in ``\\boxed{}``,
  the response parsed for boxed or plain LaTeX / expressions, compared symbolically). math-verify's own
  timeouts use ``signal.alarm``, which only works on the main thread; off it (our timeout runner calls scorers
  in a worker thread) they are switched off and the runner's deadline applies instead.
- ``reasoning_gym``: the task's own scorer on the extracted answer (``<answer>`` tag as reasoning-gym prompts
  ask for, else the last number in the text, which is how small instruct models answer arithmetic).
- ``token_fraction``: fraction of response tokens equal to a target token; a synthetic reward a tiny
  random-weight model can learn in a few iterations (tests, smoke runs).
- ``custom``: a user function by path with verl's signature
  ``compute_score(data_source, solution_str, ground_truth, extra_info)``, returning a number or a dict with
  ``"score"``.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class RewardInput:
    """One response to score: its decoded text, token ids and the prompt's metadata (answer, data_source...)."""

    text: str
    token_ids: tuple[int, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> Any:
        return self.metadata.get("answer")


Scorer = Callable[[RewardInput], float]


class MathVerifyScorer:
    def __init__(self, timeout_s: int = 5) -> None:
        import math_verify  # noqa: F401  (fail at construction, not at the first response)
        self.timeout_s = timeout_s

    def __call__(self, sample: RewardInput) -> float:
        from math_verify import parse, verify

        if sample.answer is None:
            raise ValueError("math_verify needs a reference 'answer' in the prompt's metadata")
        timeout = self.timeout_s if threading.current_thread() is threading.main_thread() else None
        gold = parse(f"\\boxed{{{sample.answer}}}", parsing_timeout=timeout)
        if not gold:
            raise ValueError(f"cannot parse the reference answer {sample.answer!r}")
        pred = parse(sample.text, parsing_timeout=timeout)
        return 1.0 if pred and verify(gold, pred, timeout_seconds=timeout) else 0.0


def extract_final_answer(text: str, mode: str = "answer_tag_or_last_number") -> str | None:
    """The answer a response states: inside ``<answer>...</answer>`` and/or the last number in the text."""
    if mode not in ("answer_tag", "last_number", "answer_tag_or_last_number"):
        raise ValueError(f"unknown answer extraction {mode!r}")
    if mode != "last_number":
        tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
        if tagged:
            return tagged[-1].strip()
        if mode == "answer_tag":
            return None
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


class ReasoningGymScorer:
    def __init__(self, extract: str = "answer_tag_or_last_number") -> None:
        import reasoning_gym  # noqa: F401
        extract_final_answer("", extract)  # validates the mode
        self.extract = extract

    def __call__(self, sample: RewardInput) -> float:
        import reasoning_gym

        entry = sample.metadata.get("entry")
        if not isinstance(entry, Mapping):
            raise ValueError("reasoning_gym needs the task entry in the prompt's metadata (data.source "
                             "reasoning_gym provides it)")
        answer = extract_final_answer(sample.text, self.extract)
        if answer is None:
            return 0.0
        score_fn = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
        return float(score_fn(answer, entry))


class TokenFractionScorer:
    def __init__(self, token_id: int) -> None:
        self.token_id = int(token_id)

    def __call__(self, sample: RewardInput) -> float:
        if not sample.token_ids:
            return 0.0
        return sum(t == self.token_id for t in sample.token_ids) / len(sample.token_ids)


def load_user_function(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:compute_score`` -> the function (clear errors for a bad path or name)."""
    path_s, sep, name = spec.rpartition(":")
    if not sep or not path_s or not name:
        raise ValueError(f"reward function {spec!r} must look like path/to/file.py:function_name")
    path = Path(path_s)
    if not path.is_file():
        raise FileNotFoundError(f"reward function file {path_s!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"seer_user_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"cannot import {path_s!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path_s} has no function {name!r}")
    return fn


class CustomScorer:
    def __init__(self, function: str, data_source: str = "") -> None:
        self.fn = load_user_function(function)
        self.data_source = data_source

    def __call__(self, sample: RewardInput) -> float:
        meta = dict(sample.metadata)
        data_source = meta.get("data_source", self.data_source)
        result = self.fn(data_source, sample.text, meta.get("answer"), meta)
        if isinstance(result, Mapping):
            if "score" not in result:
                raise ValueError(f"the reward function returned a dict without 'score': {sorted(result)}")
            result = result["score"]
        return float(result)
