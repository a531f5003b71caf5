"""The rollout coordinator on the real engine (tiny random model): every policy returns exactly G responses
with the same greedy tokens, migrations cost no re-prefill, weights never mix, instance failure loses nothing."""

import os
import signal
import time
from dataclasses import replace

import pytest

from seer.engine.speculator import SpecConfig
from seer.rollout.config import default_instance_engine
from seer.rollout.coordinator import RolloutConfig, RolloutCoordinator
from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.host import HostSpec, build_instance
from seer.rollout.types import FaultPlan, GroupInput, RolloutStalled
from seer.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen2", 3)


def groups(n=4, g=4, max_tokens=24):
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [GroupInput(tuple(range(5 + i, 17 + 2 * i)), g, sp, key=f"p{i}",
                       stop_lengths=tuple(8 + (3 * i + 5 * j) % 17 for j in range(g)),
                       true_lengths=tuple(8 + (3 * i + 5 * j) % 17 for j in range(g))) for i in range(n)]


def coordinator(tiny, engine=None, **kw):
    """``engine``: fields of the instances' engine to change; ``kw``: fields of the rollout."""
    base = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=48)
    cfg: dict = dict(instances=2, chunk_tokens=6, spec=SpecConfig(adaptive=False))
    cfg.update(kw)
    return RolloutCoordinator(tiny, RolloutConfig(engine=replace(base, **(engine or {})), **cfg))


@pytest.fixture(scope="module")
def reference(tiny):
    with coordinator(tiny, instances=1, engine={"num_kv_blocks": 400}) as c:
        return [r.token_ids for r in c.rollout(groups(), policy="verl", progress=False).result.responses]


@pytest.mark.parametrize("policy", ["verl", "divided", "context", "seer", "seer-paper", "oracle", "context+critical"])
def test_policies_return_g_identical_greedy(tiny, reference, policy):
    with coordinator(tiny) as c:
        out = c.rollout(groups(), policy=policy, progress=False)
    res = out.result
    assert [len(v) for v in res.groups().values()] == [4] * 4
    assert [r.token_ids for r in res.responses] == reference
    assert all(rec["weight_version"] == 0 for rec in out.records())
    if policy != "verl":
        assert res.metrics.preemptions == 0
    assert out.onpolicy["responses_by_version"] == {"0": 16} and out.onpolicy["warnings"] == []
    assert out.onpolicy["kv_imports_by_version"] == {"0": res.stats["kv_sources"].get("pool", 0)}
    if policy == "seer":
        assert res.stats["spec"]["steps"] > 0
        by_source = out.onpolicy["drafts_by_source"]  # every prompt differs: no history to draft from
        assert by_source["group"]["drafted"] == res.stats["spec"]["drafted"] and by_source["history"]["drafted"] == 0


def test_migration_through_pool_has_no_reprefill(tiny, reference):
    with coordinator(tiny, instances=3, engine={"num_kv_blocks": 24}) as c:
        res = c.rollout(groups(), policy="divided", progress=False).result
    moved = [r for r in res.responses if len(set(r.instance_history)) > 1]
    assert moved, "expected some requests to change instance"
    assert res.metrics.reprefill_tokens == 0 and res.metrics.kv_bytes_moved > 0
    assert res.metrics.reprefill_reasons == {}                 # no import fell back to recomputation
    assert sum(res.metrics.kv_s) > 0 and res.metrics.kv_frac > 0  # the moves were on the clock
    assert [r.token_ids for r in res.responses] == reference


def test_tree_drafts_stay_inside_their_chunk_so_divided_never_preempts(tiny, reference):
    """Admission reserves a chunk's KV and nothing more: a tree's every node takes a slot, so its node budget
    is capped by the slots left in the chunk, or the engine would have to preempt under tight KV."""
    spec = SpecConfig(adaptive=False, k_branches=2, gamma_max=4, tree_tokens=12)
    with coordinator(tiny, engine={"num_kv_blocks": 30}, spec=spec) as c:
        res = c.rollout(groups(), policy="seer", progress=False).result
    assert res.metrics.preemptions == 0 and res.metrics.reprefill_tokens == 0
    assert res.stats["spec"]["steps"] > 0 and sum(res.metrics.draft_s) > 0
    assert [r.token_ids for r in res.responses] == reference


def test_update_weights_changes_outputs_and_version(tiny, reference):
    with coordinator(tiny) as c:
        state = {k: v.clone() for k, v in c.backend.engines[0].model.state_dict().items()}
        for k in state:
            if k.endswith("mlp.down_proj.weight"):
                state[k] = state[k] * 1.5
        assert c.update_weights(state) == 1
        assert all(e.model is c.backend.engines[0].model for e in c.backend.engines)  # one copy, updated once
        out = c.rollout(groups(), policy="context", progress=False)
    assert {rec["weight_version"] for rec in out.records()} == {1}
    assert out.onpolicy["instance_versions"] == [1, 1] and out.onpolicy["warnings"] == []
    assert list(out.onpolicy["kv_imports_by_version"]) == ["1"]  # the pool was emptied with the old weights
    assert [r.token_ids for r in out.result.responses] != reference


def test_killing_an_instance_loses_nothing(tiny, reference):
    with coordinator(tiny) as c:
        res = c.rollout(groups(), policy="context", progress=False, fault=FaultPlan(1, at_s=0.0)).result
    assert res.stats.get("failed_instances") == 1
    assert [len(v) for v in res.groups().values()] == [4] * 4
    assert [r.token_ids for r in res.responses] == reference


def test_bad_config_errors(tiny):
    with pytest.raises(ValueError, match="unknown policy"):
        RolloutConfig(policy="fastest")
    with pytest.raises(ValueError, match="group size"):
        GroupInput((1, 2), 0, SamplingParams())
    with pytest.raises(FileNotFoundError):
        RolloutCoordinator("/nonexistent/model")


@pytest.mark.parametrize("policy", ["verl", "seer"])
def test_process_backend_matches_inprocess(tiny, reference, policy):
    with coordinator(tiny, backend="local") as c:
        out = c.rollout(groups(), policy=policy, progress=False)
    assert [len(v) for v in out.result.groups().values()] == [4] * 4
    assert [r.token_ids for r in out.result.responses] == reference
    if policy == "seer":  # every backend reports its drafting, summed over the workers' replicas
        spec = out.result.stats["spec"]
        assert spec["steps"] > 0 and spec["tau"] >= 1.0 and spec["accepted"] <= spec["drafted"]
        assert spec["by_source"]["group"]["drafted"] + spec["by_source"]["history"]["drafted"] == spec["drafted"]


def test_process_backend_survives_a_killed_instance(tiny, reference):
    groups_ = groups(n=4, g=4, max_tokens=24)
    with coordinator(tiny, backend="local") as c:
        out = c.rollout(groups_, policy="context", progress=False, fault=FaultPlan(1, at_s=0.0))
    res = out.result
    assert res.stats.get("failed_instances") == 1
    assert [len(v) for v in res.groups().values()] == [4] * 4
    assert [r.token_ids for r in res.responses] == reference


def test_a_worker_without_a_step_profile_refuses_adaptive_drafting(tiny):
    cfg = RolloutConfig(engine=replace(default_instance_engine(), dtype="float32", num_kv_blocks=16))
    hs = HostSpec(0, cfg.instance_engine(tiny), None, SpecConfig(adaptive=True), None)
    with pytest.raises(ValueError, match="adaptive speculation needs"):
        build_instance(hs)


def test_process_backend_reports_a_worker_that_stops_answering(tiny):
    with coordinator(tiny, backend="local", stall_timeout_s=3.0) as c:
        c.rollout(groups(n=1, g=2), policy="divided", progress=False)  # the workers are up
        frozen = c.backend.transport.procs[1]
        os.kill(frozen.pid, signal.SIGSTOP)  # it will take chunks and never answer
        t0 = time.monotonic()
        sp = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
        long = [GroupInput(tuple(range(5 + i, 17 + i)), 4, sp, key=f"long{i}") for i in range(4)]
        try:
            with pytest.raises(RolloutStalled, match="no instance made progress|instance 1 did not answer") as err:
                c.rollout(long, policy="divided", progress=False)
        finally:
            os.kill(frozen.pid, signal.SIGKILL)
        assert time.monotonic() - t0 < 60
        assert "stall timeout" in str(err.value)  # the diagnosis names the silent instance and the timeout


def test_an_eviction_from_a_dead_worker_is_a_loss_at_once(tiny):
    """The driver may evict from a worker that died a moment ago, before its loop noticed: that is the instance
    lost (InstanceLost, its requests recompute elsewhere), found within a second, not a 60 s stall."""
    with coordinator(tiny, backend="local") as c:
        c.rollout(groups(n=1, g=2), policy="divided", progress=False)  # the workers are up
        proxy, proc = c.backend.proxies[1], c.backend.transport.procs[1]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        t0 = time.monotonic()
        with pytest.raises(InstanceLost):
            proxy.evict(12345)
        assert time.monotonic() - t0 < 5


@pytest.mark.slow
def test_ray_backend_matches_inprocess(tiny, reference, local_ray):
    with coordinator(tiny, backend="ray") as c:
        for policy in ("verl", "seer"):
            out = c.rollout(groups(), policy=policy, progress=False)
            assert [r.token_ids for r in out.result.responses] == reference
        out = c.rollout(groups(), policy="divided", progress=False, fault=FaultPlan(1, at_s=0.2))
        assert [len(v) for v in out.result.groups().values()] == [4] * 4
        assert [r.token_ids for r in out.result.responses] == reference


def test_more_instances_than_the_machine_holds(tiny):
    with pytest.raises(ValueError, match="instances need about"):
        RolloutCoordinator(tiny, RolloutConfig(instances=64,
                                               engine=replace(default_instance_engine(), kv_cache_memory_gb=8.0)))
    with pytest.raises(ValueError, match="cores"):
        RolloutCoordinator(tiny, RolloutConfig(instances=64, backend="local",
                                               engine=replace(default_instance_engine(), num_kv_blocks=16)))


def test_counters_are_per_rollout(tiny):
    with coordinator(tiny, engine={"num_kv_blocks": 24}) as c:
        first = c.rollout(groups(), policy="verl", progress=False).metrics
        second = c.rollout(groups(), policy="divided", progress=False).metrics
    assert first.preemptions > 0 and second.preemptions == 0 and second.reprefill_tokens == 0
