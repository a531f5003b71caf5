"""The RL loop end to end on a tiny random model: it learns a synthetic reward, never trains on another weight
version's rollout, resumes from a checkpoint identically, and survives a reward function that raises."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from seer.models.loader import hf_state_dict
from seer.rl import checkpoint as ckpt
from seer.rl.config import load_config
from seer.rl.trainer import StaleRolloutError, Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# columns that depend only on the computation (not on wall time)
DETERMINISTIC = ("reward_mean", "reward_std", "response_len_mean", "generated_tokens", "pg_loss", "clip_frac",
                 "grad_norm", "entropy", "weight_version", "groups_dropped")


def config(tiny, out, *extra):
    return load_config(CONFIGS / "tiny.yaml", [f"model={tiny}", f"output_dir={out}", *extra])


@pytest.fixture(scope="module")
def full_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("rl-run") / "full"
    with Trainer(config(tiny, out, "keep_checkpoints=3")) as trainer:
        rows = trainer.run()
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return out, rows, weights


def test_tiny_model_learns_the_synthetic_reward(full_run):
    _, rows, _ = full_run
    rewards = [r["reward_mean"] for r in rows]
    assert len(rows) == 6
    late = sum(rewards[-2:]) / 2
    assert late > rewards[0] + 0.1 and late > 3 * rewards[0], rewards
    # one weight version per iteration, bumped by every update; engine and trainer agree on the logprobs
    assert [r["weight_version"] for r in rows] == list(range(6))
    assert all(r["logprob_diff"] < 1e-4 for r in rows)
    assert all(r["optimizer_steps"] == 2 for r in rows)


def test_checkpoints_are_model_dirs(full_run):
    out, _, _ = full_run
    found = ckpt.list_checkpoints(out / "checkpoints")
    assert [p.name for p in found] == ["iter_000002", "iter_000004", "iter_000006"]
    assert (found[-1] / "config.json").is_file() and (found[-1] / "tokenizer.json").is_file()
    assert (out / "metrics.jsonl").is_file() and (out / "config.yaml").is_file()


def test_resume_continues_identically(full_run, tiny, tmp_path):
    out, rows, weights = full_run
    copy = tmp_path / "resumed"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints" / "iter_000006")  # as if the run died after iteration 4's checkpoint
    with Trainer(config(tiny, copy), resume=True) as trainer:
        assert trainer.state.iteration == 4 and trainer.state.weight_version == 4
        resumed = trainer.run()
        for k, v in trainer.model.state_dict().items():
            torch.testing.assert_close(v, weights[k], rtol=0, atol=1e-6)
    assert [r["iteration"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(resumed[4:], rows[4:]):
        assert {k: a[k] for k in DETERMINISTIC} == pytest.approx({k: b[k] for k in DETERMINISTIC}, rel=1e-5)


def test_existing_run_needs_resume_and_resume_needs_a_checkpoint(full_run, tiny, tmp_path):
    out, _, _ = full_run
    with pytest.raises(ValueError, match="already has checkpoints"):
        Trainer(config(tiny, out))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(config(tiny, tmp_path / "empty"), resume=True)


def test_stale_rollout_is_refused(tiny, tmp_path):
    with Trainer(config(tiny, tmp_path / "stale", "iterations=3", "data.prompts_per_iter=2")) as trainer:
        row = trainer.step()
        assert row["weight_version"] == 0 and trainer.state.weight_version == 1
        # the rollout instances get weights the trainer did not produce: version 2 != the trained version 1
        trainer.coordinator.update_weights({k: v.detach() for k, v in hf_state_dict(trainer.model).items()})
        with pytest.raises(StaleRolloutError, match="refusing off-policy data"):
            trainer.step()
        assert trainer.state.iteration == 1  # nothing was trained on the stale data


def test_mixed_versions_are_refused():
    fake_self = SimpleNamespace(state=ckpt.TrainerState(iteration=3, weight_version=3))
    mixed = SimpleNamespace(weight_version=3, records=lambda: [{"weight_version": 3}, {"weight_version": 2}])
    with pytest.raises(StaleRolloutError, match=r"\[2, 3\]"):
        Trainer.check_on_policy(fake_self, mixed)
    Trainer.check_on_policy(fake_self, SimpleNamespace(weight_version=3, records=lambda: [{"weight_version": 3}]))


def test_a_raising_reward_function_does_not_stop_training(tiny, tmp_path):
    fn = tmp_path / "flaky.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    if len(solution_str) % 3 == 0:\n"
                  "        raise RuntimeError('flaky reward')\n"
                  "    return float(len(solution_str) % 2)\n")
    cfg = config(tiny, tmp_path / "flaky", "iterations=1", "data.prompts_per_iter=2", "reward.name=custom",
                 f"reward.function={fn}:compute_score", "reward.kwargs={}", "reward.timeout_s=5")
    with Trainer(cfg) as trainer:
        (row,) = trainer.run()
    assert row["reward_errors"] > 0 and row["iteration"] == 1


def test_checkpoint_state_integrity():
    ckpt.TrainerState(iteration=3, cursor=12, weight_version=2).check_integrity()
    with pytest.raises(AssertionError):
        ckpt.TrainerState(iteration=1, weight_version=2).check_integrity()
