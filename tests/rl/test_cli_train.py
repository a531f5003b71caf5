"""``seer train``: config + overrides from the command line, the --compare-policies JSON shape, clear errors."""

import json
from pathlib import Path

import pytest

from seer.cli.main import main

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


def test_compare_policies_json_shape(tiny, tmp_path):
    out = tmp_path / "report.json"
    rc = main(["train", "--config", TINY, f"model={tiny}", f"output_dir={tmp_path / 'run'}", "iterations=1",
               "data.prompts_per_iter=2", "--compare-policies", "verl,seer", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"verl", "seer"}
    for summary in report["policies"].values():
        for key in ("reward_first", "reward_last", "rollout_s_mean", "iteration_s_mean"):
            assert isinstance(summary[key], float) and summary[key] >= 0
    assert "seer" in report["rollout_speedup_vs_verl"]
    assert out.with_suffix(".png").is_file() and (tmp_path / "run" / "report.png").is_file()
    for policy in ("verl", "seer"):
        rows = [json.loads(x) for x in (tmp_path / "run" / policy / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["policy"] == policy
    seer_row = json.loads((tmp_path / "run" / "seer" / "metrics.jsonl").read_text().splitlines()[0])
    assert seer_row["tau"] is not None and seer_row["tau"] >= 1.0  # speculation ran and tau was reported


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    assert main(["train", "--config", TINY, f"model={tiny}", "optim.lr=-3"]) == 2
    assert "optim.lr must be > 0" in capsys.readouterr().err
    assert main(["train", "--config", TINY, f"model={tiny}", "--compare-policies", "verl,turbo"]) == 2
    assert "turbo" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_training_with_ray_instances_syncs_weights_every_iteration(tiny, tmp_path, local_ray):
    rc = main(["train", "--config", TINY, f"model={tiny}", f"output_dir={tmp_path / 'run'}", "iterations=2",
               "data.prompts_per_iter=2", "rollout.backend=ray", "rollout.instances=2", "rollout.policy=divided"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # each rollout ran on the weights of the update before it (the trainer refuses any other version)
    assert [r["iteration"] for r in rows] == [1, 2] and rows[0]["weight_version"] == 0
    assert rows[1]["weight_version"] == (1 if rows[0]["optimizer_steps"] else 0)
