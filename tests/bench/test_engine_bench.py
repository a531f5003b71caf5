"""`seer bench engine`: dtype parsing and the summary that compares Seer's default with each peer's best."""

from __future__ import annotations

import pytest

from seer.bench import engine_bench
from seer.bench.engine_bench import parse_dtypes, summarize, summary_table


def _raw(tok_s: dict[str, dict[str, float]]) -> dict[str, dict[str, dict]]:
    return {system: {dtype: {"cases": {"fixed": {"tok_s": v, "peak_rss_mb": 100.0 + v}}} for dtype, v in by.items()}
            for system, by in tok_s.items()}


def test_parse_dtypes_resolves_auto_and_drops_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_bench, "auto_dtype", lambda: "float32")
    assert parse_dtypes("auto,float32, bfloat16") == ["float32", "bfloat16"]
    with pytest.raises(ValueError, match="float16"):
        parse_dtypes("float16")
    with pytest.raises(ValueError, match="at least one"):
        parse_dtypes(" , ")


def test_each_peer_is_compared_at_its_faster_dtype() -> None:
    raw = _raw({"seer": {"bfloat16": 150.0, "float32": 400.0}, "vllm": {"bfloat16": 120.0, "float32": 300.0},
                "hf": {"bfloat16": 90.0, "float32": 80.0}})
    row = summarize(raw, ["fixed"], seer_dtype="float32")["fixed"]
    assert row["seer_tok_s"] == 400.0 and row["peak_rss_mb"] == 500.0
    assert (row["vllm_best_dtype"], row["vllm_tok_s"], row["vs_vllm"]) == ("float32", 300.0, 1.333)
    assert (row["hf_best_dtype"], row["hf_tok_s"], row["vs_hf"]) == ("bfloat16", 90.0, 4.444)
    assert row["vllm_peak_rss_mb"] == 400.0


def test_a_missing_peer_leaves_its_ratio_empty() -> None:
    report = summarize(_raw({"seer": {"bfloat16": 150.0}}), ["fixed"], seer_dtype="bfloat16")
    row = report["fixed"]
    assert row["vllm_tok_s"] is None and row["vs_vllm"] is None and row["vllm_tok_s_by_dtype"] == {}
    table = summary_table(report, ["fixed"], ["bfloat16"])
    assert "150.0" in table and "vllm -x" in table


def test_the_table_says_when_seer_ran_outside_its_default_dtype() -> None:
    raw = _raw({"seer": {"float32": 400.0}})
    report = summarize(raw, ["fixed"], seer_dtype="float32", default_dtype="bfloat16")
    assert "Seer float32 (auto here is bfloat16, not run)" in summary_table(report, ["fixed"], ["float32"])
    report = summarize(raw, ["fixed"], seer_dtype="float32", default_dtype="float32")
    assert "Seer float32 (auto) vs" in summary_table(report, ["fixed"], ["float32"])


def test_an_unknown_peer_is_rejected_before_anything_runs(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="unknown peer 'sglang'"):
        engine_bench.run_engine_bench(tmp_path, ["sglang"])


def test_every_run_is_announced_and_a_failed_peer_is_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path,  # noqa: ANN001
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def fake_run(system: str, dtype: str, *args: object) -> dict:
        if system == "vllm":
            raise engine_bench.PeerError("vllm venv missing")
        return {"cases": {"fixed": {"tok_s": 100.0 if dtype == "float32" else 50.0}}}

    monkeypatch.setattr(engine_bench, "_run_system", fake_run)
    monkeypatch.setattr(engine_bench, "engine_workload", lambda *a, **k: {"fixed": {"max_tokens": 4}})
    monkeypatch.setattr(engine_bench, "auto_dtype", lambda: "float32")
    report = engine_bench.run_engine_bench(tmp_path, ["vllm"], cases=["fixed"], dtypes=["bfloat16", "float32"])
    err = capsys.readouterr().err
    assert "[1/4] seer bfloat16: fixed 50.0 tok/s" in err and "[2/4] seer float32: fixed 100.0 tok/s" in err
    assert "[3/4] vllm bfloat16 failed: vllm venv missing" in err
    assert report["errors"] == {"vllm/bfloat16": "vllm venv missing", "vllm/float32": "vllm venv missing"}
    assert report["fixed"]["seer_tok_s"] == 100.0 and report["fixed"]["vs_vllm"] is None
