"""Two Ray nodes on one machine (loopback only): instances are placed on both, and requests that move between
instances carry their KV through the object store instead of being prefilled again."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from tests.models.helpers import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]


def groups() -> list[GroupInput]:
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    return [GroupInput(tuple(range(5 + i, 17 + 2 * i)), 4, sp, key=f"p{i}") for i in range(4)]


def config(engine: dict | None = None, **kw: object) -> RolloutConfig:
    """Chunks of 6 tokens and KV for 96 tokens per instance: requests outgrow an instance's KV and move often.
    ``engine``: fields of the instances' engine to change; ``kw``: fields of the rollout."""
    base = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=24)
    cfg: dict = {"instances": 2, "chunk_tokens": 6, "spec": SpecConfig(adaptive=False), **kw}
    return RolloutConfig(engine=replace(base, **(engine or {})), **cfg)


@pytest.mark.slow
def test_instances_on_two_nodes_move_kv_through_the_object_store(tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("ray")
    model = make_tiny_model_dir(tmp_path, family="qwen2", seed=3)
    with RolloutCoordinator(model, config(instances=1, backend="inprocess", engine={"num_kv_blocks": 400})) as ref:
        reference = [r.token_ids for r in ref.rollout(groups(), policy="verl", progress=False).result.responses]
    proc = subprocess.run([sys.executable, "-m", "tests.rollout.two_node_run", str(model)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cluster_nodes"] == 2
    assert len(set(got["instance_nodes"])) == 2, f"both instances on one node: {got['instance_nodes']}"
    # moved with their KV; the only prompt recomputed is where a target had no free blocks for an import (a
    # capacity fallback), never a transfer that failed between the nodes
    assert got["kv_bytes_moved"] > 0 and set(got["reprefill_reasons"]) <= {"no_free_blocks"}
    assert got["tokens"] == reference
