"""The Flower message path and the engine path of DPFedAvg give the same aggregate for the same inputs and seed."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.engine.ray_engine import LocalEngine
from fedsim.experiment import build_data
from fedsim.scenarios import load_scenario
from fedsim.strategies import DPFedAvg
from fedsim.training.trainer import TrainSettings, initial_weights


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_task_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_run_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)


class Grid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return self.nodes


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_message_path_equals_engine_path(sampling):
    scenario = load_scenario("quickstart", ["data.num_clients=20", "privacy.sampling_rate=0.5"])
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    engine = LocalEngine(data, settings)
    w0 = initial_weights(settings, data.input_dim, data.num_classes)
    kw = dict(sampling=sampling, clip=0.5, noise_multiplier=1.0, seed=11, accountant="rdp")
    kw.update(sampling_rate=0.5) if sampling == "poisson" else kw.update(clients_per_round=6)
    via_engine, via_flower = DPFedAvg(**kw), DPFedAvg(**kw)
    ids = [int(c) for c in data.train_clients]

    plan = via_engine.begin_round(1, ids)
    partial, _ = engine.train(plan, w0)
    w_engine, m_engine = via_engine.finish_round(plan, w0, partial)

    like = [p.detach().numpy() for p in engine.trainer.params]
    names = [str(i) for i in range(len(like))]
    sizes = np.cumsum([a.size for a in like])[:-1]

    def to_record(flat):
        return ArrayRecord(
            array_dict={
                n: Array(np.ascontiguousarray(a.reshape(s.shape).astype(np.float32)))
                for n, a, s in zip(names, np.split(flat, sizes), like, strict=True)
            }
        )

    msgs = list(via_flower.configure_train(1, to_record(w0), ConfigRecord(), Grid(ids)))
    assert [int(m.metadata.dst_node_id) for m in msgs] == plan.cohort.tolist()
    replies = []
    g = torch.as_tensor(w0, dtype=torch.float32)
    for m in msgs:
        update, _ = engine.trainer.train_one(int(m.metadata.dst_node_id), 1, g)
        content = RecordDict(
            {"arrays": to_record(w0 + update.double().numpy()), "metrics": MetricRecord({"num-examples": 1})}
        )
        replies.append(Message(content, reply_to=m))
    arrays, _metrics = via_flower.aggregate_train(1, replies)
    w_flower = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    np.testing.assert_allclose(w_flower, w_engine, atol=2e-6)
    assert (
        via_flower.history[-1]["non_private"]["received"]
        == m_engine["non_private"]["received"]
        == plan.cohort.size
    )
    assert via_flower.epsilon() == via_engine.epsilon()
