"""Calibration recovers known constants from synthetic measured steps and reports held-out error."""

from __future__ import annotations

import json
import random

import pytest

from seer.sim.calibrate import calibrate, load_samples
from seer.sim.cost_model import CostConstants, CostModel, StepSummary
from seer.sim.hardware import InstanceSpec, get_accelerator, get_model

INST = InstanceSpec(get_accelerator("cpu-2core"), get_model("smollm2-135m"), 1, kv_tokens=100_000)
TRUE = CostConstants(compute_efficiency=0.35, memory_efficiency=0.6, step_overhead_s=0.004, per_seq_overhead_s=2e-4)


def synthetic(n: int = 200, noise: float = 0.02, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    cm = CostModel(INST, TRUE)
    out = []
    for _ in range(n):
        seqs = rng.randint(1, 64)
        prefill = rng.random() < 0.3
        tokens = seqs + (rng.randint(64, 2048) if prefill else 0)
        ctx = seqs * rng.randint(16, 2048)
        pairs = ctx * tokens / seqs
        t = cm.step_time(StepSummary(seqs, tokens, ctx, pairs)) * (1 + rng.gauss(0, noise))
        out.append({"num_seqs": seqs, "num_tokens": tokens, "context_tokens": ctx, "attn_pairs": pairs,
                    "seconds": t})
    return out


def write(tmp_path, records) -> str:  # noqa: ANN001
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_fit_recovers_constants_and_predicts_heldout(tmp_path) -> None:  # noqa: ANN001
    report = calibrate(INST, load_samples(write(tmp_path, synthetic())))
    c = report.constants
    assert c.compute_efficiency == pytest.approx(TRUE.compute_efficiency, rel=0.1)
    assert c.memory_efficiency == pytest.approx(TRUE.memory_efficiency, rel=0.1)
    assert c.step_overhead_s == pytest.approx(TRUE.step_overhead_s, rel=0.25)
    assert report.heldout_mape < 0.05 and report.n_heldout == 40
    assert all(report.identified.values())


def test_exact_data_fits_exactly(tmp_path) -> None:  # noqa: ANN001
    report = calibrate(INST, load_samples(write(tmp_path, synthetic(noise=0.0))))
    assert report.heldout_max_ape < 1e-6


def test_bad_calibration_input(tmp_path) -> None:  # noqa: ANN001
    recs = synthetic(10)
    del recs[3]["seconds"]
    with pytest.raises(ValueError, match=r"steps.jsonl:4: missing seconds"):
        load_samples(write(tmp_path, recs))
    with pytest.raises(ValueError, match="at least 5"):
        load_samples(write(tmp_path, synthetic(3)))
    bad = synthetic(6)
    bad[0]["num_seqs"] = -1
    with pytest.raises(ValueError, match="non-negative"):
        load_samples(write(tmp_path, bad))
    with pytest.raises(FileNotFoundError):
        load_samples(tmp_path / "nope.jsonl")
