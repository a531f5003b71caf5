"""The on-policy report: versions, KV imports by version, drafts by source, and its warnings."""

import logging

import pytest

from seer.rollout.onpolicy import OnPolicyMonitor

SPEC = {"drafted": 1000, "accept_rate": 0.6, "by_source": {"group": {"drafted": 900}, "history": {"drafted": 100}}}


def test_a_clean_rollout_reports_its_version_everywhere() -> None:
    mon = OnPolicyMonitor()
    rep = mon.report(3, [3, 3], 3, 16, {"pool": 7, "fresh": 16}, SPEC)
    assert rep["weight_version"] == 3 and rep["responses_by_version"] == {"3": 16}
    assert rep["instance_versions"] == [3, 3] and rep["kv_imports_by_version"] == {"3": 7}
    assert rep["drafts_by_source"] == SPEC["by_source"] and rep["running_accept_rate"] is None
    assert rep["warnings"] == []
    mon.check_integrity()


def test_kv_of_other_weights_and_disagreeing_instances_are_warned(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="seer.rollout.onpolicy"):
        rep = OnPolicyMonitor().report(2, [2, 1], 1, 8, {"pool": 4}, None)
    assert rep["kv_imports_by_version"] == {"1": 4} and "drafts_by_source" not in rep
    assert len(rep["warnings"]) == 2 and "version 1" in rep["warnings"][0] and "[1, 2]" in rep["warnings"][1]
    assert len(caplog.records) == 2


def test_an_acceptance_drop_is_warned_once_there_is_a_running_mean() -> None:
    mon = OnPolicyMonitor(drop_ratio=0.5, min_drafted=200, min_history=2)
    assert mon.report(0, [0], 0, 8, {}, {**SPEC, "accept_rate": 0.2})["warnings"] == []  # no history yet
    mon = OnPolicyMonitor(drop_ratio=0.5, min_drafted=200, min_history=2)
    for rate in (0.6, 0.7):
        assert mon.report(0, [0], 0, 8, {}, {**SPEC, "accept_rate": rate})["warnings"] == []
    small = mon.report(0, [0], 0, 8, {}, {**SPEC, "drafted": 50, "accept_rate": 0.0})  # too few drafts to judge
    assert small["warnings"] == [] and mon.accept_rates == [0.6, 0.7]
    assert mon.report(0, [0], 0, 8, {}, {**SPEC, "accept_rate": 0.4})["warnings"] == []  # above half of 0.65
    drop = mon.report(0, [0], 0, 8, {}, {**SPEC, "accept_rate": 0.1})
    assert len(drop["warnings"]) == 1 and "0.100" in drop["warnings"][0]
    assert drop["running_accept_rate"] == pytest.approx((0.6 + 0.7 + 0.4) / 3)
    mon.check_integrity()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="drop_ratio"):
        OnPolicyMonitor(drop_ratio=1.5)
