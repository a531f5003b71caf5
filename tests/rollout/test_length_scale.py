"""``--length-scale auto``: the scale search, the measured decode rate and the CLI's resolution of it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from seer.engine.config import EngineConfig
from seer.rollout.arguments import build_groups, length_scale_arg, resolve_auto_length_scale
from seer.rollout.length_scale import MIN_SCALE, auto_length_scale, measure_decode_rate
from seer.rollout.workload import ReplayOptions
from tests.conftest import TinyModelDir


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: TinyModelDir) -> Path:
    return tiny_model_dir("llama", 0)


def scaler(lengths: list[int], max_len: int | None = None):
    return lambda s: [ReplayOptions(s, max_len).scale(n) for n in lengths]


def test_the_scale_fills_the_target_and_no_more() -> None:
    # 80 responses of 100 tokens over 2 instances at 100 tok/s each: 40 s at full length, 12 s at x0.3
    assert auto_length_scale(scaler([100] * 80), instances=2, rate_tok_s=100.0, target_s=12.0) == 0.3
    assert auto_length_scale(scaler([100] * 80), instances=4, rate_tok_s=100.0, target_s=12.0) == 0.6


def test_a_fast_machine_gets_the_whole_trace_and_a_slow_one_the_floor() -> None:
    assert auto_length_scale(scaler([100] * 8), instances=2, rate_tok_s=1000.0) == 1.0
    assert auto_length_scale(scaler([10_000] * 800), instances=1, rate_tok_s=1.0) == MIN_SCALE


def test_a_length_cap_leaves_room_for_a_larger_scale() -> None:
    lengths = [1000] + [100] * 79
    uncapped = auto_length_scale(scaler(lengths), instances=2, rate_tok_s=100.0, target_s=12.0)
    capped = auto_length_scale(scaler(lengths, max_len=30), instances=2, rate_tok_s=100.0, target_s=12.0)
    assert capped > uncapped
    assert sum(scaler(lengths, 30)(capped)) / 2 / 100.0 <= 12.0


@pytest.mark.parametrize("rate, instances, target", [(0.0, 1, 1.0), (10.0, 0, 1.0), (10.0, 1, 0.0)])
def test_bad_inputs_are_named(rate: float, instances: int, target: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        auto_length_scale(scaler([10]), instances, rate, target)


def test_the_decode_rate_is_measured_and_threads_are_restored(model_dir: Path) -> None:
    before = torch.get_num_threads()
    rate = measure_decode_rate(EngineConfig(model=str(model_dir), dtype="float32", num_threads=1), batch=4, steps=3)
    assert rate > 0
    assert torch.get_num_threads() == before


def test_the_cli_accepts_auto_or_a_number() -> None:
    assert length_scale_arg("auto") == "auto"
    assert length_scale_arg("0.25") == 0.25
    with pytest.raises(argparse.ArgumentTypeError, match="'auto'"):
        length_scale_arg("short")


def rollout_args(**kw: object) -> argparse.Namespace:
    from seer.rollout.arguments import add_rollout_args

    p = argparse.ArgumentParser()
    add_rollout_args(p)
    args = p.parse_args(["--trace", "data/math_cot_groups.jsonl", "--limit", "2", "--instances", "2",
                         "--threads", "1", "--dtype", "float32"])
    vars(args).update(kw)
    return args


def test_auto_resolves_to_a_scale_and_builds_the_groups(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    args = rollout_args(length_scale="auto")
    groups = build_groups(args, model_dir)
    assert isinstance(args.length_scale, float) and MIN_SCALE <= args.length_scale <= 1.0
    assert "--length-scale auto: one instance decodes" in capsys.readouterr().err
    expected = build_groups(rollout_args(length_scale=args.length_scale), model_dir)
    assert [g.true_lengths for g in groups] == [g.true_lengths for g in expected]


def test_auto_is_for_traces_only(model_dir: Path) -> None:
    args = rollout_args(length_scale="auto", trace=None, prompts="data/gsm8k_test.jsonl")
    with pytest.raises(ValueError, match="--trace replay only"):
        build_groups(args, model_dir)


def test_resolution_uses_the_trace_lengths(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seer.rollout.length_scale as ls

    monkeypatch.setattr(ls, "measure_decode_rate", lambda config: 1e9)
    assert resolve_auto_length_scale(rollout_args(), model_dir) == 1.0
    monkeypatch.setattr(ls, "measure_decode_rate", lambda config: 1e-3)
    assert resolve_auto_length_scale(rollout_args(), model_dir) == MIN_SCALE
