"""Seeds derived for groups, siblings, instances and unseeded requests never coincide."""

from __future__ import annotations

from seer.engine.config import EngineConfig
from seer.sampling_params import group_seed, mix_seed, sibling_seed


def test_derived_seeds_are_distinct_at_seed_zero() -> None:
    """With a linear mix, group g's seed equalled sibling g's of group 0 at run seed 0: two responses of one
    rollout drew the same random numbers."""
    groups = [group_seed(0, step, g) for step in range(3) for g in range(64)]
    responses = [sibling_seed(s, i) for s in groups for i in range(16)]
    assert len(set(responses)) == len(responses) == 3 * 64 * 16
    assert group_seed(0, 0, 1) != sibling_seed(0, 1)
    assert sibling_seed(5, 0) == 5 and sibling_seed(None, 3) is None and group_seed(None, 0, 1) is None
    assert all(0 <= s < 2**63 for s in responses)


def test_mixing_is_stable_and_tagged() -> None:
    assert mix_seed("a", 1, 2) == mix_seed("a", 1, 2) != mix_seed("b", 1, 2)
    assert mix_seed("a", 12, 3) != mix_seed("a", 1, 23)


def test_each_instance_samples_from_a_stream_of_its_own() -> None:
    base = EngineConfig(dtype="float32", seed=0)
    seeds = {base.for_instance(i).seed for i in range(8)}
    assert len(seeds) == 8 and base.for_instance(3) == base.for_instance(3)


def test_unseeded_responses_get_a_seed_of_their_own_per_rollout() -> None:
    """Where a response's chunks run must not change what it samples, and no two responses may share a stream."""
    from types import SimpleNamespace

    from seer.rollout.driver import RolloutDriver
    from seer.rollout.policies import get_policy
    from seer.rollout.types import GroupInput
    from seer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=8)
    groups = [GroupInput((1, 2, 3), 4, params), GroupInput((4, 5), 4, params)]
    inst = SimpleNamespace(instance_id=0)

    def seeds(seed: int | None) -> list[int | None]:
        driver = RolloutDriver(get_policy("context"), [inst], groups, seed=seed)  # type: ignore[list-item]
        return [driver.specs[r].params.seed for r in sorted(driver.specs)]

    first = seeds(7)
    assert None not in first and len(set(first)) == 8 and first == seeds(7) and set(first).isdisjoint(seeds(8))
    assert seeds(None) == [None] * 8
