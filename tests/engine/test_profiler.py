"""The verify-cost profile: which batch sizes it measures, and a table the policy can trust."""

from seer.engine.config import EngineConfig
from seer.engine.llm_engine import LLMEngine
from seer.engine.profiler import GROWTH, LONG_CONTEXT, MIN_CONTEXT, monotone, profile_plan, profile_verify_cost


def test_plan_shortens_the_context_so_large_batches_are_measured() -> None:
    # 136 blocks of 16 (a rollout bench's budget): the full context fits only up to batch 4
    plan = profile_plan(136, 16, 256, context=128)
    assert [b for b, _ in plan] == [1, 4, 16]
    assert plan[0] == (1, 128) and plan[1] == (4, 128)
    for batch, ctx in plan:
        assert MIN_CONTEXT <= ctx <= 128 and batch * (ctx + GROWTH) <= 136 * 16
    assert [b for b, _ in profile_plan(10_000, 16, 256, 128)] == [1, 4, 16, 48]
    assert [b for b, _ in profile_plan(10_000, 16, 20, 128)] == [1, 4, 16]  # max_num_seqs bounds it
    assert profile_plan(3, 16, 256, 128) == []


def test_monotone_removes_noisy_dips() -> None:
    table = [[48.0, 50.0, 49.0], [35.0, 37.0, 60.0], [90.0, 80.0, 120.0]]
    assert monotone(table) == [[48.0, 50.0, 50.0], [48.0, 50.0, 60.0], [90.0, 90.0, 120.0]]


def test_profile_measures_batches_beyond_the_full_context_fit(tiny_llama, tmp_path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=136, block_size=16))
    cost = profile_verify_cost(engine, repeats=1, cache_dir=tmp_path)
    assert cost.batch_sizes == [1.0, 4.0, 16.0]
    # a batch's sequences share one prompt: computed once, plus the block of its last token for each other one
    plan = profile_plan(136, 16, 256, 128)
    shared = sum(ctx + (b - 1) * 16 for b, ctx in plan) + plan[0][1]  # (the warm-up is the first batch again)
    # one sequence at the table's context and a long one prices the longer contexts
    long = min(LONG_CONTEXT, 136 * 16, engine.scheduler.config.max_model_len) - GROWTH
    assert engine.stats.prompt_tokens_computed == shared + plan[0][1] + long
    assert shared < sum(b * ctx for b, ctx in plan)
    assert cost.context == plan[0][1] and cost.pair_s >= 0 and cost.read_s >= 0
    assert all(a <= b for row in cost.times_s for a, b in zip(row, row[1:]))
    assert all(a <= b for col in zip(*cost.times_s) for a, b in zip(col, col[1:]))
    assert not engine.has_unfinished() and engine.block_manager.num_free_blocks == 136
    engine.block_manager.check_integrity()
    again = profile_verify_cost(engine, repeats=1, cache_dir=tmp_path)  # from the cache
    assert again.times_s == cost.times_s and again.pair_s == cost.pair_s and again.read_s == cost.read_s
