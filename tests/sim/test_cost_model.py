"""Roofline cost model: regimes, monotonicity, MoE weight traffic, quantum pricing, KV transfers, profiles."""

from __future__ import annotations

import pytest

from seer.engine.scheduler import ScheduledChunk, SchedulerOutput
from seer.sim.cost_model import CostConstants, CostModel, StepSummary
from seer.sim.hardware import InstanceSpec, get_accelerator, get_model

H800 = get_accelerator("h800")


def model(name: str = "qwen2-vl-72b", gpus: int = 8, **kw: float) -> CostModel:
    return CostModel(InstanceSpec(H800, get_model(name), gpus), CostConstants(**kw))


def test_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    cm = model()
    c, m, _ = cm.components(StepSummary.decode(64, 64 * 4000))
    assert m > c
    c, m, _ = cm.components(StepSummary(1, 8192, 8192, 8192 * 4096))
    assert c > m


def test_decode_step_matches_hand_roofline() -> None:
    cm = model(step_overhead_s=0.0, memory_efficiency=1.0)
    inst = cm.instance
    s = StepSummary.decode(1, 0.0)
    weights = inst.model.weight_bytes / 8 / H800.hbm_bandwidth
    kv = inst.model.kv_bytes_per_token / 8 / H800.hbm_bandwidth
    _, m, _ = cm.components(s)
    assert m == pytest.approx(weights + kv)


def test_more_tokens_or_context_never_cheaper() -> None:
    cm = model()
    base = cm.step_time(StepSummary.decode(32, 32 * 1000))
    assert cm.step_time(StepSummary.decode(32, 32 * 2000)) > base
    assert cm.step_time(StepSummary.decode(32, 32 * 1000, tokens_per_seq=4)) >= base
    assert cm.step_time(StepSummary(0, 0, 0, 0)) == 0.0


def test_overheads_add() -> None:
    a = model(step_overhead_s=0.0).step_time(StepSummary.decode(10, 1000))
    b = model(step_overhead_s=0.01, per_seq_overhead_s=0.001).step_time(StepSummary.decode(10, 1000))
    assert b - a == pytest.approx(0.02)


def test_moe_reads_more_experts_with_more_tokens() -> None:
    m = get_model("kimi-k2")
    one, many, huge = m.weight_bytes_read(1), m.weight_bytes_read(64), m.weight_bytes_read(1e6)
    assert one < many < huge <= m.weight_bytes * 1.0001
    assert one == pytest.approx(m.active_params * m.weight_bytes_per_param)
    assert get_model("qwen2-vl-72b").weight_bytes_read(1) == get_model("qwen2-vl-72b").weight_bytes


def test_kv_bytes_per_token_gqa_and_mla() -> None:
    assert get_model("qwen2-vl-72b").kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    assert get_model("moonlight-16b-a3b").kv_bytes_per_token == 27 * 576 * 2


def test_quantum_price_is_q_real_steps() -> None:
    cm = model()
    out = SchedulerOutput([ScheduledChunk("a", 10, 1, 0, True), ScheduledChunk("b", 20, 3, 0, True)])
    s1 = cm.summarize(out, 1)
    assert (s1.num_seqs, s1.num_tokens) == (2, 4)
    assert s1.context_tokens == pytest.approx(10.5 + 21.5)
    s64 = cm.summarize(out, 64)
    assert s64.context_tokens == pytest.approx(64 * s1.context_tokens)
    assert cm.price(out, 64) == pytest.approx(64 * cm.step_time(s64))
    assert cm.price(SchedulerOutput([]), 8) == 0.0


def test_transfer_time() -> None:
    cm = model(pool_bandwidth=10e9, pool_latency_s=0.001)  # per GPU, 8 GPUs
    assert cm.transfer_time(0) == 0.0
    assert cm.transfer_time(8e9) == pytest.approx(0.101)


def test_kv_capacity_from_memory_and_override() -> None:
    spec = InstanceSpec(H800, get_model("qwen2-vl-72b"), 8)
    assert 1_000_000 < spec.kv_capacity_tokens < 1_400_000
    assert InstanceSpec(H800, get_model("qwen2-vl-72b"), 8, kv_tokens=5000).kv_capacity_tokens == 5000


def test_bad_profiles_are_rejected() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        InstanceSpec(H800, get_model("kimi-k2"), 1)
    with pytest.raises(ValueError, match="unknown accelerator"):
        get_accelerator("tpu")
    with pytest.raises(ValueError, match="unknown model"):
        get_model("gpt-9")
    with pytest.raises(ValueError):
        CostConstants(compute_efficiency=0)
