"""`seer bench rollout --samples K`: the real CLI path on a tiny random model and a tiny token-id trace records
every sample, resumes after the recorded ones, refuses a file of another setup; the summary's medians and worsts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from seer.bench import rollout_bench
from seer.bench.rollout_samples import recorded_samples, summarize
from seer.cli.main import main
from tests.bench.helpers import write_token_trace
from tests.conftest import TinyModelDir


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: TinyModelDir) -> Path:
    return tiny_model_dir("qwen2", 3)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Six groups of eight token-id responses (ids below the tiny vocabulary), lengths spread so tails show."""
    return write_token_trace(tmp_path / "trace.jsonl", 6, 24)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEER_CACHE", str(tmp_path / "cache"))  # the verify-cost profile lands here


def bench(tiny: Path, trace: Path, out: Path, samples: int, policies: str = "verl,context",
          extra: tuple[str, ...] = ()) -> int:
    return main(["bench", "rollout", "--model", str(tiny), "--trace", str(trace), "--sample", "2",
                 "--samples", str(samples), "--policies", policies, "--instances", "2", "--dtype", "float32",
                 "--threads", "1", "--chunk-tokens", "8", "--json", str(out), *extra])


def count_samples(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the one-sample runs (each appends its seed)."""
    seeds: list[int] = []
    real = rollout_bench.run_sample

    def counted(args, model, groups):  # noqa: ANN001, ANN202
        seeds.append(args.seed)
        return real(args, model, groups)

    monkeypatch.setattr(rollout_bench, "run_sample", counted)
    return seeds


def test_samples_record_resume_and_refuse(tiny: Path, trace: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    seeds = count_samples(monkeypatch)
    assert bench(tiny, trace, out, samples=2) == 0
    assert seeds == [0, 1]
    doc = json.loads(out.read_text())
    assert doc["setup"]["samples"] == 2 and doc["setup"]["seeds"] == [0, 1] and doc["setup"]["sample"] == 2
    assert [s["setup"]["seed"] for s in doc["samples"]] == [0, 1]
    assert all(list(s["policies"]) == ["verl", "context"] for s in doc["samples"])
    summary = doc["summary"]
    assert summary["samples"] == 2 and summary["baseline"] == "verl"
    for name, pol in summary["policies"].items():
        speedups = [round(s["speedup_vs_verl"][name], 4) for s in doc["samples"]]
        over = [s["makespan_over_bound"][name] for s in doc["samples"]]
        assert pol["per_sample"]["speedup"] == speedups
        assert pol["median"]["speedup"] == pytest.approx(statistics.median(speedups), abs=1e-4)
        assert pol["worst"]["speedup"] == min(speedups)
        assert pol["worst"]["makespan_over_bound"] == max(over)
    assert summary["policies"]["verl"]["median"]["speedup"] == 1.0
    for report in doc["samples"]:  # what else ran beside each policy, recorded with it (Linux: /proc)
        for row in report["policies"].values():
            load = row["machine_load"]
            assert load["cpus"] >= 1 and load["others_cpus"] >= 0 and load["wall_s"] > 0
    others = [r["machine_load"]["others_cpus"] for s in doc["samples"] for r in s["policies"].values()]
    assert max(summary["policies"][n]["worst"]["others_cpus"] for n in summary["policies"]) == round(max(others), 4)
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "sample 1/2 (seed 0): 2 groups, 16 responses" in printed and "speedup med" in printed

    assert bench(tiny, trace, out, samples=3) == 0  # resumes: only the third sample runs
    assert seeds == [0, 1, 2]
    again = json.loads(out.read_text())
    assert again["samples"][:2] == doc["samples"] and len(again["samples"]) == 3
    assert again["setup"]["seeds"] == [0, 1, 2] and again["summary"]["samples"] == 3
    assert "2 sample(s) already recorded" in capsys.readouterr().out

    before = out.read_bytes()
    assert bench(tiny, trace, out, samples=3, policies="verl,seer") == 2  # another setup: refused, file kept
    err = capsys.readouterr().err
    assert "policies" in err and "pick another --json path" in err
    assert out.read_bytes() == before and seeds == [0, 1, 2]


def test_interleaved_policies_take_turns_and_record_alike(tiny: Path, trace: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "turns.json"
    assert bench(tiny, trace, out, samples=1, extra=("--interleave",)) == 0
    doc = json.loads(out.read_text())
    assert doc["setup"]["interleave"] is True
    rows = doc["samples"][0]["policies"]
    assert list(rows) == ["verl", "context"]  # the order asked for, whichever finished first
    assert rows["verl"]["num_responses"] == rows["context"]["num_responses"] == 16
    assert rows["verl"]["generated_tokens"] == rows["context"]["generated_tokens"]  # forced tokens: the same work
    assert all(row["makespan_s"] > 0 and "machine_load" in row for row in rows.values())
    assert bench(tiny, trace, out, samples=2) == 2  # taking turns or not is part of the setup: not resumed
    assert "interleave" in capsys.readouterr().err
    assert bench(tiny, trace, tmp_path / "local.json", samples=1, extra=("--interleave", "--backend", "local")) == 2
    assert "--interleave" in capsys.readouterr().err and not (tmp_path / "local.json").exists()


@pytest.mark.parametrize("extra, message", [
    (["--samples", "2"], "--samples needs --sample N"),
    (["--samples", "0", "--sample", "2"], "--samples must be >= 1"),
    (["--samples", "2", "--sample", "2"], "--samples needs --json"),
    (["--samples", "2", "--sample", "2", "--json", "r.json", "--peer", "vllm"],
     "--peer cannot be combined with --samples"),
])
def test_bad_samples_arguments_are_user_errors(extra: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "rollout", "--trace", str(tmp_path / "t.jsonl"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_single_sample_report_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"policies": {}, "setup": {}}))
    with pytest.raises(ValueError, match="not a --samples report"):
        recorded_samples(path, {"trace": "t"})


def test_a_flag_an_older_file_did_not_record_must_be_at_its_default(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"setup": {"trace": "t", "sample": 4}, "samples": [{"x": 1}]}))
    assert recorded_samples(path, {"trace": "t", "sample": 4, "max_num_seqs": 256}) == [{"x": 1}]  # the default
    with pytest.raises(ValueError, match=r"max_num_seqs: not recorded \(so 256\) there, 64 now"):
        recorded_samples(path, {"trace": "t", "sample": 4, "max_num_seqs": 64})


def report(speedup: dict[str, float] | None, tail: dict[str, float], over: dict[str, float],
           idle: dict[str, float]) -> dict:
    """A synthetic sample report with the keys the summary reads."""
    rows = {name: {"tail_s": tail[name], "makespan_s": 10.0 * over[name],
                   "time_split": {"compute_share": 1 - idle[name], "draft_share": 0.0, "kv_share": 0.0,
                                  "idle_share": idle[name]}} for name in tail}
    out: dict = {"policies": rows, "makespan_over_bound": over}
    if speedup is not None:
        out["speedup_vs_verl"] = speedup
        out["tail_reduction_vs_verl"] = {name: 1 - tail[name] / tail["verl"] for name in tail}
    return out


def test_summary_medians_and_worsts() -> None:
    samples = [report({"verl": 1.0, "seer": 1.5}, {"verl": 10.0, "seer": 4.0}, {"verl": 2.0, "seer": 1.2},
                      {"verl": 0.3, "seer": 0.1}),
               report({"verl": 1.0, "seer": 1.1}, {"verl": 8.0, "seer": 6.0}, {"verl": 1.8, "seer": 1.6},
                      {"verl": 0.2, "seer": 0.15}),
               report({"verl": 1.0, "seer": 1.3}, {"verl": 10.0, "seer": 2.0}, {"verl": 2.2, "seer": 1.1},
                      {"verl": 0.25, "seer": 0.05})]
    summary = summarize(samples)
    assert summary["samples"] == 3 and summary["baseline"] == "verl"
    seer = summary["policies"]["seer"]
    assert seer["per_sample"]["speedup"] == [1.5, 1.1, 1.3]
    assert seer["median"]["speedup"] == 1.3 and seer["worst"]["speedup"] == 1.1
    assert seer["per_sample"]["tail_reduction"] == [0.6, 0.25, 0.8]
    assert seer["median"]["tail_reduction"] == 0.6 and seer["worst"]["tail_reduction"] == 0.25
    assert seer["median"]["tail_s"] == 4.0 and seer["worst"]["tail_s"] == 6.0
    assert seer["median"]["makespan_over_bound"] == 1.2 and seer["worst"]["makespan_over_bound"] == 1.6
    assert seer["median"]["idle_share"] == 0.1 and seer["worst"]["idle_share"] == 0.15
    assert seer["worst"]["compute_share"] == 0.85
    verl = summary["policies"]["verl"]
    assert verl["median"]["speedup"] == 1.0 and verl["worst"]["makespan_over_bound"] == 2.2


def test_summary_without_verl_has_no_speedup() -> None:
    summary = summarize([report(None, {"seer": 3.0}, {"seer": 1.4}, {"seer": 0.1}),
                         report(None, {"seer": 5.0}, {"seer": 1.2}, {"seer": 0.2})])
    assert summary["baseline"] is None
    seer = summary["policies"]["seer"]
    assert seer["median"]["speedup"] is None and seer["worst"]["tail_reduction"] is None
    assert seer["median"]["makespan_over_bound"] == 1.3 and seer["worst"]["makespan_over_bound"] == 1.4
