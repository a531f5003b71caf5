"""Trace loader: both formats, gzip, limit/sample, and every documented error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from seer.data.traces import TraceFormatError, TraceGroup, load_trace

REPO = Path(__file__).resolve().parents[2]
MATH_COT = REPO / "data" / "math_cot_groups.jsonl"
CASTILLO = REPO / "data" / "castillo_sample.jsonl.gz"


def _token_record(gid: str, n: int = 2) -> dict:
    return {
        "group_id": gid,
        "prompt_token_ids": [1, 2, 3],
        "question": "q",
        "responses": [{"text": "t", "token_ids": [4, 5, i], "correct": i % 2 == 0} for i in range(n)],
    }


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_token_format_roundtrip(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [json.dumps(_token_record("a")), "", json.dumps(_token_record("b"))])
    groups = load_trace(path)
    assert [g.group_id for g in groups] == ["a", "b"]
    g = groups[0]
    assert g.prompt_token_ids == (1, 2, 3) and g.prompt_len == 3 and g.group_size == 2
    assert g.responses[1].token_ids == (4, 5, 1) and g.responses[1].length == 3
    assert g.responses[0].correct is True and g.responses[1].correct is False
    assert g.metadata == {"question": "q"} and g.has_token_ids


def test_length_format_gzip(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl.gz"
    rec = {"group_id": "x", "prompt_len": 7, "output_lens": [3, 0, 9], "model": "m"}
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(rec) + "\n")
    (g,) = load_trace(path)
    assert g.prompt_token_ids is None and g.prompt_len == 7
    assert [r.length for r in g.responses] == [3, 0, 9] and g.responses[0].token_ids is None
    assert g.metadata["model"] == "m" and not g.has_token_ids


def test_real_files() -> None:
    groups = load_trace(MATH_COT)
    assert len(groups) == 50 and all(g.group_size == 8 and g.has_token_ids for g in groups)
    assert all(r.token_ids[-1] == 151645 for g in groups for r in g.responses)
    castillo = load_trace(CASTILLO, limit=100)
    assert len(castillo) == 100 and castillo[0].group_size == 10


def test_limit_and_sample(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [json.dumps(_token_record(str(i))) for i in range(20)])
    assert [g.group_id for g in load_trace(path, limit=3)] == ["0", "1", "2"]
    a = load_trace(path, sample=5, seed=1)
    assert len(a) == 5 and [g.group_id for g in a] == [g.group_id for g in load_trace(path, sample=5, seed=1)]
    ids = [int(g.group_id) for g in a]
    assert ids == sorted(ids)
    assert len(load_trace(path, limit=4, sample=10)) == 4
    with pytest.raises(ValueError):
        load_trace(path, limit=-1)


def test_frozen(tmp_path: Path) -> None:
    (g,) = load_trace(_write(tmp_path / "t.jsonl", [json.dumps(_token_record("a"))]))
    assert isinstance(g, TraceGroup)
    with pytest.raises(AttributeError):
        g.group_id = "b"  # type: ignore[misc]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_trace(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("{not json", "malformed JSON"),
        (json.dumps({"prompt_token_ids": [1], "responses": [{"token_ids": [1]}]}), "group_id"),
        (json.dumps({"group_id": "g", "responses": [{"token_ids": [1]}]}), "prompt_token_ids"),
        (json.dumps({"group_id": "g", "prompt_token_ids": [1], "responses": []}), "non-empty"),
        (json.dumps({"group_id": "g", "prompt_token_ids": [1], "responses": [{"text": "x"}]}), "token_ids"),
        (json.dumps({"group_id": "g", "prompt_token_ids": [1], "responses": [{"token_ids": [-3]}]}), "-3"),
        (json.dumps({"group_id": "g", "prompt_len": 3, "output_lens": [4, -1]}), "negative"),
        (json.dumps({"group_id": "g", "prompt_len": -3, "output_lens": [4]}), "negative"),
        (json.dumps({"group_id": "g", "output_lens": [4]}), "prompt_len"),
        (json.dumps({"group_id": "g", "prompt_len": 3, "output_lens": []}), "non-empty"),
        (json.dumps({"group_id": "g", "prompt_len": 3}), "output_lens"),
        (json.dumps([1, 2]), "JSON object"),
    ],
)
def test_format_errors_name_file_and_line(tmp_path: Path, bad: str, needle: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [json.dumps(_token_record("ok")), bad])
    with pytest.raises(TraceFormatError, match=needle) as info:
        load_trace(path)
    assert "bad.jsonl:2" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_inconsistent_group_size(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.jsonl", [json.dumps(_token_record("a", 2)), json.dumps(_token_record("odd", 3))])
    with pytest.raises(TraceFormatError, match="'odd'") as info:
        load_trace(path)
    assert "g.jsonl:2" in str(info.value)
