"""Model-free replay: exact counters on a synthetic trace, and ours beats the naive drafter on real data."""

from __future__ import annotations

from pathlib import Path

import pytest

from seer.data.traces import TraceGroup, TraceResponse, load_trace
from seer.spec.draft import Draft
from seer.spec.metrics import SpecCounters
from seer.spec.replay import Cursor, ReplayConfig, replay_naive, replay_trace, spec_replay_report

MATH_COT = Path(__file__).resolve().parents[2] / "data" / "math_cot_groups.jsonl"
RESP = tuple(range(10, 30))  # 20 distinct tokens


def twin_group(gid: str = "t") -> TraceGroup:
    r = TraceResponse(RESP, len(RESP))
    return TraceGroup(gid, (1, 2, 3), 3, (r, r), {})


def test_cursor_greedy_semantics() -> None:
    c = SpecCounters()
    cur = Cursor([1], [5, 6, 7, 8], c, gamma=8)
    assert cur.step(Draft.linear([5, 6, 9])) == [5, 6, 7]  # two accepted, bonus 7
    assert cur.step(Draft()) == [8] and cur.done  # plain step
    assert (c.drafted, c.accepted, c.bonus, c.steps, c.plain_steps) == (3, 2, 1, 1, 1)
    end = SpecCounters()
    Cursor([1], [5, 6], end, gamma=8).step(Draft.linear([5, 6, 7]))
    assert (end.accepted, end.bonus) == (2, 0)  # accepted up to the end: no bonus token exists


def test_twin_responses_known_answer() -> None:
    cfg = ReplayConfig(modes=("n0", "n1", "interleaved"), prefix_len=3)
    out = replay_trace([twin_group()], cfg)
    # n1: drafts 8 (all accepted) + bonus, again, then the last 2 tokens with no bonus: 20 tokens in 3 steps.
    for name in ("linear", "k2", "k4"):
        assert out["tau"]["n1"][name] == pytest.approx(20 / 3)
        assert out["accept_rate"]["n1"][name] == 1.0
        assert out["counters"]["n1"][name]["steps"] == 6  # two responses
    # n0: distinct tokens, nothing to draft from.
    assert out["counters"]["n0"]["linear"]["steps"] == 0 and out["tau"]["n0"]["linear"] == 0.0
    assert out["tokens_per_step"]["n0"]["linear"] == 1.0
    # interleaved: both start together, so neither is ever ahead of the other.
    assert out["counters"]["interleaved"]["linear"]["accepted"] == 0
    naive = replay_naive([twin_group()], ns=(1,))  # no prompt tail: the first token is a plain step
    assert naive["tau"]["n1"] == pytest.approx(19 / 3) and naive["counters"]["n1"]["plain_steps"] == 2


def test_report_shape_and_errors() -> None:
    rep = spec_replay_report([twin_group("a"), twin_group("b")], ReplayConfig(modes=("n1", "n7")))
    assert set(rep["tau"]) == {"n1", "n7"} and set(rep["tau"]["n7"]) == {"linear", "k2", "k4"}
    assert set(rep["accept_rate"]["n1"]) == {"linear", "k2", "k4"} and set(rep["naive"]["tau"]) == {"n1", "n7"}
    with pytest.raises(ValueError, match="unknown replay mode"):
        ReplayConfig(modes=("n-1",))
    with pytest.raises(ValueError, match="unknown drafter"):
        ReplayConfig(drafters=("k3",))
    lengths_only = TraceGroup("x", None, 3, (TraceResponse(None, 4),), {})
    with pytest.raises(ValueError, match="token ids"):
        replay_trace([lengths_only])


def test_beats_naive_on_real_groups() -> None:
    groups = load_trace(MATH_COT, limit=2)
    ours = replay_trace(groups, ReplayConfig(modes=("n1", "n7"), drafters=("linear", "k4")))
    naive = replay_naive(groups, ns=(1, 7))
    for mode in ("n1", "n7"):
        assert ours["tau"][mode]["linear"] > naive["tau"][mode]
        assert ours["tokens_per_step"][mode]["linear"] > naive["tokens_per_step"][mode]
        assert ours["tau"][mode]["k4"] > ours["tau"][mode]["linear"]
        assert ours["tau"][mode]["k4"] <= 9.0
