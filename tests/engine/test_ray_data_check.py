"""The Ray engine's workers check the data they were shipped against the driver's: a data function whose clients'
data is not the same on every call is refused, naming it, instead of training data the driver does not evaluate.
One small Ray instance (1 worker), as Ray starts slowly."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data import build_federated_data
from fedsim.data.federated import ArrayFederatedData
from fedsim.data.user import data_fingerprint
from fedsim.engine.runner import run_scenario
from fedsim.scenarios import load_scenario


class Drifting(ArrayFederatedData):
    """The digits, with noise drawn afresh (unseeded) each time a client's data is asked for."""

    def client_data(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = super().client_data(cid)
        return x + np.random.default_rng().normal(size=x.shape).astype(np.float32), y


def drifting(num_clients: int, seed: int):
    data = build_federated_data("digits", num_clients=num_clients, partitioner="iid", seed=seed)
    data.__class__ = Drifting
    return data


def steady(num_clients: int, seed: int):
    return build_federated_data("digits", num_clients=num_clients, partitioner="iid", seed=seed)


def test_the_fingerprint_is_a_function_of_the_data():
    a, b = steady(12, 0), steady(12, 0)
    assert data_fingerprint(a) == data_fingerprint(b)
    assert data_fingerprint(a) != data_fingerprint(steady(12, 1))
    assert data_fingerprint(drifting(12, 0)) != data_fingerprint(drifting(12, 0))


def test_a_worker_holding_other_data_than_the_driver_is_refused_naming_the_data_function():
    scenario = load_scenario(
        "quickstart",
        [
            "rounds=1",
            "data.num_clients=12",
            "data.dataset=test_ray_data_check:drifting",
            "data.partitioner=iid",
            "engine.name=ray",
            "engine.num_workers=1",
        ],
    )
    with pytest.raises(ValueError) as err:
        run_scenario(scenario, write=False)
    msg = str(err.value)
    assert "'test_ray_data_check:drifting' differs between this process and Ray worker 0" in msg
    assert "same data every time" in msg and "np.random.default_rng(seed)" in msg
