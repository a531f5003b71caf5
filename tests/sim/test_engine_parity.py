"""The simulator and the real engine make the same scheduling decisions.

Both sides run the same ``RolloutDriver`` over instances that extend ``ScheduledInstance``: on one side
``EngineInstance`` (a tiny random-weight Qwen2 behind the engine's scheduler, forced-token replay of a small
token-id trace, every forward pass really run), on the other ``SimInstance`` (the same scheduler configuration,
no model). Step durations come from one roofline ``CostModel`` on both sides (the engine prices each step before
running it), pool transfers cost nothing on either side, so the only thing that could differ is a decision.
The test asserts that the two ``SchedulerOutput`` sequences are identical per instance, for the baseline
(continuous batching with preemption), every divided ordering and grouped speculation, under KV pressure.
Drafting and pool transfers are priced on both sides (per drafting request; per KV token moved, at the simulated
model's bytes per token), so every cost the clock carries is part of what must agree.
"""

from __future__ import annotations

import random

import pytest
import torch

from seer.engine.block_manager import BlockManager
from seer.engine.config import EngineConfig
from seer.engine.llm_engine import LLMEngine
from seer.engine.scheduler import Scheduler
from seer.engine.speculator import SpecConfig, Speculator
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.engine import EngineInstance
from seer.rollout.kv_pool import LocalKVPool
from seer.rollout.policies import get_policy
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from seer.sim.cost_model import CostConstants, CostModel
from seer.sim.pool import SimKVPool
from seer.sim.sim_instance import SimInstance
from seer.spec.draft_server import DraftServer
from tests.sim.helpers import small_cluster

VOCAB = 128
INSTANCES = 2
COST = CostModel(small_cluster().instance, CostConstants(draft_s_per_request=2e-4))


def trace(groups: int = 6, size: int = 4, seed: int = 0) -> list[GroupInput]:
    """Token-id groups inside the tiny vocabulary: siblings copy a shared base response with a few edits
    (so sibling drafts are accepted), group lengths differ (so the orderings have something to decide)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(3, VOCAB) for _ in range(6 + g))
        base_len = rng.randint(12, 60)
        base = [rng.randrange(3, VOCAB) for _ in range(base_len + 16)]
        forced = []
        for _ in range(size):
            resp = [t if rng.random() > 0.1 else rng.randrange(3, VOCAB) for t in base]
            forced.append(tuple(resp[:max(4, base_len + rng.randint(-8, 8))]))
        params = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
        out.append(GroupInput(prompt, size, params, key=f"p{g}", forced=tuple(forced),
                              true_lengths=tuple(len(f) for f in forced)))
    return out


class PricedEngineInstance(EngineInstance):
    """The engine with a cost model: a transfer costs what the simulator charges for the same number of KV
    tokens (the simulated model's bytes per token, not the tiny model's)."""

    def kv_cost(self, elapsed_s: float, nbytes: int) -> float:
        tokens = nbytes // self.engine.model_config.kv_bytes_per_token(torch.float32)
        return COST.transfer_time(COST.kv_bytes(tokens)) if tokens else 0.0


def speculators(speculative: bool) -> tuple[list[Speculator | None], DraftServer | None]:
    if not speculative:
        return [None] * INSTANCES, None
    server = DraftServer()
    return [Speculator(server, None, SpecConfig(gamma_max=4, adaptive=False)) for _ in range(INSTANCES)], server


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):  # noqa: ANN001, ANN201
    return tiny_model_dir("qwen2", 5, vocab_size=VOCAB)


@pytest.mark.parametrize("policy", ["verl", "divided", "context", "seer", "seer-paper", "oracle"])
def test_simulator_and_engine_make_identical_decisions(tiny, policy: str) -> None:  # noqa: ANN001
    pol = get_policy(policy)
    cfg = EngineConfig(model=str(tiny), dtype="float32", block_size=4, num_kv_blocks=36, max_num_seqs=6,
                       max_num_batched_tokens=32, num_threads=1, decode_reserve=False)  # as rollout instances
    engines = [LLMEngine(cfg) for _ in range(INSTANCES)]  # fresh: no prefix cache left by another rollout
    groups = trace()

    specs, server = speculators(pol.speculative)
    shared = LocalKVPool(1 << 28)  # one global KV pool, as in the in-process backend
    real = [PricedEngineInstance(i, e, shared, s, cost_model=COST)
            for i, (e, s) in enumerate(zip(engines, specs))]
    speedup = (lambda b: min(b, 4.0)) if pol.critical else None  # the same placement rule on both sides
    eng = RolloutDriver(pol, real, groups, chunk_tokens=8, draft_server=server,
                        critical_speedup=speedup).run()

    specs, server = speculators(pol.speculative)
    pool = SimKVPool()
    sims = [SimInstance(i, Scheduler(e.scheduler.config, BlockManager(e.block_manager.num_blocks, cfg.block_size,
                                                                      cfg.enable_prefix_caching)),
                        COST, pool=pool, speculator=s, check=True)
            for i, (e, s) in enumerate(zip(engines, specs))]
    sim = RolloutDriver(pol, sims, groups, chunk_tokens=8, draft_server=server,
                        critical_speedup=speedup).run()

    assert sum(len(steps) for steps in sim.decisions.values()) > 50
    assert sim.decisions == eng.decisions                      # the same SchedulerOutput sequence, step by step
    assert [r.finish_time_s for r in sim.responses] == [r.finish_time_s for r in eng.responses]
    assert [r.instance_history for r in sim.responses] == [r.instance_history for r in eng.responses]
    assert [r.token_ids for r in sim.responses] == [r.token_ids for r in eng.responses] == \
        [list(f) for g in groups for f in g.forced or ()]
    for key in ("preemptions", "evictions", "kv_sources"):
        assert sim.stats[key] == eng.stats[key], key
    assert sim.metrics.reprefill_tokens == eng.metrics.reprefill_tokens
    if policy == "verl":
        assert sim.metrics.preemptions > 0                     # KV pressure: the baseline preempts
    else:                                                      # divided rollout moves KV between instances,
        assert sim.stats["kv_sources"].get("pool", 0) > 0       # through the pool, with nothing recomputed
        assert eng.metrics.reprefill_tokens == 0
    if pol.speculative:
        assert sum(i.scheduler.stats.spec_accepted for i in sims) > 0
        assert sum(eng.metrics.draft_s) > 0
    if pol.divided:
        assert sum(eng.metrics.kv_s) > 0 and eng.metrics.reprefill_reasons == {}
    for split in (sim.metrics, eng.metrics):                 # where the time went sums to the makespan
        for parts in zip(split.compute_s, split.draft_s, split.kv_s, split.idle_s):
            assert sum(parts) == pytest.approx(split.makespan_s)
    assert sim.metrics.kv_s == eng.metrics.kv_s and sim.metrics.draft_s == eng.metrics.draft_s
