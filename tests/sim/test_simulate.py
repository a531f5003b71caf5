"""simulate(): the rollout bench's JSON keys, plots, and the `seer simulate` verb with its errors."""

from __future__ import annotations

import json

import pytest

from seer.cli.main import main
from seer.rollout.metrics import REPORT_KEYS
from seer.sim.simulate import SimConfig, simulate
from tests.sim.helpers import small_workload


def test_report_has_bench_keys_and_plots(tmp_path) -> None:  # noqa: ANN001
    out = simulate(small_workload(), ["verl", "divided", "context", "seer", "oracle"],
                   config=SimConfig(quantum=4, chunk_tokens=128), plots_dir=str(tmp_path / "plots"))
    assert set(out) >= {"policies", "speedup_vs_verl", "tail_reduction_vs_verl", "context_vs_oracle", "sim"}
    for row in out["policies"].values():
        assert set(REPORT_KEYS) <= set(row) and len(row["idle_frac"]) == 2
    assert out["speedup_vs_verl"]["verl"] == 1.0 and "tau" in out["policies"]["seer"]["spec"]
    assert out["sim"]["config"]["quantum"] == 4 and out["sim"]["speed"]["verl"]["events"] > 0
    for kind in ("timelines", "running", "kv_usage", "tail_cdf"):
        assert (tmp_path / "plots" / f"{kind}.png").stat().st_size > 1000
    json.dumps(out)


def test_cli_trace_run(tmp_path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "r.json"
    rc = main(["simulate", "--trace", "data/castillo_sample.jsonl.gz", "--limit", "12", "--instances", "2",
               "--policies", "verl,seer", "--json", str(path), "--no-progress"])
    assert rc == 0
    out = json.loads(path.read_text())
    assert set(out["policies"]) == {"verl", "seer"}
    assert "makespan" in capsys.readouterr().out


def test_cli_without_verl_compares_against_the_first_policy(tmp_path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "r.json"
    rc = main(["simulate", "--trace", "data/castillo_sample.jsonl.gz", "--limit", "12", "--instances", "2",
               "--policies", "seer", "--json", str(path), "--no-progress"])
    assert rc == 0 and json.loads(path.read_text())["speedup_vs_seer"] == {"seer": 1.0}
    assert "vs seer  1.00x" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--workload", "nope"], "unknown workload 'nope'"),
    (["--workload", "moonlight", "--trace", "x.jsonl"], "exactly one of"),
    (["--trace", "missing.jsonl"], "not found"),
    (["--workload", "moonlight", "--policies", "fast"], "unknown policy 'fast'"),
    (["--workload", "moonlight", "--instances", "0"], "--instances must be >= 1"),
])
def test_cli_errors(argv, msg, capsys) -> None:  # noqa: ANN001
    assert main(["simulate", "--no-progress", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_cli_calibrate(tmp_path, capsys) -> None:  # noqa: ANN001
    from tests.sim.test_calibrate import synthetic, write
    path = write(tmp_path, synthetic(60))
    assert main(["simulate", "--calibrate", path, "--json", str(tmp_path / "c.json")]) == 0
    rep = json.loads((tmp_path / "c.json").read_text())
    assert rep["heldout_mape"] < 0.1 and "held-out" in capsys.readouterr().out


def test_reproduction_table_renders() -> None:
    from seer.sim.reproduce import POLICIES, markdown
    out = simulate(small_workload(groups=4), POLICIES, config=SimConfig(quantum=8, chunk_tokens=128, record=False))
    out["paper"] = {"verl_total_s": 1.0, "verl_tail_s": 1.0, "verl_preemptions": None, "seer_speedup": 1.5,
                    "seer_tail_reduction": 0.8}
    assert 0 < out["group_oracle_vs_oracle"] <= 1.05 and out["context_vs_group_oracle"] > 0
    table = markdown({"small": out})
    assert table.count("| small |") == 2 and "x / 1.50x" in table


def test_sensitivity_finds_the_factor_that_matches_the_paper() -> None:
    from seer.sim.reproduce import matching_factor, sensitivity_markdown
    assert matching_factor({0.25: 1.4, 0.5: 1.8, 1.0: 2.4}, 1.6) == pytest.approx(0.375)
    assert matching_factor({0.5: 1.8, 1.0: 2.4}, 1.6) is None  # not bracketed: no extrapolation
    row = {"paper_speedup": 1.78, "matching_factor": None,
           "factors": {"0.5": {"speedup": 1.9, "tau": 1.5}, "1.0": {"speedup": 2.5, "tau": 2.1}}}
    table = sensitivity_markdown({"moonlight": row})
    assert "1.90x (tau 1.50)" in table and "out of range" in table


def test_critical_path_placement_runs_the_runaway_alone() -> None:
    """On a CPU-like instance (steps cost grows with the batch) a runaway sharing its instance sets the makespan;
    isolating it (oracle estimates) shortens the rollout, and never loses a response."""
    from seer.sim.hardware import InstanceSpec, get_accelerator, get_model
    from seer.sim.workloads import Cluster, Workload, WorkloadGroup

    cluster = Cluster(InstanceSpec(get_accelerator("cpu-2core"), get_model("smollm2-135m"), 1, kv_tokens=1200), 4)
    groups = [WorkloadGroup(24, (600, 40, 50, 45), key="runaway")]
    groups += [WorkloadGroup(24, tuple(60 + 10 * ((i + j) % 4) for j in range(4)), key=f"g{i}") for i in range(15)]
    workload = Workload("runaway", tuple(groups), 640, cluster, "test")
    out = simulate(workload, ["oracle", "oracle+critical", "context", "context+critical"],
                   config=SimConfig(quantum=1, chunk_tokens=32, check=True))
    rows = out["policies"]
    assert all(row["num_responses"] == 64 for row in rows.values())
    assert rows["oracle+critical"]["makespan_s"] < 0.85 * rows["oracle"]["makespan_s"]
    assert rows["context+critical"]["makespan_s"] <= 1.01 * rows["context"]["makespan_s"]


def test_length_sweep_draws_lengths_with_each_correlation() -> None:
    import numpy as np

    from seer.sim.fitted import preset_setup
    from seer.sim.reproduce import length_markdown, length_sensitivity

    def within_share(icc: float) -> float:
        """Share of log-length variance inside groups."""
        workload = preset_setup("moonlight", icc=icc)[0]
        logs = [np.log(np.maximum(g.lengths, 1)) for g in workload.groups]
        return float(np.mean([x.var() for x in logs]) / np.concatenate(logs).var())

    assert within_share(0.95) < 0.5 * within_share(0.3)
    out = length_sensitivity("moonlight", [0.3, 0.95], [0, 1], instances=1)
    assert list(out["rows"]) == ["icc 0.3, seed 0", "icc 0.3, seed 1", "icc 0.95, seed 0", "icc 0.95, seed 1"]
    makespans = {row["verl_makespan_s"] for row in out["rows"].values()}
    assert len(makespans) == 4  # veRL runs on each draw
    for row in out["rows"].values():
        assert row["seer_speedup"] > 0 and row["seer-paper_speedup"] > 0
    table = length_markdown({"moonlight": out})
    assert len(table.splitlines()) == 6 and "icc 0.95, seed 1" in table
