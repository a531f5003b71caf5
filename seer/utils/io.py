"""Files the library reads and writes: the cache directory, JSON reports, JSONL records with line numbers.

Why here and not in the CLI: the rollout workloads, the trainer, the simulator's calibration and the engine's
profile cache all need them, and the library must not import its command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where prepared models and measured profiles are kept: ``$SEER_CACHE``, default ``~/.cache/seer``."""
    env = os.environ.get("SEER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "seer"


def write_json(path: str | Path | None, report: dict[str, Any]) -> None:
    """Write ``report`` as indented JSON (parent directories created); nothing when ``path`` is None."""
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
