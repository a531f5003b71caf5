"""The rollout report plot draws every policy, its time split and the bound without error."""

from seer.rollout.plots import plot_rollout

from .test_driver import run


def test_plot_has_all_policies_time_split_and_bound(tmp_path):
    results = {name: run(name) for name in ("verl", "divided")}
    path = plot_rollout(results, tmp_path / "r.png", "two policies", bound_s=0.05)
    assert path.is_file() and path.stat().st_size > 10_000
