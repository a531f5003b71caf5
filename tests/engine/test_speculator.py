"""The speculator's critical-path weights: estimated remaining length relative to the batch mean."""

from __future__ import annotations

import pytest

from seer.engine.request import Request
from seer.sampling_params import SamplingParams
from seer.spec.policy import critical_weights


def _req(rid: str, hint: float | None) -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(max_tokens=64))
    req.remaining_hint = hint
    return req


def test_weights_follow_remaining_hints() -> None:
    assert critical_weights([None, None]) == [1.0, 1.0]  # no estimates: plain throughput
    w = critical_weights([None, 100.0, 300.0])
    assert w == pytest.approx([1.0, 0.5, 1.5])
    assert critical_weights([0.0, 3.0]) == pytest.approx([0.5, 1.5])  # floor of one token
