"""Metrics JSONL (NaN-safe, truncated on resume), TensorBoard scalars, the summary JSON and the report plot."""

import json
import math

import pytest

from seer.rl.metrics import MetricsWriter, clean, read_metrics
from seer.rl.report import comparison, plot_training, summarize


def rows(n, rollout_s):
    return [{"iteration": i + 1, "reward_mean": 0.1 * i, "accuracy": 0.1 * i, "response_len_mean": 10.0 + i,
             "response_len_p90": 12.0 + i, "rollout_s": rollout_s, "iteration_s": rollout_s + 1.0,
             "tau": math.nan} for i in range(n)]


def test_writer_truncates_on_resume_and_writes_tensorboard(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path, tensorboard_dir=tmp_path / "tb")
    for r in rows(4, 2.0):
        w.write(r)
    w.close()
    assert [r["iteration"] for r in read_metrics(path)] == [1, 2, 3, 4]
    assert read_metrics(path)[0]["tau"] is None  # NaN is not JSON
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    resumed = MetricsWriter(path, keep_until_iteration=2)
    assert [r["iteration"] for r in resumed.rows] == [1, 2]
    resumed.write(rows(3, 2.0)[2])
    assert [r["iteration"] for r in read_metrics(path)] == [1, 2, 3]
    fresh = MetricsWriter(path)
    assert fresh.rows == [] and read_metrics(path) == []


def test_clean_rounds_and_nulls():
    assert clean({"a": 1.23456789, "b": math.inf, "c": 3, "d": "x"}) == {"a": 1.23457, "b": None, "c": 3, "d": "x"}


def test_summary_and_comparison(tmp_path):
    runs = {"verl": [clean(r) for r in rows(3, 4.0)], "seer": [clean(r) for r in rows(3, 2.0)]}
    s = summarize(runs["seer"])
    assert s["reward_first"] == 0.0 and s["reward_last"] == pytest.approx(0.2)
    assert s["rollout_s_mean"] == 2.0 and s["iteration_s_mean"] == 3.0 and s["tau_mean"] is None
    report = comparison(runs)
    assert report["rollout_speedup_vs_verl"]["seer"] == pytest.approx(2.0)
    json.dumps(report, allow_nan=False)
    png = plot_training(runs, tmp_path / "r.png", "t")
    assert png.is_file() and png.stat().st_size > 1000
    with pytest.raises(ValueError, match="no iterations"):
        summarize([])
