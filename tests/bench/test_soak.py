"""``seer bench soak``: repeated rollout + weight sync keeps the pool empty, counters per rollout, one version."""

from __future__ import annotations

import json

import pytest

from seer.bench.soak_bench import growth
from seer.cli.main import main
from tests.models.helpers import make_tiny_model_dir


@pytest.mark.slow
def test_soak_reports_clean_iterations(tmp_path) -> None:  # noqa: ANN001
    model = make_tiny_model_dir(tmp_path / "model", family="qwen2", seed=3)
    out = tmp_path / "soak.json"
    rc = main(["bench", "soak", "--model", str(model), "--iterations", "6", "--backend", "inprocess",
               "--groups", "2", "--group-size", "3", "--max-tokens", "8", "--dtype", "float32", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["problems"] == []
    assert [r["weight_version"] for r in report["iterations"]] == [1, 2, 3, 4, 5, 6]
    assert set(report["growth_after_warmup"]) == {"driver"}


def test_growth_is_measured_from_the_end_of_warm_up() -> None:
    rows = [{"driver_rss_mb": 100.0 + i, "instance_rss_mb": [50.0, 0.0]} for i in range(10)]
    assert growth(rows) == {"driver": round(109 / 104 - 1, 4), "instance_0": 0.0, "instance_1": 0.0}
