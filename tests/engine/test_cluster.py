"""`ray_address`: the engine joins an existing multi-node Ray cluster and trains clients on every node."""

import numpy as np
import pytest

from fedsim.engine.ray_engine import RayEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data
from fedsim.scenarios import load_scenario
from fedsim.training.trainer import TrainSettings


@pytest.fixture
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_clients_are_trained_on_both_nodes(two_node_cluster):
    scenario = load_scenario(
        "quickstart",
        [
            "rounds=2",
            "data.num_clients=12",
            "privacy.sampling=all",
            "privacy.sampling_rate=none",
            "engine.eval_every=2",
            f"engine.ray_address={two_node_cluster.address!r}",
        ],
    )
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    engine = RayEngine(data, settings, num_workers=2, num_cpus=1, address=scenario.engine.ray_address)
    try:
        assert len({info["node_id"] for info in engine.infos}) == 2  # one actor per 1-CPU node
        nodes = []
        result = run_scenario(scenario, write=False, engine=_Recording(engine, nodes))
    finally:
        engine.close()
    assert len(set(nodes)) == 2
    assert all(
        r["non_private"]["received"] == r["non_private"]["cohort"] == len(data.train_clients)
        for r in result.rows
    )
    assert np.all(np.isfinite(result.weights))


class _Recording:
    """Wraps the engine to record which node trained each client."""

    def __init__(self, engine, nodes):
        self.engine, self.nodes = engine, nodes

    def train(self, plan, weights):
        partial, metrics = self.engine.train(plan, weights)
        self.nodes.extend(m["node"] for m in metrics)
        return partial, metrics

    def evaluate(self, ids, weights):
        return self.engine.evaluate(ids, weights)
