"""What `seer bench rollout` (and so `make demo`) prints: a line per policy, the setup, the side-by-side table, the
report's paths and how to read it; the whole JSON only with --print-json, and the --json file either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seer.bench.rollout_bench import HOW_TO_READ, policy_line, report_text, setup_line
from seer.cli.main import main
from tests.bench.helpers import write_token_trace
from tests.conftest import TinyModelDir


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: TinyModelDir) -> Path:
    return tiny_model_dir("qwen2", 3)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four groups of eight token-id responses (ids below the tiny vocabulary)."""
    return write_token_trace(tmp_path / "trace.jsonl", 4, 20)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEER_CACHE", str(tmp_path / "cache"))  # the verify-cost profile lands here


def bench(tiny: Path, trace: Path, *extra: str) -> int:
    return main(["bench", "rollout", "--model", str(tiny), "--trace", str(trace), "--policies", "verl,seer",
                 "--instances", "2", "--dtype", "float32", "--threads", "1", "--chunk-tokens", "8",
                 "--kv-fraction", "1.0", *extra])


def test_a_run_prints_the_table_and_paths_not_the_json(tiny: Path, trace: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "demo" / "report.json"
    assert bench(tiny, trace, "--json", str(out)) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert not any(line.lstrip().startswith(("{", "}", '"')) for line in lines)  # no JSON on stdout
    assert len(lines) <= 14
    assert lines[0].startswith("verl done: makespan ") and lines[1].startswith("seer done: makespan ")
    assert "4 groups, 32 responses of trace.jsonl, 2 instances (inprocess)" in printed
    table = lines.index(next(line for line in lines if line.startswith("policy")))
    assert lines[table].split() == ["policy", "makespan", "s", "tail", "s", "tok/s", "vs", "verl", "preempt",
                                    "tau", "/", "bound"]
    assert lines[table + 2].split()[0] == "verl" and lines[table + 2].split()[4] == "1.00x"
    assert lines[table + 3].split()[0] == "seer"
    assert f"report: {out}, plot {out.with_suffix('.png')} (--print-json prints the JSON too)" in lines
    assert lines[-1] == HOW_TO_READ
    doc = json.loads(out.read_text())  # the file holds the whole report, as before
    assert list(doc["policies"]) == ["verl", "seer"] and "bound" in doc and "machine" in doc["setup"]
    assert doc["bound"]["longest_tau"] >= 1.0 and "per_request" not in doc["policies"]["seer"]["spec"]
    assert all(row["makespan_s"] >= doc["bound"]["bound_s"] for row in doc["policies"].values())
    assert out.with_suffix(".png").stat().st_size > 0


def test_print_json_adds_the_whole_report(tiny: Path, trace: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    assert bench(tiny, trace, "--json", str(out), "--print-json") == 0
    printed = capsys.readouterr().out
    start, end = printed.index("\n{\n") + 1, printed.index("\n}\n") + 2
    shown = json.loads(printed[start:end])
    assert shown == json.loads(out.read_text())
    assert f"report: {out}, plot {out.with_suffix('.png')}\n" in printed
    assert printed.rstrip().endswith(HOW_TO_READ)


def test_samples_print_json_prints_the_file(tiny: Path, trace: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s.json"
    assert bench(tiny, trace, "--sample", "2", "--samples", "1", "--json", str(out), "--print-json") == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(out.read_text().rstrip())


def report(**extra: object) -> dict:
    row = {"makespan_s": 40.8, "throughput_tok_s": 150.0, "tail_s": 19.8, "p90_s": 21.0, "preemptions": 12}
    seer = dict(row, makespan_s=30.5, throughput_tok_s=200.0, tail_s=8.2, preemptions=0, spec={"tau": 2.5})
    setup = {"trace": "data/math_cot_groups.jsonl", "groups": 16, "responses": 128, "instances": 2,
             "backend": "local", "length_scale": 0.64, "kv_budget": {"kv_tokens_per_instance": 3072},
             "machine": {"dtype": "bfloat16", "cpu": {"model": "AMD EPYC"}}}
    return {"policies": {"verl": row, "seer": seer}, "bound": {"bound_s": 15.0}, "setup": setup, **extra}


def test_report_text_lines() -> None:
    text = report_text(report(), "runs/demo/report.json", Path("runs/demo/report.png"))
    lines = text.splitlines()
    assert lines[0] == ("16 groups, 128 responses of math_cot_groups.jsonl (lengths x0.64), 2 instances (local), "
                        "KV 3,072 tokens each, bfloat16 on AMD EPYC")
    assert lines[3].split() == ["verl", "40.8", "19.8", "150", "1.00x", "12", "-", "2.72"]
    assert lines[4].split() == ["seer", "30.5", "8.2", "200", "1.33x", "0", "2.50", "2.03"]
    assert lines[5] == "bound: 15.0 s (the makespan no policy can beat)"
    assert lines[6] == "report: runs/demo/report.json, plot runs/demo/report.png (--print-json prints the JSON too)"
    assert lines[7] == HOW_TO_READ and len(lines) == 8
    assert "report: not written" in report_text(report(), None, None)
    failed = report_text(report(errors={"vllm": "vllm venv missing\nrun scripts/setup_vllm_peer.sh"}), None, None)
    assert "vllm: failed (vllm venv missing)" in failed.splitlines()
    assert policy_line("verl", report()["policies"]["verl"]) == \
        "verl done: makespan 40.8 s, tail 19.8 s, 150 tok/s, 12 preemptions"


def test_setup_line_without_scale_or_machine() -> None:
    setup = {"trace": "t.jsonl", "groups": 2, "responses": 16, "instances": 1, "backend": "inprocess",
             "length_scale": 1.0}
    assert setup_line(setup) == "2 groups, 16 responses of t.jsonl, 1 instance (inprocess)"
