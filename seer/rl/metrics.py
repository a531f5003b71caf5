"""Per-iteration training metrics: one flat JSON row per iteration (JSONL), optionally TensorBoard scalars.

Time columns, all in seconds:
- ``rollout_s``: the rollout's makespan as docs/design.md defines it (first request to last response). With the
  ``inprocess`` backend the instances take turns on one machine and each step is timed on its own, so this is
  the time the rollout takes with every instance on its own accelerator; ``rollout_wall_s`` is what it took here.
- ``reward_s``, ``train_s`` (old/ref logprobs + update), ``sync_s`` (weight sync to every instance).
- ``iteration_s = rollout_s + reward_s + train_s + sync_s``: the synchronous iteration with parallel
  instances; ``iteration_wall_s`` is the measured wall time here (including checkpointing).

``accuracy`` is the fraction of responses with reward >= 1 (the correct ones, for 0/1 rewards).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seer.rl.advantages import GroupAdvantages
from seer.rl.rewards import RewardBatch
from seer.rl.updater import UpdateStats
from seer.rollout.metrics import percentile


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def reward_metrics(rewards: RewardBatch, advantages: GroupAdvantages) -> dict[str, float]:
    s = rewards.scores
    return {"reward_mean": _mean(s), "reward_std": _std(s), "accuracy": _mean([float(x >= 1.0) for x in s]),
            "reward_errors": rewards.errors, "reward_timeouts": rewards.timeouts,
            "groups": len(advantages.keep), "groups_dropped": advantages.num_dropped}


def length_metrics(records: Sequence[dict]) -> dict[str, float]:
    lengths = [len(r["token_ids"]) for r in records]
    return {"response_len_mean": _mean(lengths), "response_len_p50": percentile(lengths, 50),
            "response_len_p90": percentile(lengths, 90), "response_len_max": max(lengths),
            "truncated_frac": _mean([float(r["finish_reason"] == "length") for r in records])}


def rollout_metrics(out: Any) -> dict[str, float]:
    """From a ``RolloutOutput``: makespan, tail, throughput and (policy seer) tau / acceptance."""
    m = out.metrics
    spec = out.result.stats.get("spec") or {}
    return {"rollout_s": m.makespan_s, "rollout_tail_s": m.tail_s, "throughput_tok_s": m.throughput_tok_s,
            "generated_tokens": m.generated_tokens, "preemptions": m.preemptions, "rollout_wall_s": out.wall_s,
            "tau": spec.get("tau", math.nan), "accept_rate": spec.get("accept_rate", math.nan)}


def update_metrics(stats: UpdateStats | None) -> dict[str, float]:
    if stats is None:  # every group dropped: nothing to train on this iteration
        return {"optimizer_steps": 0, "skipped_steps": 0, "samples": 0, "train_tokens": 0}
    return {"pg_loss": stats.pg_loss, "kl": stats.kl, "entropy": stats.entropy, "clip_frac": stats.clip_frac,
            "ratio_mean": stats.ratio_mean, "grad_norm": stats.grad_norm, "lr": stats.lr,
            "optimizer_steps": stats.optimizer_steps, "skipped_steps": stats.skipped_steps,
            "logprob_diff": stats.logprob_diff, "samples": stats.samples, "train_tokens": stats.tokens}


def clean(row: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN/inf become null, numbers are rounded to 6 significant digits."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, float):
            out[k] = None if not math.isfinite(v) else float(f"{v:.6g}")
        else:
            out[k] = v
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``; on resume, rows after the checkpoint's iteration are dropped first."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None,
                 keep_until_iteration: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if keep_until_iteration is not None:
            kept = [r for r in read_metrics(self.path) if r.get("iteration", 0) <= keep_until_iteration]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.rows = kept
        self.tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("log.tensorboard needs the tensorboard package (pip install tensorboard)") from err
            self.tb = SummaryWriter(str(tensorboard_dir))

    def write(self, row: dict[str, Any]) -> dict[str, Any]:
        row = clean(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)
        if self.tb is not None:
            step = int(row["iteration"])
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iteration":
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        return row

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
