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


def test_held_tokens_reach_the_draft_server_only_when_published() -> None:
    """Virtual time computes a step when it starts: its tokens must wait for its end, or an instance starting
    meanwhile would draft from tokens that do not exist yet at its start."""
    from seer.engine.scheduler import ScheduledChunk, SchedulerOutput, StepResult
    from seer.engine.speculator import SpecConfig, Speculator
    from seer.spec.draft_server import DraftRequest, DraftServer

    server = DraftServer()
    spec = Speculator(server, None, SpecConfig(adaptive=False))
    sibling = DraftRequest("g", "2", [9, 7, 8], 3)
    spec.hold = True
    req = Request("1", [1, 2, 3], SamplingParams(max_tokens=64), group_id="g")
    spec.track(req)
    req.output_token_ids = [7, 8, 9, 7, 8]
    spec.after_update(SchedulerOutput([ScheduledChunk("1", 3, 5, 0, True)]), {"1": StepResult([7, 8, 9, 7, 8])},
                      {"1": req})
    assert len(server.propose_one(sibling)) == 0
    spec.publish()
    assert list(server.propose_one(sibling).token_ids) == [9, 7, 8]


def test_draft_length_is_bounded_by_the_budget_not_by_a_recording() -> None:
    """A replayed response's recorded end is an EOS found when emitted: drafts near it are as long as anywhere."""
    from seer.engine.speculator import SpecConfig, Speculator
    from seer.spec.draft_server import DraftServer

    spec = Speculator(DraftServer(), None, SpecConfig(gamma_max=8, adaptive=False))
    req = Request("1", [1, 2, 3], SamplingParams(max_tokens=64), forced_token_ids=[5] * 12)
    req.output_token_ids = [5] * 10
    assert spec._room(req) == 64 - 10 - 1
    req.stop_after, req.forced_token_ids = 11, None
    assert spec._room(req) == 64 - 10 - 1 and req.max_output_tokens == 64
    req.append_output(5, 0.0)
    assert req.check_stop(4096) == "stop"


def test_tree_drafts_take_no_more_kv_slots_than_the_chunk_has_left() -> None:
    """Admission reserves a chunk's KV and nothing more, and every node of a tree draft takes a slot when it is
    verified: near the chunk's end the node budget shrinks to the slots left, the depth with it."""
    from types import SimpleNamespace

    from seer.engine.speculator import SpecConfig, Speculator
    from seer.spec.draft_server import DraftServer

    asked = []

    class Recording(DraftServer):
        def propose(self, reqs):  # type: ignore[no-untyped-def]
            asked.extend(reqs)
            return super().propose(reqs)

    spec = Speculator(Recording(), None, SpecConfig(adaptive=False, k_branches=2, gamma_max=4, tree_tokens=12))
    far = Request("1", [1, 2, 3], SamplingParams(max_tokens=64), group_id="g")
    near = Request("2", [1, 2, 3], SamplingParams(max_tokens=64), group_id="g")
    for req, end in ((far, 32), (near, 8)):
        req.output_token_ids = [5] * 5
        req.num_computed_tokens = req.num_tokens - 1
        req.chunk_end = end
    spec.before_schedule(SimpleNamespace(running=[far, near], waiting=[]))  # type: ignore[arg-type]
    budget = {r.stream_id: (r.max_tokens, r.max_depth) for r in asked}
    assert budget["1"] == (8, 4)   # gamma 4, two branches: 8 nodes, well inside the chunk
    assert budget["2"] == (2, 2)   # 8 - 5 - 1 = 2 slots left before the bonus token: 2 nodes, depth 2
