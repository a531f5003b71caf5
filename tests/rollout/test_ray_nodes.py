"""Two Ray nodes on one machine (loopback only): instances are placed on both, and requests that move between
instances carry their KV through the object store instead of being prefilled again."""

from __future__ import annotations

import pytest

from seer.engine.speculator import SpecConfig
from seer.rollout.coordinator import RolloutCoordinator
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from tests.conftest import rollout_config
from tests.models.helpers import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("nodes"), family="qwen2", seed=3)


def _groups() -> list[GroupInput]:
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    return [GroupInput(tuple(range(5 + i, 17 + 2 * i)), 4, sp, key=f"p{i}") for i in range(4)]


def _config(**kw: object):  # noqa: ANN202
    return rollout_config(**{"instances": 2, "dtype": "float32", "block_size": 4, "num_kv_blocks": 24,
                             "chunk_tokens": 6, "spec": SpecConfig(adaptive=False), **kw})


@pytest.fixture
def two_nodes(monkeypatch):  # noqa: ANN001, ANN201
    """A head and a worker node, one CPU each, both on 127.0.0.1, with this process connected as the driver."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes(timeout=60)
        cluster.connect()
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_instances_on_two_nodes_move_kv_through_the_object_store(tiny, two_nodes):
    with RolloutCoordinator(tiny, _config(instances=1, backend="inprocess", num_kv_blocks=400)) as ref:
        reference = [r.token_ids for r in ref.rollout(_groups(), policy="verl", progress=False).result.responses]
    assert len(two_nodes.nodes()) == 2
    with RolloutCoordinator(tiny, _config(backend="ray")) as c:
        out = c.rollout(_groups(), policy="divided", progress=False)
    nodes = {st["node"] for st in out.result.stats["instances"].values()}
    assert len(nodes) == 2, f"both instances on one node: {out.result.stats['instances']}"
    assert out.metrics.kv_bytes_moved > 0 and out.metrics.reprefill_tokens == 0
    assert [r.token_ids for r in out.result.responses] == reference
