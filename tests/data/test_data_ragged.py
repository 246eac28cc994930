"""A data function's ``x`` or ``y`` given as a list of arrays of different shapes (ragged): refused naming the field,
the example, its client and the shapes found, instead of numpy's "inhomogeneous shape"."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data import build_federated_data
from fedsim.data.user import arrays_from_result

LENGTHS = [4, 4, 6, 4, 5, 4]


def ragged_sequences(num_clients: int, seed: int):
    """Token sequences of the lengths in LENGTHS, two examples per client, as a user would first write them."""
    rng = np.random.default_rng(seed)
    x = [rng.integers(0, 9, size=n) for n in LENGTHS]
    y = rng.integers(0, 2, size=len(LENGTHS))
    return {"x": x, "y": y, "clients": [[0, 1], [2, 3], [4, 5]][:num_clients]}


def test_a_ragged_x_names_the_example_its_client_and_the_shapes():
    with pytest.raises(ValueError) as err:
        build_federated_data(ragged_sequences, num_clients=3, heldout_fraction=0.0)
    msg = str(err.value)
    assert "inhomogeneous" not in msg
    assert "ragged_sequences" in msg  # the data function
    assert (
        "x is a list of 6 arrays of different shapes: x[0] has shape (4,), x[2] (an example of client 1)"
        in msg
    )
    assert "has (6,)" in msg
    assert "shapes found: (4,) x 4, (6,) x 1, (5,) x 1" in msg
    assert "[n, *input_shape]" in msg and "pad sequences to one length" in msg


def test_a_ragged_y_is_named_as_y_and_without_clients_no_client_is_named():
    x = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(ValueError) as err:
        arrays_from_result((x, [np.array([1, 2]), np.array([1, 2]), np.array([3])]), "mine:data", 1)
    msg = str(err.value)
    assert msg.startswith("the data function 'mine:data': y is a list of 3 arrays of different shapes")
    assert "y[2] has (1,)" in msg and "an example of client" not in msg and "[n, *T]" in msg


def test_per_client_arrays_given_as_x_are_refused_with_the_way_to_give_them():
    per_client = [np.zeros((5, 3)), np.zeros((7, 3))]
    with pytest.raises(ValueError, match=r"x\[1\] has \(7, 3\).*'clients' holding each client's row indices"):
        arrays_from_result((per_client, np.zeros(12, dtype=np.int64)), "mine:data", 2)


def test_same_shaped_lists_still_stack():
    x = [np.full(3, i, dtype=np.float32) for i in range(4)]
    base, rows = arrays_from_result((x, [0, 1, 0, 1], [[0, 1], [2, 3]]), "mine:data", 2)
    assert base.x.shape == (4, 3) and [r.tolist() for r in rows] == [[0, 1], [2, 3]]
