"""The driver side of serving: a listener hears every chunk and finished group, and ``abort`` ends responses
early (buffered ones at once, running ones at their chunk end) with their KV freed; untouched groups are
unaffected."""

from __future__ import annotations

import pytest

from seer.rollout.types import GroupInput, RolloutListener
from seer.sampling_params import SamplingParams
from tests.server.conftest import check_engines_clean, make_coordinator


def groups() -> list[GroupInput]:
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    return [GroupInput(tuple(range(5 + i, 15 + i)), 3, sp, key=f"p{i}") for i in range(3)]


class Recorder(RolloutListener):
    def __init__(self) -> None:
        self.driver = None
        self.tokens: dict[tuple[int, int], list[int]] = {}
        self.finished: dict[tuple[int, int], str | None] = {}
        self.groups_done: list[int] = []
        self.aborted_group1 = False

    def on_start(self, driver) -> None:
        self.driver = driver
        driver.abort(0, [0])  # before the first dispatch: finishes with no tokens

    def on_tokens(self, group_id, index, new_token_ids, new_logprobs, finished, finish_reason) -> None:
        assert len(new_token_ids) == len(new_logprobs)
        assert (group_id, index) not in self.finished, "tokens after the end"
        self.tokens.setdefault((group_id, index), []).extend(new_token_ids)
        if finished:
            self.finished[(group_id, index)] = finish_reason
        if group_id == 1 and not self.aborted_group1:
            self.aborted_group1 = True
            self.driver.abort(1)

    def on_group_done(self, group_id) -> None:
        assert all((group_id, i) in self.finished for i in range(3))
        self.groups_done.append(group_id)


@pytest.mark.parametrize("policy", ["context", "divided"])
def test_abort_through_the_listener(tiny_model, policy):
    with make_coordinator(tiny_model, policy=policy, engine={"num_kv_blocks": 128}) as coord:
        reference = coord.rollout(groups(), progress=False).result.responses
        rec = Recorder()
        out = coord.rollout(groups(), progress=False, listener=rec)
        res = out.result
        by_key = {(r.group_id, r.index): r for r in res.responses}
        assert by_key[(0, 0)].finish_reason == "abort" and by_key[(0, 0)].token_ids == []
        for i in range(3):
            r = by_key[(1, i)]
            assert r.finish_reason == "abort" and len(r.token_ids) < 40
        untouched = [r for r in res.responses if r.group_id == 2 or (r.group_id == 0 and r.index > 0)]
        ref = {(r.group_id, r.index): r.token_ids for r in reference}
        assert all(r.token_ids == ref[(r.group_id, r.index)] and r.finish_reason == "length" for r in untouched)
        assert res.stats["aborted"] == 4
        assert sorted(rec.groups_done) == [0, 1, 2]
        assert rec.tokens == {k: r.token_ids for k, r in by_key.items()}
        assert rec.finished == {k: r.finish_reason for k, r in by_key.items()}
        rec.driver.buffer.check_integrity()
        check_engines_clean(coord)


def test_abort_of_unknown_or_finished_groups_is_harmless(tiny_model):
    class Late(RolloutListener):
        def on_start(self, driver) -> None:
            driver.abort(99)

    with make_coordinator(tiny_model, engine={"num_kv_blocks": 128}) as coord:
        out = coord.rollout(groups(), progress=False, listener=Late())
        assert out.result.stats["aborted"] == 0
        assert all(r.finish_reason == "length" for r in out.result.responses)
        check_engines_clean(coord)
