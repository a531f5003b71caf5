"""Configs: YAML + dotted overrides into frozen dataclasses; unknown keys, wrong types and bad values fail
clearly, naming the key."""

import dataclasses
from pathlib import Path

import pytest

from seer.rl.config import TrainConfig, load_config
from seer.rollout.config import RolloutConfig
from seer.utils.config_loader import apply_overrides, from_dict, to_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_presets_load():
    tiny = load_config(CONFIGS / "tiny.yaml", ["model=/some/model"])
    assert tiny.data.source == "synthetic" and tiny.reward.name == "token_fraction"
    assert tiny.algo.clip_high > tiny.algo.clip_low  # clip-higher
    for preset in sorted(CONFIGS.glob("smollm2*.yaml")):
        cfg = load_config(preset)
        assert cfg.model and cfg.iterations >= 1


def test_overrides_are_typed_and_nested():
    cfg = load_config(CONFIGS / "tiny.yaml", ["model=m", "optim.lr=1e-5", "data.group_size=4",
                                               "rollout.policy=seer", "algo.dual_clip_c=3", "reward.timeout_s=null",
                                               "optim.betas=[0.9, 0.95]"])
    assert cfg.optim.lr == 1e-5 and cfg.data.group_size == 4 and cfg.rollout.policy == "seer"
    assert cfg.algo.dual_clip_c == 3.0 and isinstance(cfg.algo.dual_clip_c, float)
    assert cfg.reward.timeout_s is None and cfg.optim.betas == (0.9, 0.95)
    assert cfg.rollout.spec.adaptive is False and cfg.rollout.engine.block_size == 4
    deep = load_config(CONFIGS / "tiny.yaml", ["model=m", "rollout.engine.dtype=bfloat16", "rollout.spec.gamma_max=2"])
    assert deep.rollout.engine.dtype == "bfloat16" and deep.rollout.spec.gamma_max == 2
    assert deep.rollout.engine.num_kv_blocks == 256  # the rest of the YAML's engine section is kept
    bare = from_dict(RolloutConfig, {"engine": {"dtype": "float32"}})
    assert bare.engine.kv_cache_memory_gb == 1.0  # the rollout's default engine, not EngineConfig's
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.lr = 1.0  # frozen
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg  # round trip


@pytest.mark.parametrize("override, message", [
    ("optim.lrr=1e-5", r"unknown config key 'optim.lrr'; did you mean 'optim.lr'\?"),
    ("bogus=1", r"unknown config key 'bogus'"),
    ("optim.lr=fast", r"optim.lr: expected a number, got 'fast'"),
    ("optim.lr=-1", r"optim.lr must be > 0"),
    ("data.group_size=1", r"data.group_size must be >= 2"),
    ("data.group_size=2.5", r"data.group_size: expected an integer"),
    ("algo.clip_low=1.5", r"algo.clip_low must be in \[0, 1\)"),
    ("algo.loss_agg=sum", r"algo.loss_agg must be one of token-mean, seq-mean-token-mean"),
    ("sampling.temperature=0", r"sampling.temperature must be > 0"),
    ("rollout.policy=fastest", r"rollout: .*fastest"),
    ("reward.name=magic", r"reward.name must be one of"),
    ("reward.name=custom", r"reward.function .* is required"),
    ("log.tensorboard=yes please", r"log.tensorboard: expected true or false"),
    ("optim=3", r"optim: expected a mapping"),
    ("data.source=jsonl", r"data.path is required"),
    ("optim.betas=[0.9]", r"optim.betas: expected a list of 2 values"),
    ("rollout.dtype=float32", r"unknown config key 'rollout.dtype'"),
    ("rollout.engine.dtype=int3", r"rollout.engine: unsupported dtype 'int3'"),
    ("rollout.spec.gamma_max=0", r"rollout.spec: gamma_max must be in \[1, 32\]"),
    ("data.prompt_template={question} \\\\boxed{}", r"literal braces"),
])
def test_bad_values_fail_clearly(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(CONFIGS / "tiny.yaml", ["model=m", override])


def test_missing_model_and_files(tmp_path):
    with pytest.raises(ValueError, match="missing required config key 'model'"):
        load_config(CONFIGS / "tiny.yaml")
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n- not a mapping\n")
    with pytest.raises(ValueError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ValueError, match="must look like key.sub=value"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(ValueError, match="is a value, not a section"):
        apply_overrides({"model": "x"}, ["model.sub=1"])
