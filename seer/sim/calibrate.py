"""Fit the cost model's constants to step times measured on the real engine, and say how well they predict.

Why: the roofline knows the hardware's peaks but not how close kernels get to them, nor the per-step host
overhead (scheduling, sampling, launches), which dominates small batches. Those four numbers (compute and memory
efficiency, fixed and per-sequence overhead) are fitted here from measured steps, and the fit is judged on steps
it did not see (a seeded 80/20 split), so a user knows how far to trust simulated times.

Input: JSONL, one measured step per line, ``{"num_seqs", "num_tokens", "context_tokens", "seconds"}`` (optional
``attn_pairs``; else ``context_tokens * num_tokens / num_seqs``). ``step_record`` writes that shape from a
``SchedulerOutput`` and its measured seconds.

Method: ``t = max(a * C, b * M) + comm + c0 + c1 * seqs`` with ``C``, ``M`` the roofline compute and memory times
at 100% efficiency. For a fixed assignment of steps to the compute- or memory-bound regime this is linear in
``(a, b, c0, c1) >= 0``; we solve it by non-negative least squares on relative error, reassign regimes, and
repeat from several starting assignments, keeping the best. Efficiencies are ``1/a`` and ``1/b``; one never
binding in the data is reported as not identified and keeps its prior value.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from seer.engine.scheduler import SchedulerOutput
from seer.sim.cost_model import CostConstants, CostModel, StepSummary
from seer.sim.hardware import InstanceSpec
from seer.utils.io import read_jsonl
from seer.utils.nnls import nnls

REQUIRED = ("num_seqs", "num_tokens", "context_tokens", "seconds")


@dataclass(frozen=True)
class StepSample:
    summary: StepSummary
    seconds: float


@dataclass(frozen=True)
class CalibrationReport:
    constants: CostConstants
    n_train: int
    n_heldout: int
    train_mape: float
    heldout_mape: float
    heldout_max_ape: float
    compute_bound_steps: int
    identified: dict[str, bool]

    def to_dict(self) -> dict:
        return {"constants": self.constants.to_dict(), "n_train": self.n_train, "n_heldout": self.n_heldout,
                "train_mape": self.train_mape, "heldout_mape": self.heldout_mape,
                "heldout_max_ape": self.heldout_max_ape, "compute_bound_steps": self.compute_bound_steps,
                "identified": self.identified}


def step_record(out: SchedulerOutput, seconds: float) -> dict:
    """The calibration JSONL record of one measured step."""
    s = CostModel.summarize(out)
    return {"num_seqs": s.num_seqs, "num_tokens": s.num_tokens, "context_tokens": s.context_tokens,
            "attn_pairs": s.attn_pairs, "seconds": seconds}


def parse_sample(rec: object, where: str) -> StepSample:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    vals = {k: rec[k] for k in REQUIRED}
    for k, v in vals.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}: {k} must be a non-negative number, got {v!r}")
    if vals["num_seqs"] < 1 or vals["num_tokens"] < 1 or vals["seconds"] <= 0:
        raise ValueError(f"{where}: num_seqs and num_tokens must be >= 1 and seconds > 0")
    pairs = rec.get("attn_pairs", vals["context_tokens"] * vals["num_tokens"] / vals["num_seqs"])
    summary = StepSummary(int(vals["num_seqs"]), float(vals["num_tokens"]), float(vals["context_tokens"]),
                          float(pairs))
    return StepSample(summary, float(vals["seconds"]))


def load_samples(path: str | Path) -> list[StepSample]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration file not found: {path}")
    out = [parse_sample(rec, f"{path}:{lineno}") for lineno, rec in read_jsonl(path)]
    if len(out) < 5:
        raise ValueError(f"{path}: need at least 5 measured steps to calibrate, got {len(out)}")
    return out


def _features(instance: InstanceSpec, samples: Sequence[StepSample]) -> np.ndarray:
    """Rows (C, M, comm, seqs, seconds) at 100% efficiency and zero overhead."""
    unit = CostModel(instance, CostConstants(1.0, 1.0, 0.0, 0.0))
    rows = [(*unit.components(s.summary), s.summary.num_seqs, s.seconds) for s in samples]
    return np.array(rows, dtype=float)


def _fit_params(f: np.ndarray, iters: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """(a, b, c0, c1) and the compute-bound mask minimising relative squared error."""
    c, m, comm, seqs, t = f.T
    y, w = (t - comm) / t, 1.0 / t
    starts = [c >= m, np.ones_like(c, bool), np.zeros_like(c, bool)]
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for mask in starts:
        for _ in range(iters):
            design = np.column_stack([c * mask * w, m * ~mask * w, w, seqs * w])
            p = nnls(design, y)
            new = p[0] * c >= p[1] * m
            if np.array_equal(new, mask):
                break
            mask = new
        pred = np.maximum(p[0] * c, p[1] * m) + comm + p[2] + p[3] * seqs
        err = float(np.mean(((pred - t) / t) ** 2))
        if best is None or err < best[0]:
            best = (err, p, mask)
    assert best is not None
    return best[1], best[2]


def _ape(model: CostModel, samples: Sequence[StepSample]) -> np.ndarray:
    return np.array([abs(model.step_time(s.summary) - s.seconds) / s.seconds for s in samples])


def calibrate(instance: InstanceSpec, samples: Sequence[StepSample], prior: CostConstants | None = None,
              heldout_frac: float = 0.2, seed: int = 0) -> CalibrationReport:
    """Fit ``CostConstants`` on a seeded split of ``samples``; report errors on the held-out part."""
    prior = prior or CostConstants()
    if len(samples) < 5:
        raise ValueError(f"need at least 5 measured steps to calibrate, got {len(samples)}")
    if not 0 < heldout_frac < 1:
        raise ValueError(f"heldout_frac must be in (0, 1), got {heldout_frac}")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n_held = max(1, int(round(heldout_frac * len(samples))))
    held = [samples[i] for i in order[:n_held]]
    train = [samples[i] for i in order[n_held:]]
    p, mask = _fit_params(_features(instance, train))
    identified = {"compute_efficiency": bool(p[0] > 0 and mask.any()),
                  "memory_efficiency": bool(p[1] > 0 and (~mask).any())}
    constants = replace(prior,
                        compute_efficiency=1.0 / p[0] if identified["compute_efficiency"] else prior.compute_efficiency,
                        memory_efficiency=1.0 / p[1] if identified["memory_efficiency"] else prior.memory_efficiency,
                        step_overhead_s=float(p[2]), per_seq_overhead_s=float(p[3]))
    model = CostModel(instance, constants)
    held_ape, train_ape = _ape(model, held), _ape(model, train)
    return CalibrationReport(constants, len(train), len(held), float(train_ape.mean()), float(held_ape.mean()),
                             float(held_ape.max()), int(mask.sum()), identified)
