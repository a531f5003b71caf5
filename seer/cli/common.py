"""Small helpers shared by the CLI verbs: JSON reports, JSONL prompt files, default model resolution."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("SEER_CACHE", Path.home() / ".cache" / "seer"))


def resolve_model(name_or_path: str | None) -> Path:
    """A directory path as is; a known model name maps to its prepared folder (prepared on first use)."""
    name = name_or_path or DEFAULT_MODEL
    path = Path(name)
    if path.is_dir():
        return path
    from seer.models.prepare import KNOWN_MODELS, prepare_model
    if name in KNOWN_MODELS:
        return prepare_model(name)
    raise FileNotFoundError(f"model {name!r} is neither a directory nor a known model name "
                            f"(known: {', '.join(sorted(KNOWN_MODELS))})")


def write_json(path: str | Path | None, report: dict[str, Any]) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, record); a malformed line raises ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file {str(path)!r} does not exist")
    with path.open() as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({err.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec
