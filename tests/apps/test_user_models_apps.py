"""A user's model, loss and data, named in a scenario file, train through every way fedsim runs a scenario: the
in-process engine, Ray actors, Flower's Simulation Engine (the ClientApp in Ray workers) and the shipped
ServerApp with the shipped ClientApp as deployed. The simulation engines agree with each other."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from loopback import LoopbackGrid  # tests/apps/loopback.py

from fedsim.apps import client_app as client_module
from fedsim.apps import server_app as server_module

SCENARIO = """
name = "user"
seed = 2
rounds = 2

[data]
dataset = "user_models:stripes"
num_clients = 6
heldout_fraction = 0.2

[data.options]
size = 6

[model]
factory = "{factory}"
loss = "{loss}"
{options}

[client]
local_epochs = 2
batch_size = 4
optimizer = "momentum"

[privacy]
sampling = "all"
clip = 1.0
noise_multiplier = 0.7

[engine]
num_workers = 2
eval_every = 1
"""

MODELS = [
    ("user_models:mlp", "cross_entropy", "width = 8", "per-layer"),
    ("user_models:cnn", "user_models:smooth_loss", "dropout = 0.25", "per-layer"),
    ("user_models:custom", "cross_entropy", "", "vmap"),
]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


@pytest.mark.parametrize(("factory", "loss", "options", "path"), MODELS)
def test_a_user_model_trains_through_every_engine_and_the_deployed_apps(
    tmp_path, factory, loss, options, path
):
    import ray

    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    toml = tmp_path / "user.toml"
    toml.write_text(SCENARIO.format(factory=factory, loss=loss, options=options))
    runs = {}
    for engine in ("local", "ray", "flower"):
        if ray.is_initialized():
            ray.shutdown()
        runs[engine] = run_scenario(load_scenario(str(toml), [f"engine.name={engine}"]), tmp_path / engine)
    if ray.is_initialized():
        ray.shutdown()
    data = json.loads((tmp_path / "local" / "data.json").read_text())
    assert data["input_shape"] == [1, 6, 6] and data["data_function"] == "user_models:stripes"
    for engine, res in runs.items():
        assert [r["round"] for r in res.rows] == [1, 2], engine
        for row in res.rows:
            assert row["non_private"]["received"] == 5 and row["non_private"]["rejected"] == 0, (engine, row)
        if engine != "flower":  # Flower's clients send back only their update, not how they trained
            assert {r["local_training"] for r in res.rows} == {path}, engine
    for engine in ("ray", "flower"):
        np.testing.assert_allclose(runs[engine].weights, runs["local"].weights, atol=1e-5, rtol=0)
        a = [r["heldout_loss"] for r in runs[engine].rows]
        b = [r["heldout_loss"] for r in runs["local"].rows]
        np.testing.assert_allclose(a, b, rtol=1e-4)
        assert (tmp_path / engine / "ledger.json").read_text() == (
            tmp_path / "local" / "ledger.json"
        ).read_text()

    # deployed: the shipped ServerApp's main and the shipped ClientApp (OS entropy), one node per client
    cfg = {"scenario": str(toml), "overrides": "", "min-nodes": 5, "run-dir": str(tmp_path / "deployed")}
    grid = LoopbackGrid(client_module.app, 5, cfg)
    server_module.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    train_replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(train_replies) == 10 and not any(r.has_error() for r in train_replies)
    rows = [json.loads(x) for x in (tmp_path / "deployed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all(np.isfinite(r["heldout_loss"]) for r in rows)
    # what was released is accounted the same: the deployed ledger is the simulated one (the noise values differ)
    deployed = json.loads((tmp_path / "deployed" / "ledger.json").read_text())
    assert deployed == json.loads((tmp_path / "local" / "ledger.json").read_text())
