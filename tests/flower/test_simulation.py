"""DPFedAvg in Flower's own Simulation Engine, with fedsim's ClientApp (4 supernodes, 2 rounds).

``run_simulation`` gives the ClientApp an empty run config, so the scenario comes from ``FEDSIM_SCENARIO`` /
``FEDSIM_OVERRIDES`` (Ray workers inherit the environment of the process that starts Ray).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

NUM_SUPERNODES = 4
ROUNDS = 2
OVERRIDES = (
    "seed=3 rounds=2 data.num_clients=8 data.heldout_fraction=0.25 client.local_epochs=1 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.noise_multiplier=0.5 engine.name=local"
)


def _run(monkeypatch, noise_placement: str):
    import ray
    from flwr.app import Array, ArrayRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedsim.flower.apps import load_for_run, model_arrays
    from fedsim.flower.client_app import app as client_app
    from fedsim.flower.grid import ClientIdGrid
    from fedsim.engine.trainer import initial_weights
    from fedsim.strategies import DPFedAvg

    overrides = f"{OVERRIDES} privacy.noise_placement={noise_placement}"
    monkeypatch.setenv("FEDSIM_SCENARIO", "quickstart")
    monkeypatch.setenv("FEDSIM_OVERRIDES", overrides)
    if ray.is_initialized():  # workers of an earlier Ray instance would not see the variables above
        ray.shutdown()

    scenario, data, trainer = load_for_run({})
    assert scenario.rounds == ROUNDS and len(data.train_clients) >= NUM_SUPERNODES
    flat = initial_weights(trainer.settings, data.input_dim, data.num_classes)
    initial = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in model_arrays(trainer, flat).items()})
    strategy = DPFedAvg(sampling="all", clip=1.0, noise_multiplier=0.5, noise_placement=noise_placement, seed=3)
    errors: list[BaseException] = []

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            # Flower's node ids are random uint64s: address the nodes by their client ids instead (this also
            # waits until all supernodes have registered, which Flower does asynchronously)
            strategy.start(grid=ClientIdGrid(grid, min_nodes=NUM_SUPERNODES, connect_timeout=60), initial_arrays=initial, num_rounds=ROUNDS)
        except BaseException as exc:  # Flower swallows ServerApp errors
            errors.append(exc)
            raise

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=NUM_SUPERNODES,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": 2, "include_dashboard": False}},
    )
    assert not errors, errors
    return strategy


# The distributed-noise path of the ClientApp (clients clip and add their shares) is covered, with parity
# against the in-process engine, by tests/flower/test_flower_engine.py; one Flower run here keeps the suite fast.
@pytest.mark.parametrize("noise_placement", ["central"])
def test_dpfedavg_in_flower_simulation(monkeypatch, noise_placement):
    strategy = _run(monkeypatch, noise_placement)
    assert [h["round"] for h in strategy.history] == [1, 2]
    for h in strategy.history:
        diag = h["non_private"]
        assert diag["cohort"] == NUM_SUPERNODES
        assert diag["received"] == NUM_SUPERNODES, h
        assert diag["rejected"] == 0, h
        if noise_placement == "distributed":
            assert diag["server_noise_std"] == 0.0  # every share came from the clients
        else:
            assert diag["server_noise_std"] > 0.0
    assert len(strategy.ledger) == ROUNDS
    assert strategy.epsilon() > 0
    assert os.environ["FEDSIM_SCENARIO"] == "quickstart"
