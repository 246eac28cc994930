"""FlowerEngine (Flower's Simulation Engine) gives the same model as the in-process LocalEngine."""

from __future__ import annotations

import numpy as np

from fedsim.scenarios import load_scenario

TINY = [
    "seed=5",
    "rounds=2",
    "data.num_clients=5",
    "data.heldout_fraction=0.2",
    "client.local_epochs=1",
    "privacy.sampling=all",
    "privacy.sampling_rate=none",
    "privacy.noise_multiplier=0.7",
    "engine.name=local",
    # distributed noise: the ClientApp clips and adds its own share; the server adds none
    "privacy.noise_placement=distributed",
]


def test_flower_engine_matches_local_engine():
    import ray

    from fedsim.engine.flower_engine import FlowerEngine
    from fedsim.engine.ray_engine import LocalEngine
    from fedsim.engine.runner import run_scenario
    from fedsim.experiment import build_data
    from fedsim.training.trainer import TrainSettings

    scenario = load_scenario("quickstart", TINY)
    data = build_data(scenario)
    assert len(data.train_clients) == 4
    local = run_scenario(
        scenario, write=False, engine=LocalEngine(data, TrainSettings.from_scenario(scenario))
    )

    if ray.is_initialized():
        ray.shutdown()
    flower = FlowerEngine(num_cpus_per_client=1, ray_init_args={"num_cpus": 2}).run(scenario)

    assert [r["round"] for r in flower.rows] == [1, 2]
    for row in flower.rows:
        diag = row["non_private"]
        assert diag["cohort"] == 4 and diag["received"] == 4 and diag["rejected"] == 0, row
        assert diag["server_noise_std"] == 0.0
        for key in ("epsilon", "heldout_accuracy", "generalization"):
            assert key in row
        assert (
            "train_accuracy" in diag and "train_accuracy" not in row
        )  # training-client metrics: non-private
    assert len(flower.strategy.ledger) == 2
    np.testing.assert_allclose(flower.weights, local.weights, atol=1e-5, rtol=0)
    for a, b in zip(flower.rows, local.rows, strict=True):
        assert a["epsilon"] == b["epsilon"]
        np.testing.assert_allclose(
            a["non_private"]["train_accuracy"], b["non_private"]["train_accuracy"], atol=1e-6
        )
        np.testing.assert_allclose(a["heldout_accuracy"], b["heldout_accuracy"], atol=1e-6)
