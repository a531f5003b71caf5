"""The driver over torch-free fake instances: every policy returns exactly G responses per group with the same
deterministic tokens, divided policies never preempt, KV moves through the pool, faults lose nothing."""

import pytest

from seer.engine.block_manager import BlockManager
from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.scheduled import ScheduledInstance
from seer.rollout.policies import get_policy
from seer.rollout.types import FaultPlan, GroupInput, RolloutStalled
from seer.sampling_params import SamplingParams
from tests.engine.fake_model import fake_execute


class FakeInstance(ScheduledInstance):
    """Deterministic 'model' (next token = f(context)); a step costs 1 ms + 0.1 ms per token."""

    def __init__(self, iid, num_blocks=64, block_size=4, max_num_seqs=8):
        super().__init__(iid, Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64),
                                        BlockManager(num_blocks, block_size)), eos_token_ids=(0,))
        self.pool: dict = {}

    def execute(self, out: SchedulerOutput):
        return fake_execute(out, self.scheduler.requests), 1e-3 + 1e-4 * out.num_batched_tokens

    def save_kv(self, req: Request) -> int:
        FakeInstance.shared_pool[int(req.request_id)] = req.num_computed_tokens
        return req.num_computed_tokens * 10

    def load_kv(self, req: Request, request_id: int) -> tuple[int, str]:
        n = FakeInstance.shared_pool.pop(request_id, 0)
        if not n:
            return 0, "pool_miss"
        self.counters["kv_bytes_loaded"] += n * 10
        return n, ""

    def discard_kv(self, request_id: int) -> None:
        FakeInstance.shared_pool.pop(request_id, None)

    def kv_cost(self, elapsed_s: float, nbytes: int) -> float:
        return 1e-7 * nbytes  # deterministic, like the step price


def test_time_split_sums_to_the_makespan_and_kv_moves_are_charged():
    res = run("divided")
    m = res.metrics
    for parts in zip(m.compute_s, m.draft_s, m.kv_s, m.idle_s):
        assert sum(parts) == pytest.approx(m.makespan_s)
    assert sum(m.kv_s) == pytest.approx(1e-7 * m.kv_bytes_moved)  # every byte moved was paid for, once
    assert 0 < m.kv_frac < 1 and m.reprefill_reasons == {}


class ForgetfulInstance(FakeInstance):
    """Writes nothing to the pool, so every import misses."""

    def save_kv(self, req: Request) -> int:
        return req.num_computed_tokens * 10


def test_a_pool_miss_recomputes_and_says_why():
    FakeInstance.shared_pool = {}
    insts = [ForgetfulInstance(i) for i in range(2)]
    res = RolloutDriver(get_policy("divided"), insts, groups(), chunk_tokens=8).run()
    assert res.stats["kv_sources"].get("pool", 0) > 0
    reasons = res.metrics.reprefill_reasons
    assert set(reasons) == {"pool_miss"} and reasons["pool_miss"] == res.metrics.reprefill_tokens > 0
    assert [len(v) for v in res.groups().values()] == [4] * 6
    reference = run("verl", n_inst=1, num_blocks=512).responses
    assert [r.token_ids for r in res.responses] == [r.token_ids for r in reference]


def groups(n=6, g=4, max_tokens=40):
    out = []
    for i in range(n):
        out.append(GroupInput(tuple(range(1 + i, 8 + 2 * i)), g, SamplingParams(temperature=0, max_tokens=max_tokens),
                              key=f"p{i}", true_lengths=(max_tokens,) * g))
    return out


def run(policy, n_inst=2, fault=None, **kw):
    FakeInstance.shared_pool = {}
    insts = [FakeInstance(i, **kw) for i in range(n_inst)]
    drv = RolloutDriver(get_policy(policy), insts, groups(), chunk_tokens=8, fault=fault)
    res = drv.run()
    drv.buffer.check_integrity()
    for inst in insts:
        inst.scheduler.check_integrity()
    return res


@pytest.mark.parametrize("policy", ["verl", "divided", "context", "oracle"])
def test_policies_agree_and_return_g(policy):
    ref = run("verl", n_inst=1, num_blocks=512)
    res = run(policy)
    assert [len(v) for v in res.groups().values()] == [4] * 6
    assert [r.token_ids for r in res.responses] == [r.token_ids for r in ref.responses]
    assert all(r.finish_time_s is not None for r in res.responses)
    if policy != "verl":
        assert res.metrics.preemptions == 0


def test_verl_preempts_under_kv_pressure_divided_does_not():
    verl = run("verl", num_blocks=30)
    divided = run("divided", num_blocks=30)
    assert verl.metrics.preemptions > 0 and divided.metrics.preemptions == 0
    assert [r.token_ids for r in verl.responses] == [r.token_ids for r in divided.responses]


def test_chunks_reserving_part_of_their_kv_run_larger_batches_without_preempting():
    """Under KV pressure, chunks that reserve 4 of their 8 tokens ahead fit more requests per step than whole
    chunks do, end early where KV runs out instead of preempting, and emit the same tokens."""
    runs = {}
    for ahead in (None, 4):
        FakeInstance.shared_pool = {}
        insts = [FakeInstance(i, num_blocks=30) for i in range(2)]
        drv = RolloutDriver(get_policy("divided"), insts, groups(), chunk_tokens=8, chunk_reserve_tokens=ahead)
        runs[ahead] = drv.run()
        drv.buffer.check_integrity()
        for inst in insts:
            inst.check_integrity()
    whole, part = runs[None], runs[4]
    assert part.metrics.preemptions == 0 and part.metrics.reprefill_tokens == 0
    assert part.metrics.mean_batch > whole.metrics.mean_batch
    assert [r.token_ids for r in part.responses] == [r.token_ids for r in whole.responses]


def test_divided_moves_requests_between_instances_through_pool():
    res = run("divided", n_inst=3, num_blocks=40)
    moved = [r for r in res.responses if len(set(r.instance_history)) > 1]
    assert moved and res.metrics.kv_bytes_moved > 0
    assert res.metrics.reprefill_tokens == 0


def test_instance_failure_loses_nothing():
    ref = run("divided")
    res = run("divided", fault=FaultPlan(instance_id=1, at_s=0.01))
    assert res.stats["failed_instances"] == 1
    assert [len(v) for v in res.groups().values()] == [4] * 6
    assert [r.token_ids for r in res.responses] == [r.token_ids for r in ref.responses]


class DyingInstance(FakeInstance):
    """Its process dies after a few chunk starts: the next start finds it gone."""

    def start(self, chunk):
        self.starts = getattr(self, "starts", 0) + 1
        if self.starts > 5:
            raise InstanceLost(self.instance_id)
        super().start(chunk)


def test_an_instance_found_dead_at_a_chunk_start_loses_nothing():
    ref = run("divided")
    FakeInstance.shared_pool = {}
    insts = [FakeInstance(0), DyingInstance(1)]
    drv = RolloutDriver(get_policy("divided"), insts, groups(), chunk_tokens=8)
    res = drv.run()
    drv.buffer.check_integrity()
    assert res.stats["failed_instances"] == 1 and drv.alive == {0}
    assert [len(v) for v in res.groups().values()] == [4] * 6
    assert [r.token_ids for r in res.responses] == [r.token_ids for r in ref.responses]


def test_stats_are_per_rollout_on_instances_that_outlive_it():
    FakeInstance.shared_pool = {}
    insts = [FakeInstance(i, num_blocks=30) for i in range(2)]
    stats = []
    for _ in range(2):
        for inst in insts:
            inst.begin_rollout()
        res = RolloutDriver(get_policy("verl"), insts, groups(), chunk_tokens=8).run()
        stats.append(res.stats["instances"])
    assert stats[0][0]["preemptions"] > 0 and stats[0][0]["output_tokens"] > 0
    for key in ("output_tokens", "chunks"):  # the same rollout again: the same counts, not twice them
        assert [s[key] for s in stats[1].values()] == [s[key] for s in stats[0].values()]


def test_chunk_that_fits_nowhere_is_an_error_not_a_hang():
    with pytest.raises((RolloutStalled, ValueError)):
        run("divided", num_blocks=3)


class RecordingInstance(FakeInstance):
    """Records, per chunk started, the request, the instance and whether the driver marked it critical."""

    chunks: list[tuple[int, int, bool]] = []

    def start(self, chunk):
        super().start(chunk)
        req = self.scheduler.requests[str(chunk.spec.request_id)]
        assert req.critical == chunk.critical  # the engine's request carries it to the draft planner
        RecordingInstance.chunks.append((chunk.spec.request_id, self.instance_id, chunk.critical))


def test_chunks_of_a_critical_request_are_marked_and_no_other():
    FakeInstance.shared_pool, RecordingInstance.chunks = {}, []
    lengths = [(200, 8, 8, 8)] + [(8, 8, 8, 8)] * 5  # one runaway: critical once the rest fits beside it
    gs = [GroupInput((1, 2, 3, 4 + i), 4, SamplingParams(temperature=0, max_tokens=200), key=f"p{i}",
                     true_lengths=n, stop_lengths=n) for i, n in enumerate(lengths)]
    insts = [RecordingInstance(i, num_blocks=256) for i in range(3)]
    drv = RolloutDriver(get_policy("oracle+critical"), insts, gs, chunk_tokens=8, critical_speedup=lambda b: b,
                        critical_companions=1)
    res = drv.run()
    drv.buffer.check_integrity()
    marked = {(rid, iid) for rid, iid, critical in RecordingInstance.chunks if critical}
    longest = max(res.responses, key=lambda r: len(r.token_ids)).request_id
    assert marked and {rid for rid, _ in marked} == {longest}
    assert res.stats["critical_isolated"] >= 1
    assert drv.buffer.critical.measured.seen == sum(len(t) for t in drv.decisions.values())  # every step fed


def test_steps_are_not_fitted_where_no_companion_is_allowed():
    FakeInstance.shared_pool = {}
    gs = [GroupInput((1, 2, 3, 4 + i), 4, SamplingParams(temperature=0, max_tokens=64), key=f"p{i}",
                     true_lengths=(64, 8, 8, 8), stop_lengths=(64, 8, 8, 8)) for i in range(3)]
    drv = RolloutDriver(get_policy("oracle+critical"), [FakeInstance(i, num_blocks=256) for i in range(3)], gs,
                        chunk_tokens=8, critical_speedup=lambda b: b)
    drv.run()
    assert drv.buffer.critical.measured.seen == 0
