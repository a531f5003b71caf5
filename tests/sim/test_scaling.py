"""Cluster scaling: a preset at another size keeps its load per instance, its fitted unknowns and one quantum."""

from __future__ import annotations

import pytest

from seer.sim.fitted import preset_setup
from seer.sim.scaling import markdown, scaling


def test_a_preset_at_another_size_keeps_its_groups_per_instance() -> None:
    native, cluster, constants = preset_setup("moonlight")
    small, small_cluster, small_constants = preset_setup("moonlight", instances=4)
    assert small_cluster.num_instances == 4 and cluster.num_instances == 32
    assert len(small.groups) == len(native.groups) * 4 // 32
    assert small_cluster.instance == cluster.instance and small_constants == constants
    assert small.max_tokens == native.max_tokens
    with pytest.raises(ValueError, match="instances must be >= 1"):
        preset_setup("moonlight", instances=0)


def test_scaling_reports_every_size_with_one_quantum() -> None:
    out = scaling("moonlight", [1, 2])
    assert [row["instances"] for row in out["sizes"]] == [1, 2]
    assert [row["groups"] for row in out["sizes"]] == [12, 25]
    for row in out["sizes"]:
        assert row["speedup"]["verl"] == 1.0 and row["speedup"]["seer"] > 0
        assert row["policies"]["seer"]["makespan_s"] > 0
    assert out["quantum"] >= 1
    table = markdown(out)
    assert table.splitlines()[0].startswith("| instances | groups |") and len(table.splitlines()) == 4
