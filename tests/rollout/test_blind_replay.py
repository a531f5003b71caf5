"""Replay is as blind as production: nothing decides by a response's recorded length or its future tokens.

The check: lengthen one recorded response (its text up to the old end unchanged) and replay both traces. Every
step any instance started before that response's old finish must be scheduled identically (same requests, same
positions, same draft lengths), since nothing a real run knows by then differs. A budget taken from the sample's
longest response, a draft cap at the recorded end or a scheduler reading the recorded length would each show up
as an earlier difference.
"""

from __future__ import annotations

import json
import random

import pytest

from seer.engine.block_manager import BlockManager
from seer.engine.scheduler import Scheduler, SchedulerConfig
from seer.engine.speculator import SpecConfig, Speculator
from seer.rollout.driver import RolloutDriver
from seer.rollout.policies import get_policy
from seer.rollout.workload import ReplayOptions, groups_from_trace
from seer.sim.cost_model import CostConstants, CostModel
from seer.sim.pool import SimKVPool
from seer.sim.sim_instance import SimInstance
from seer.spec.draft_server import DraftServer
from tests.sim.helpers import small_cluster

VOCAB = 128
COST = CostModel(small_cluster().instance, CostConstants(draft_s_per_request=2e-4))


def write_trace(path, extend: int = 0) -> tuple[int, int]:
    """Token-id groups whose siblings share most of their text; the shortest response of the last group gets
    ``extend`` more tokens (its longer siblings' text offers it drafts past its old end, so a draft cap at the
    recorded end would show). Returns (group index, response index) of that response."""
    rng = random.Random(3)
    records = []
    for g in range(6):
        base = [rng.randrange(3, VOCAB) for _ in range(120)]
        lengths = [rng.randint(15, 45) for _ in range(4)]
        responses = [[t if rng.random() > 0.1 else rng.randrange(3, VOCAB) for t in base[:n]] for n in lengths]
        records.append({"group_id": f"g{g}", "prompt_token_ids": [rng.randrange(3, VOCAB) for _ in range(6 + g)],
                        "responses": [{"token_ids": r} for r in responses], "max_tokens": 96})
    last = records[-1]["responses"]
    shortest = min(range(len(last)), key=lambda i: len(last[i]["token_ids"]))
    last[shortest]["token_ids"] += [rng.randrange(3, VOCAB) for _ in range(extend)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records) - 1, shortest


def replay(groups, policy: str):
    pol = get_policy(policy)
    server = DraftServer() if pol.speculative else None
    pool = SimKVPool()
    instances = []
    for i in range(3):
        spec = Speculator(server, None, SpecConfig(gamma_max=4, adaptive=False)) if server is not None else None
        sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, max_model_len=120),
                          BlockManager(48, 4, True))
        instances.append(SimInstance(i, sched, COST, pool=pool, speculator=spec))
    driver = RolloutDriver(pol, instances, groups, chunk_tokens=8,
                           draft_server=server, critical_speedup=(lambda b: b) if pol.critical else None)
    return driver.run(), driver.busy


def steps_before(result, busy, cut: float) -> dict[int, list[tuple]]:
    return {iid: [trace for trace, (start, _) in zip(result.decisions[iid], busy[iid]) if start < cut]
            for iid in result.decisions}


@pytest.mark.parametrize("policy", ["verl", "context", "context+critical", "seer", "seer-paper"])
def test_lengthening_a_response_changes_nothing_before_its_old_end(tmp_path, policy: str) -> None:
    short, long = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    g, i = write_trace(short)
    write_trace(long, extend=40)
    before = groups_from_trace(short, VOCAB, ReplayOptions())
    after = groups_from_trace(long, VOCAB, ReplayOptions())
    assert before[g].params.max_tokens == after[g].params.max_tokens == 96  # the trace's limit, not a length
    res_a, busy_a = replay(before, policy)
    res_b, busy_b = replay(after, policy)
    target = next(r for r in res_a.responses if r.group_id == g and r.index == i)
    cut = target.finish_time_s
    assert cut is not None and cut > 0.3 * res_a.metrics.makespan_s  # a long stretch of the run is compared
    compared = steps_before(res_a, busy_a, cut)
    assert sum(len(s) for s in compared.values()) > 40
    assert compared == steps_before(res_b, busy_b, cut)
    longer = next(r for r in res_b.responses if r.group_id == g and r.index == i)
    assert len(longer.token_ids) == len(target.token_ids) + 40
