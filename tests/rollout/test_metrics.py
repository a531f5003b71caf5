"""Metrics against hand-computed values, and the bench comparison shape."""

from __future__ import annotations

import json

import pytest

from seer.rollout.metrics import REPORT_KEYS, ResponseRecord, busy_time, compare, compute_metrics, percentile


def ten_responses() -> list[ResponseRecord]:
    # finish times 1..10 s, 100 tokens each
    return [ResponseRecord(float(t), 100, request_id=t) for t in range(1, 11)]


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 5.0  # rank ceil(5) = 5
    assert percentile(values, 90) == 9.0  # rank 9
    assert percentile(values, 99) == 10.0  # rank ceil(9.9) = 10
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile([7.0], 1) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_busy_time_merges_overlaps_and_clips() -> None:
    assert busy_time([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], 10.0) == 4.0
    assert busy_time([(8.0, 12.0), (-1.0, 1.0)], 10.0) == 3.0
    with pytest.raises(ValueError):
        busy_time([(2.0, 1.0)], 10.0)


def test_compute_metrics_by_hand() -> None:
    m = compute_metrics(
        ten_responses(), [[(0.0, 10.0)], [(0.0, 4.0), (6.0, 8.0)]],
        preemptions=3, reprefill_tokens=50, kv_bytes_moved=4096,
    )
    assert m.makespan_s == 10.0 and m.throughput_tok_s == 100.0
    assert (m.p50_s, m.p90_s, m.p99_s) == (5.0, 9.0, 10.0)
    assert m.tail_s == 1.0  # 90% (9 of 10) had finished at 9 s
    assert m.idle_frac == [0.0, pytest.approx(0.4)]
    assert (m.preemptions, m.reprefill_tokens, m.kv_bytes_moved) == (3, 50, 4096)
    assert (m.num_responses, m.generated_tokens) == (10, 1000)
    assert set(REPORT_KEYS) <= set(m.to_dict())


def test_compute_metrics_rejects_empty_or_degenerate_input() -> None:
    with pytest.raises(ValueError, match="no responses"):
        compute_metrics([], [])
    with pytest.raises(ValueError, match="positive"):
        compute_metrics([ResponseRecord(0.0, 5)], [])


def test_compare_shape_and_values() -> None:
    verl = compute_metrics(ten_responses(), [[(0.0, 10.0)]])
    fast = compute_metrics([ResponseRecord(t.finish_time_s / 2, 100) for t in ten_responses()], [[(0.0, 5.0)]])
    report = compare({"verl": verl, "seer": fast.to_dict()})
    assert set(report) == {"policies", "speedup_vs_verl", "tail_reduction_vs_verl"}
    assert report["speedup_vs_verl"] == {"verl": 1.0, "seer": 2.0}
    assert report["tail_reduction_vs_verl"] == {"verl": 0.0, "seer": 0.5}
    assert report["policies"]["seer"]["idle_frac"] == [0.0]
    json.dumps(report)
    with pytest.raises(ValueError, match="baseline"):
        compare({"seer": fast})
    with pytest.raises(ValueError, match="lacks"):
        compare({"verl": verl, "bad": {"makespan_s": 1.0}})


def test_reference_ratios_only_for_pairs_that_both_ran() -> None:
    from seer.rollout.metrics import reference_ratios
    ratios = reference_ratios({"context": 90.0, "oracle": 100.0, "verl": 50.0})
    assert ratios == {"context_vs_oracle": pytest.approx(0.9)}
    full = reference_ratios({"context": 90.0, "oracle": 100.0, "group-oracle": 95.0})
    assert set(full) == {"context_vs_oracle", "group_oracle_vs_oracle", "context_vs_group_oracle"}
