"""Run one rollout on a two-node Ray cluster on this machine and print what the test checks, as JSON.

    python -m tests.rollout.two_node_run MODEL_DIR

A process of its own: a Ray cluster started by ``ray.cluster_utils.Cluster`` in a process where earlier tests
already started and stopped Ray runtimes could hang while connecting, so the test runs this with a timeout.
"""

from __future__ import annotations

import json
import os
import sys


def main(model_dir: str) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read at import: keeps Ray on loopback
    import ray
    from ray.cluster_utils import Cluster

    from seer.rollout.coordinator import RolloutCoordinator
    from tests.rollout.test_ray_nodes import config, groups

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes(timeout=60)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        with RolloutCoordinator(model_dir, config(backend="ray")) as c:
            out = c.rollout(groups(), policy="divided", progress=False)
        print(json.dumps({"cluster_nodes": len(ray.nodes()),
                          "instance_nodes": [st.get("node") for st in out.result.stats["instances"].values()],
                          "kv_bytes_moved": out.metrics.kv_bytes_moved,
                          "reprefill_reasons": out.metrics.reprefill_reasons,
                          "tokens": [r.token_ids for r in out.result.responses]}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
