"""The engine benchmark workload: same prompt ids for every peer, JSON-serializable, validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seer.bench.workloads import (
    FIXED_SAMPLING,
    NUM_PROMPTS,
    SAMPLED_SAMPLING,
    engine_workload,
    load_gsm8k_questions,
    load_workload,
    save_workload,
    subset,
    validate_workload,
)
from seer.models.tokenizer import Tokenizer
from tests.models.helpers import write_tiny_tokenizer


@pytest.fixture
def tok_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tok"
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture
def gsm8k(tmp_path: Path) -> Path:
    path = tmp_path / "gsm8k.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_default_gsm8k_has_the_32_benchmark_questions() -> None:
    records = load_gsm8k_questions()
    assert len(records) == NUM_PROMPTS
    assert records[0]["id"] == "gsm8k_test-0" and records[0]["question"].startswith("Janet")
    assert len({r["question"] for r in records}) == NUM_PROMPTS


def test_workload_shape_and_settings(tok_dir: Path, gsm8k: Path) -> None:
    workload = engine_workload(tok_dir, num_prompts=4, n=8, gsm8k_path=gsm8k)
    assert workload["n"] == 8
    assert workload["fixed"] == {"max_tokens": 256, "ignore_eos": True, "temperature": 1.0} == FIXED_SAMPLING
    assert workload["sampled"] == {"temperature": 1.0, "max_tokens": 512} == SAMPLED_SAMPLING
    assert workload["source"]["ids"] == ["q0", "q1", "q2", "q3"]
    assert json.loads(json.dumps(workload)) == workload


def test_prompts_are_the_chat_template_rendering(tok_dir: Path, gsm8k: Path) -> None:
    workload = engine_workload(tok_dir, num_prompts=3, gsm8k_path=gsm8k)
    tok = Tokenizer.from_dir(tok_dir)
    for i, ids in enumerate(workload["prompts"]):
        text = tok.decode(ids, skip_special_tokens=False)
        assert text.startswith("<|im_start|>system\n")
        assert f"<|im_start|>user\nWhat is {i} + {i}?<|im_end|>\n" in text
        assert text.endswith("<|im_start|>assistant\n")


def test_too_few_questions_is_an_error(tok_dir: Path, gsm8k: Path) -> None:
    with pytest.raises(ValueError, match="only 6 questions, 7 requested"):
        engine_workload(tok_dir, num_prompts=7, gsm8k_path=gsm8k)


def test_bad_n_is_an_error(tok_dir: Path, gsm8k: Path) -> None:
    with pytest.raises(ValueError, match="n must be positive"):
        engine_workload(tok_dir, num_prompts=2, n=0, gsm8k_path=gsm8k)


def test_subset_keeps_settings_and_says_so(tok_dir: Path, gsm8k: Path) -> None:
    workload = engine_workload(tok_dir, num_prompts=5, gsm8k_path=gsm8k)
    small = subset(workload, 2)
    assert small["prompts"] == workload["prompts"][:2] and small["n"] == workload["n"]
    assert small["source"]["subset_of_prompts"] == "first 2 of 5"
    assert len(workload["prompts"]) == 5  # the original is untouched
    with pytest.raises(ValueError, match="num_prompts must be in 1..5"):
        subset(workload, 6)


def test_save_load_roundtrip_and_validation(tok_dir: Path, gsm8k: Path, tmp_path: Path) -> None:
    workload = engine_workload(tok_dir, num_prompts=2, gsm8k_path=gsm8k)
    path = tmp_path / "w.json"
    save_workload(workload, path)
    assert load_workload(path) == workload
    broken = dict(workload, prompts=[[1, "x"]])
    with pytest.raises(ValueError, match=r"prompts'\]\[0\] must be a non-empty list of ints"):
        validate_workload(broken)
    with pytest.raises(ValueError, match="'fixed'"):
        validate_workload({k: v for k, v in workload.items() if k != "fixed"})
