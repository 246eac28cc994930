"""A user's data function (``dataset = "package.module:function"`` or a callable): what it may return, and
clear errors for what it may not."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data import FederatedData, build_federated_data


def test_arrays_and_clients_from_a_reference():
    fd = build_federated_data("user_models:stripes", num_clients=8, heldout_fraction=0.25, seed=3)
    assert fd.input_shape == (1, 6, 6) and fd.num_classes == 2 and fd.num_clients == 8
    assert fd.num_heldout_clients == 2 and fd.num_train_clients == 6
    want = np.random.default_rng(3).integers(6, 24, size=8)  # the function's own ragged client sizes
    np.testing.assert_array_equal(fd.num_examples_array(np.arange(8)), want)
    x, y = fd.client_data(int(fd.train_clients[0]))
    assert x.shape[1:] == (1, 6, 6) and x.dtype == np.float32 and y.dtype == np.int64
    assert fd.describe()["data_function"] == "user_models:stripes"


def test_options_reach_the_function_and_unknown_ones_are_named():
    fd = build_federated_data(
        "user_models:stripes", num_clients=4, seed=0, options={"size": 4, "per_client": 40}
    )
    assert fd.input_shape == (1, 4, 4) and fd.num_examples_array([0]).item() >= 20
    with pytest.raises(ValueError, match=r"data.options.colour.*takes size, per_client"):
        build_federated_data("user_models:stripes", num_clients=4, options={"colour": 1})


def test_arrays_without_clients_are_split_by_the_scenarios_partitioner():
    def pool(seed):  # a callable: the Python API
        rng = np.random.default_rng(seed)
        return rng.standard_normal((300, 5)), rng.integers(0, 3, 300)

    a = build_federated_data(pool, num_clients=10, partitioner="dirichlet", alpha=0.5, seed=1)
    b = build_federated_data(pool, num_clients=10, partitioner="dirichlet", alpha=0.5, seed=1)
    sizes = a.num_examples_array(np.arange(10))
    assert sizes.sum() == 300 and len(set(sizes.tolist())) > 1
    np.testing.assert_array_equal(sizes, b.num_examples_array(np.arange(10)))
    assert a.describe()["partitioner"] == "dirichlet" and a.input_shape == (5,)


def test_a_ready_federated_data_is_used_as_it_is():
    ready = build_federated_data("digits", num_clients=12, partitioner="iid", seed=0)
    assert build_federated_data(lambda: ready, num_clients=12) is ready
    with pytest.raises(ValueError, match=r"num_clients=5.*12"):
        build_federated_data(lambda: ready, num_clients=5)
    assert isinstance(ready, FederatedData)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ([1, 2, 3], "returned list: allowed a FederatedData"),
        ({"x": np.zeros((4, 2))}, "keys \\['x'\\]"),
        ((np.zeros((4, 2)), np.zeros(4)), "integer labels"),
        ((np.zeros((4, 2)), np.array([0, 1, 0])), "one per row of x"),
        ((np.full((4, 2), np.nan), np.array([0, 1, 0, 1])), "NaN"),
        (
            (np.zeros((4, 2)), np.array([0, 1, 0, 1]), [[0, 1], [2, 9]]),
            r"clients\[1\] must be integer indices",
        ),
        ((np.zeros((4, 2)), np.array([0, 1, 0, 1]), [[0, 1]]), "one index array per client \\(2\\), got 1"),
        ({"x": np.zeros((4, 2)), "y": np.array([0, 1, 0, 3]), "num_classes": 2}, "labels up to 3"),
    ],
)
def test_bad_returns_are_clear_errors(result, message):
    with pytest.raises(ValueError, match=message):
        build_federated_data(lambda: result, num_clients=2)


def test_references_that_do_not_resolve_say_why():
    with pytest.raises(ValueError, match=r"module 'nope_pkg\.data' cannot be imported"):
        build_federated_data("nope_pkg.data:load", num_clients=2)
    with pytest.raises(ValueError, match="'user_models' has no attribute 'nothing'"):
        build_federated_data("user_models:nothing", num_clients=2)
    with pytest.raises(ValueError, match="allowed one of 'digits'"):
        build_federated_data("cifar", num_clients=2)
