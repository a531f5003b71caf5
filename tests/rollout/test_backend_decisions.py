"""One rollout, three backends, the same decisions: in-process instances on virtual time, local processes and
Ray actors on the wall clock give the same tokens, place every response on the same instance and count the
same scheduler work (chunks, output tokens, preemptions, recomputed and moved KV).

verl pins groups to instances up front and KV is ample, so nothing here depends on timing; what does (how many
steps the work took, prompt tokens a prefix-cache hit saved when starts arrive between two steps) is left out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from tests.conftest import TinyModelDir

INSTANCE_COUNTERS = ("chunks", "output_tokens", "preemptions", "reprefill_tokens", "kv_bytes_saved",
                     "kv_bytes_loaded", "spec_steps")
DRIVER_COUNTERS = ("tokens", "emitted", "preemptions", "evictions", "kv_bytes_moved", "failed_instances")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: TinyModelDir) -> str:
    return str(tiny_model_dir("qwen2", 3))


def groups() -> list[GroupInput]:
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    return [GroupInput(tuple(range(5 + i, 17 + 2 * i)), 4, sp, key=f"p{i}",
                       stop_lengths=tuple(8 + (3 * i + 5 * j) % 17 for j in range(4))) for i in range(4)]


def decisions(tiny: str, backend: str) -> dict[str, Any]:
    engine = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=400)
    cfg = RolloutConfig(instances=2, chunk_tokens=6, engine=engine, spec=SpecConfig(adaptive=False), backend=backend,
                        stall_timeout_s=30.0)
    with RolloutCoordinator(tiny, cfg) as c:
        res = c.rollout(groups(), policy="verl", progress=False).result
    st = res.stats
    return {"tokens": [r.token_ids for r in res.responses],
            "finish": [r.finish_reason for r in res.responses],
            "instances": [r.instance_history for r in res.responses],
            "driver": {k: st[k] for k in DRIVER_COUNTERS}, "kv_sources": st["kv_sources"],
            "per_instance": {i: {k: s[k] for k in INSTANCE_COUNTERS} for i, s in st["instances"].items()},
            "kv_entries_dropped": st["kv_entries_dropped"]}


@pytest.fixture(scope="module")
def reference(tiny: str) -> dict[str, Any]:
    ref = decisions(tiny, "inprocess")
    assert set(ref["per_instance"]) == {0, 1} and all(len(set(h)) == 1 for h in ref["instances"])
    return ref


def test_local_processes_decide_as_in_process(tiny: str, reference: dict[str, Any]) -> None:
    assert decisions(tiny, "local") == reference


@pytest.mark.slow
def test_ray_actors_decide_as_in_process(tiny: str, reference: dict[str, Any], local_ray: Any) -> None:
    assert decisions(tiny, "ray") == reference
