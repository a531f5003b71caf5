"""Workloads: preset shapes, group-correlated lengths, trace loading and the errors bad input must give."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from seer.data.traces import load_trace
from seer.sim.lengths import LengthModel, icc_anova, trace_icc
from seer.sim.workloads import PRESETS, Workload, WorkloadGroup, default_quantum, preset_workload, trace_workload
from tests.sim.helpers import small_cluster


def test_presets_match_table3_shapes() -> None:
    for name, n_inst, reqs, g, mx, mean in (("moonlight", 32, 3200, 8, 65536, 22386),
                                            ("qwen2vl-72b", 16, 9600, 16, 40960, 7615),
                                            ("kimi-k2", 8, 6400, 8, 98304, 38959)):
        w = preset_workload(name, sigma=1.0)
        d = w.describe()
        assert (d["instances"], d["requests"], d["group_size"], d["max_tokens"]) == (n_inst, reqs, g, mx)
        assert abs(d["mean_tokens"] - mean) / mean < 0.002
        assert max(max(gr.lengths) for gr in w.groups) <= mx


def test_length_model_mean_cap_and_correlation() -> None:
    lens = LengthModel(5000, 40960, sigma=1.0, icc=0.7).sample(2000, 8, seed=1)
    assert abs(lens.mean() - 5000) < 5 and lens.max() <= 40960 and lens.min() >= 1
    icc, _, _ = icc_anova(np.log(lens[(lens < 40960).all(axis=1)]))
    assert 0.62 < icc < 0.76
    assert (LengthModel(5000, 40960, 1.0, 0.7).sample(10, 4, seed=3) == LengthModel(5000, 40960, 1.0, 0.7).sample(
        10, 4, seed=3)).all()
    with pytest.raises(ValueError):
        LengthModel(50000, 40960)


def test_trace_icc_on_real_data() -> None:
    stats = trace_icc(load_trace("data/math_cot_groups.jsonl"))
    assert 0.6 < stats["icc"] < 0.9 and stats["groups"] == 50


def test_to_groups_at_quantum() -> None:
    w = Workload("t", (WorkloadGroup(33, (10, 64, 1000)), WorkloadGroup(20, (0, 5, 7))), 512, small_cluster())
    gs = w.to_groups(16)
    assert [len(f) for f in gs[0].forced] == [1, 4, 32]         # ceil, capped at max_tokens
    assert gs[0].params.max_tokens == 32 and len(gs[0].prompt_token_ids) == 3
    ids = [f[0] for g in gs for f in g.forced]
    assert len(set(ids)) == len(ids)                              # one dummy token per response
    assert gs[1].true_lengths == (1, 1, 1)


def test_default_quantum_scales_with_tokens() -> None:
    assert default_quantum(preset_workload("qwen2vl-72b")) >= 32
    w = Workload("t", (WorkloadGroup(10, (100, 200)),), 200, small_cluster())
    assert default_quantum(w) == 1


def write_jsonl_gz(path, records) -> None:  # noqa: ANN001
    with gzip.open(path, "wt") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_bad_input_gives_clear_errors(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="unknown workload 'gpt5'.*moonlight"):
        preset_workload("gpt5")
    bad = tmp_path / "sizes.jsonl.gz"
    write_jsonl_gz(bad, [{"group_id": "a", "prompt_len": 5, "output_lens": [1, 2, 3]},
                         {"group_id": "b", "prompt_len": 5, "output_lens": [1, 2]}])
    with pytest.raises(ValueError, match=r"sizes.jsonl.gz:2: group 'b' has 2 responses, but earlier groups have 3"):
        trace_workload(bad, small_cluster())
    neg = tmp_path / "neg.jsonl.gz"
    write_jsonl_gz(neg, [{"group_id": "a", "prompt_len": 5, "output_lens": [1, -2, 3]}])
    with pytest.raises(ValueError, match="negative"):
        trace_workload(neg, small_cluster())
    with pytest.raises(FileNotFoundError):
        trace_workload(tmp_path / "missing.jsonl", small_cluster())
    with pytest.raises(ValueError, match="different sizes"):
        Workload("t", (WorkloadGroup(10, (1, 2)), WorkloadGroup(10, (1,))), 10, small_cluster())
    with pytest.raises(ValueError, match="negative"):
        Workload("t", (WorkloadGroup(10, (1, -2)),), 10, small_cluster())


def test_trace_workloads_both_formats() -> None:
    w = trace_workload("data/math_cot_groups.jsonl", small_cluster(), limit=3)
    assert w.has_token_ids and w.group_size == 8 and w.to_groups(1)[0].forced[0] == w.groups[0].token_ids[0]
    c = trace_workload("data/castillo_sample.jsonl.gz", small_cluster(), limit=5)
    assert not c.has_token_ids and c.group_size == 10
    assert set(PRESETS) == {"moonlight", "qwen2vl-72b", "kimi-k2"}
