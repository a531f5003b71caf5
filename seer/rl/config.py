"""The training config: one frozen dataclass per subsystem, validated at construction.

Defaults follow what verl/DAPO users expect (GRPO with group-normalised advantages, PPO-clip, token-level loss
averaging, no KL); presets in ``configs/`` set the rest. ``load_config`` reads YAML plus ``key.sub=value``
overrides through ``seer.utils.config_loader`` (which rejects unknown keys and wrong types); each ``__post_init__`` here
rejects out-of-range values, so a bad run fails before a model is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seer.rollout.config import RolloutConfig
from seer.utils.config_loader import apply_overrides, from_dict, load_yaml

DATA_SOURCES = ("jsonl", "reasoning_gym", "synthetic")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean")
OLD_LOGPROBS = ("rollout", "recompute")
DEVICES = ("auto", "cpu", "cuda")
TRAIN_DTYPES = ("float32", "bfloat16")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _choice(name: str, value: str, choices: Sequence[str]) -> None:
    _check(value in choices, f"{name} must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and how many per iteration (each sampled ``group_size`` times)."""

    source: str = "jsonl"               # jsonl (path) | reasoning_gym (task) | synthetic (tests, smoke runs)
    path: str | None = None
    task: str | None = None             # reasoning-gym dataset name, e.g. chain_sum
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    size: int = 1000                    # prompts generated (reasoning_gym, synthetic)
    limit: int | None = None            # use the first N prompts of a file
    prompts_per_iter: int = 8
    group_size: int = 8
    shuffle: bool = True
    prompt_template: str = "{question}"
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        _choice("data.source", self.source, DATA_SOURCES)
        _check(self.source != "jsonl" or bool(self.path), "data.path is required when data.source is jsonl")
        _check(self.source != "reasoning_gym" or bool(self.task),
               "data.task (a reasoning-gym dataset name) is required when data.source is reasoning_gym")
        _check(self.size >= 1, f"data.size must be >= 1, got {self.size}")
        _check(self.limit is None or self.limit >= 1, f"data.limit must be >= 1, got {self.limit}")
        _check(self.prompts_per_iter >= 1, f"data.prompts_per_iter must be >= 1, got {self.prompts_per_iter}")
        _check(self.group_size >= 2, f"data.group_size must be >= 2 (GRPO compares siblings), got {self.group_size}")
        _check("{question}" in self.prompt_template, "data.prompt_template must contain {question}")
        try:
            self.prompt_template.format(question="")
        except (IndexError, KeyError, ValueError) as err:
            raise ValueError(f"data.prompt_template: {err!r}; write literal braces as {{{{ and }}}}") from None


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256

    def __post_init__(self) -> None:
        _check(self.temperature > 0, f"sampling.temperature must be > 0 (greedy siblings are identical, "
                                     f"so GRPO has no signal), got {self.temperature}")
        _check(0 < self.top_p <= 1, f"sampling.top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k == -1 or self.top_k >= 1, f"sampling.top_k must be -1 or >= 1, got {self.top_k}")
        _check(self.max_tokens >= 1, f"sampling.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class RewardConfig:
    """A registered scorer (``rewards.REWARDS``); ``custom`` loads ``function`` = ``path/to/file.py:name``."""

    name: str = "math_verify"
    function: str | None = None
    timeout_s: float | None = 10.0      # per response; None runs inline with no timeout
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from seer.rl.rewards import REWARDS
        _choice("reward.name", self.name, tuple(REWARDS))
        _check(self.name != "custom" or bool(self.function),
               "reward.function (path/to/file.py:compute_score) is required when reward.name is custom")
        _check(self.timeout_s is None or self.timeout_s > 0, f"reward.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class AlgoConfig:
    """GRPO advantages and the PPO-clip objective (verl names where they exist)."""

    clip_low: float = 0.2               # ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher: high > low)
    clip_high: float = 0.2
    dual_clip_c: float | None = None    # dual-clip lower bound for negative advantages (verl clip_ratio_c)
    kl_coef: float = 0.0                # k3 KL to the initial model; 0 loads no reference model
    entropy_coef: float = 0.0
    norm_adv_by_std: bool = True        # False: Dr. GRPO (advantage = reward - group mean)
    adv_eps: float = 1e-6
    drop_uniform_groups: bool = True    # DAPO: groups whose rewards are all equal carry no signal
    loss_agg: str = "token-mean"
    old_logprobs: str = "rollout"       # rollout: the engine's logprobs; recompute: a forward before the update

    def __post_init__(self) -> None:
        _check(0 <= self.clip_low < 1, f"algo.clip_low must be in [0, 1), got {self.clip_low}")
        _check(self.clip_high >= 0, f"algo.clip_high must be >= 0, got {self.clip_high}")
        _check(self.dual_clip_c is None or self.dual_clip_c > 1, f"algo.dual_clip_c must be > 1, "
                                                                  f"got {self.dual_clip_c}")
        _check(self.kl_coef >= 0 and self.entropy_coef >= 0, "algo.kl_coef and algo.entropy_coef must be >= 0")
        _check(self.adv_eps > 0, f"algo.adv_eps must be > 0, got {self.adv_eps}")
        _choice("algo.loss_agg", self.loss_agg, LOSS_AGGS)
        _choice("algo.old_logprobs", self.old_logprobs, OLD_LOGPROBS)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    warmup_steps: int = 0               # linear warmup over this many optimizer steps
    epochs: int = 1                     # passes over one rollout's data
    minibatches: int = 1                # optimizer steps per epoch (>1 makes the PPO clip matter)
    micro_batch_size: int = 8           # sequences per forward/backward (gradient accumulation)

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _check(all(0 <= b < 1 for b in self.betas), f"optim.betas must be in [0, 1), got {list(self.betas)}")
        _check(self.grad_clip is None or self.grad_clip > 0, f"optim.grad_clip must be > 0, got {self.grad_clip}")
        _check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.epochs >= 1 and self.minibatches >= 1 and self.micro_batch_size >= 1,
               "optim.epochs, optim.minibatches and optim.micro_batch_size must be >= 1")


@dataclass(frozen=True)
class LogConfig:
    progress: bool = True               # iteration bar and the rollout bar
    tensorboard: bool = False
    save_rollouts: bool = False         # every response of every iteration to rollouts/iter_K.jsonl


@dataclass(frozen=True)
class TrainConfig:
    model: str                          # HF directory or a known model name (seer models prepare)
    iterations: int = 10
    seed: int = 0
    device: str = "auto"                # where the trainer runs (the rollout engine has its own settings)
    dtype: str = "float32"
    output_dir: str = "runs/seer-train"
    checkpoint_every: int = 0           # iterations between checkpoints; 0: only at the end
    keep_checkpoints: int = 2
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # its engine's seed is set to the run's
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _check(bool(self.model), "model is required (an HF directory or a known model name)")
        _check(self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}")
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, TRAIN_DTYPES)
        _check(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        _check(self.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")

    @property
    def responses_per_iter(self) -> int:
        return self.data.prompts_per_iter * self.data.group_size


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A validated ``TrainConfig`` from a YAML file (or none) plus ``key.sub=value`` overrides."""
    data = load_yaml(path) if path is not None else {}
    return from_dict(TrainConfig, apply_overrides(data, overrides))
