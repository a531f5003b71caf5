"""Load recorded rollout traces (groups of sibling responses) into one in-memory shape.

Why: scheduling, drafting and the simulator are measured by replaying real RL-like workloads rather than a tiny
model sampled hot, whose siblings are barely alike. Two formats exist (``data/README.md``):

* token-id groups (``math_cot_groups.jsonl``): ``prompt_token_ids`` plus ``responses`` with ``token_ids``;
  these drive drafting replay and forced-token replay on the real engine;
* length-only groups (``castillo_*.jsonl.gz``): ``prompt_len`` plus ``output_lens``; these drive scheduling
  at scale.

Both become :class:`TraceGroup` objects whose responses always carry a ``length`` and, when known, the token ids.
A bad file fails loudly with the file name and line number: silently skipping a malformed group would bias
every benchmark built on it.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["TraceFormatError", "TraceResponse", "TraceGroup", "generation_limit", "load_trace", "parse_group",
           "sample_groups"]

# Keys consumed by the loader; every other key of a record is kept in ``TraceGroup.metadata``.
_STRUCTURAL_KEYS = frozenset({"group_id", "prompt_token_ids", "prompt_len", "responses", "output_lens"})


class TraceFormatError(ValueError):
    """A trace file does not follow one of the two documented formats."""


@dataclass(frozen=True)
class TraceResponse:
    """One recorded response: its token ids (token-id traces) or only its length (length-only traces)."""

    token_ids: tuple[int, ...] | None
    length: int
    text: str | None = None
    correct: bool | None = None


@dataclass(frozen=True)
class TraceGroup:
    """One prompt and its G sibling responses."""

    group_id: str
    prompt_token_ids: tuple[int, ...] | None
    prompt_len: int
    responses: tuple[TraceResponse, ...]
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def group_size(self) -> int:
        return len(self.responses)

    @property
    def has_token_ids(self) -> bool:
        return self.prompt_token_ids is not None and all(r.token_ids is not None for r in self.responses)


def _token_ids(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list of token ids, got {type(value).__name__}")
    for tok in value:
        if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
            raise ValueError(f"{what} contains {tok!r}, not a non-negative integer token id")
    return tuple(value)


def _length(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} is negative ({value})")
    return value


def _token_responses(raw: Any) -> tuple[TraceResponse, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'responses' must be a non-empty list")
    out = []
    for i, resp in enumerate(raw):
        if not isinstance(resp, dict) or "token_ids" not in resp:
            raise ValueError(f"responses[{i}] has no 'token_ids'")
        ids = _token_ids(resp["token_ids"], f"responses[{i}].token_ids")
        correct = resp.get("correct")
        if correct is not None and not isinstance(correct, bool):
            raise ValueError(f"responses[{i}].correct must be true/false, got {correct!r}")
        text = resp.get("text")
        out.append(TraceResponse(token_ids=ids, length=len(ids), text=text, correct=correct))
    return tuple(out)


def _length_responses(raw: Any) -> tuple[TraceResponse, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'output_lens' must be a non-empty list")
    return tuple(TraceResponse(None, _length(n, f"output_lens[{i}]")) for i, n in enumerate(raw))


def parse_group(record: Any) -> TraceGroup:
    """Turn one decoded JSON record into a TraceGroup; raises ValueError describing what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
    if "group_id" not in record:
        raise ValueError("missing field 'group_id'")
    group_id = str(record["group_id"])
    metadata = {k: v for k, v in record.items() if k not in _STRUCTURAL_KEYS}
    if "responses" in record:
        if "prompt_token_ids" not in record:
            raise ValueError(f"group {group_id!r}: missing field 'prompt_token_ids'")
        prompt = _token_ids(record["prompt_token_ids"], "prompt_token_ids")
        if "prompt_len" in record and _length(record["prompt_len"], "prompt_len") != len(prompt):
            raise ValueError(f"group {group_id!r}: prompt_len {record['prompt_len']} != len(prompt_token_ids)")
        responses = _token_responses(record["responses"])
        return TraceGroup(group_id, prompt, len(prompt), responses, metadata)
    if "output_lens" in record:
        if "prompt_len" not in record:
            raise ValueError(f"group {group_id!r}: missing field 'prompt_len'")
        prompt_len = _length(record["prompt_len"], "prompt_len")
        return TraceGroup(group_id, None, prompt_len, _length_responses(record["output_lens"]), metadata)
    raise ValueError(f"group {group_id!r}: missing field 'responses' (token-id format) or 'output_lens' (length-only)")


def _open_lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
        yield from fh


def _iter_groups(path: Path, limit: int | None) -> Iterator[TraceGroup]:
    group_size: int | None = None
    count = 0
    for lineno, line in enumerate(_open_lines(path), start=1):
        if limit is not None and count >= limit:
            return
        if not line.strip():
            continue
        try:
            group = parse_group(json.loads(line))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from exc
        except ValueError as exc:
            raise TraceFormatError(f"{path}:{lineno}: {exc}") from exc
        if group_size is None:
            group_size = group.group_size
        elif group.group_size != group_size:
            raise TraceFormatError(
                f"{path}:{lineno}: group {group.group_id!r} has {group.group_size} responses, "
                f"but earlier groups have {group_size}"
            )
        count += 1
        yield group


def load_trace(
    path: str | Path, limit: int | None = None, sample: int | None = None, seed: int = 0
) -> list[TraceGroup]:
    """Read a trace file (``.jsonl`` or ``.jsonl.gz``).

    ``limit`` keeps the first ``limit`` groups of the file; ``sample`` then draws that many groups at random
    (seeded, without replacement, file order kept). Every read line is validated.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    for name, value in (("limit", limit), ("sample", sample)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return sample_groups(list(_iter_groups(path, limit)), sample, seed)


def sample_groups(groups: list[TraceGroup], sample: int | None, seed: int = 0) -> list[TraceGroup]:
    """``sample`` groups drawn at random (seeded, without replacement, order kept); all of them when None."""
    if sample is None or sample >= len(groups):
        return groups
    picked = sorted(random.Random(seed).sample(range(len(groups)), sample))
    return [groups[i] for i in picked]


def generation_limit(groups: list[TraceGroup]) -> int:
    """The ``max_tokens`` the trace was generated with: its records' ``max_tokens`` field where they carry one
    (the largest), else the next power of two at or above the longest recorded response, the usual form of a
    generation limit. Computed over a whole trace, not a sample of it, so every sample and every policy of a run
    gets the one limit an RL run would set, and no response's recorded length leaks into it."""
    declared = [g.metadata["max_tokens"] for g in groups if isinstance(g.metadata.get("max_tokens"), int)]
    if declared:
        return max(declared)
    longest = max((r.length for g in groups for r in g.responses), default=1)
    return 1 << max(0, longest - 1).bit_length()
