"""FederatedData for digits / mnist1d: determinism, held-out clients, partitions, domains, pickling."""

import pickle

import numpy as np
import pytest

from fedsim.data import DATASETS, PARTITIONERS, FederatedData, build_federated_data


@pytest.fixture(scope="module")
def dirichlet() -> FederatedData:
    return build_federated_data(
        "digits", num_clients=100, partitioner="dirichlet", alpha=0.5, heldout_fraction=0.1, seed=0
    )


@pytest.fixture(scope="module")
def iid() -> FederatedData:
    return build_federated_data("digits", num_clients=100, partitioner="iid", heldout_fraction=0.1, seed=0)


def _all_rows(fd):
    return [fd.client_rows(c) for c in range(fd.num_clients)]


def test_registry_names():
    assert DATASETS == ("digits", "mnist1d", "synthetic", "shakespeare")
    assert PARTITIONERS == ("iid", "dirichlet", "pathological", "shard")


def test_shapes_and_dtypes(dirichlet):
    fd = dirichlet
    assert (fd.num_clients, fd.input_dim, fd.num_classes, fd.num_domains) == (100, 64, 10, 1)
    assert fd.input_shape == (1, 8, 8)  # the digits are images
    x, y = fd.client_data(int(fd.train_clients[0]))
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.shape[1:] == (1, 8, 8) and y.shape == (x.shape[0],)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert fd.num_examples(int(fd.train_clients[0])) == x.shape[0]


def test_deterministic_in_seed(dirichlet):
    again = build_federated_data(
        "digits", num_clients=100, partitioner="dirichlet", alpha=0.5, heldout_fraction=0.1, seed=0
    )
    other = build_federated_data(
        "digits", num_clients=100, partitioner="dirichlet", alpha=0.5, heldout_fraction=0.1, seed=1
    )
    assert all(np.array_equal(a, b) for a, b in zip(_all_rows(dirichlet), _all_rows(again), strict=True))
    assert np.array_equal(dirichlet.heldout_clients, again.heldout_clients)
    assert not all(np.array_equal(a, b) for a, b in zip(_all_rows(dirichlet), _all_rows(other), strict=True))
    assert not np.array_equal(dirichlet.heldout_clients, other.heldout_clients)


def test_iid_depends_on_seed(iid):
    other = build_federated_data("digits", num_clients=100, partitioner="iid", seed=1)
    assert not np.array_equal(iid.client_rows(0), other.client_rows(0))


@pytest.mark.parametrize("fraction,expected", [(0.1, 10), (0.25, 25), (0.0, 0), (0.001, 1)])
def test_heldout_disjoint_and_fraction(fraction, expected):
    fd = build_federated_data("digits", num_clients=100, heldout_fraction=fraction, seed=3)
    train, held = fd.train_clients, fd.heldout_clients
    assert held.size == expected == fd.num_heldout_clients
    assert train.size == 100 - expected == fd.num_train_clients
    assert np.intersect1d(train, held).size == 0
    assert np.array_equal(np.union1d(train, held), np.arange(100))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(held) > 0)
    assert train.dtype == np.int64 and held.dtype == np.int64
    assert all(fd.is_heldout(int(c)) for c in held) and not any(fd.is_heldout(int(c)) for c in train)


def test_every_client_nonempty_and_rows_disjoint(dirichlet):
    rows = _all_rows(dirichlet)
    assert min(r.size for r in rows) >= 1
    assert dirichlet.describe()["min_partition_size"] >= 1
    flat = np.concatenate(rows)
    assert np.unique(flat).size == flat.size  # no example on two clients


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_dirichlet_default_never_leaves_an_empty_client(seed):
    fd = build_federated_data("digits", num_clients=100, partitioner="dirichlet", alpha=0.5, seed=seed)
    assert fd.num_examples_array(np.arange(100)).min() >= 1


def test_dirichlet_label_skew(dirichlet, iid):
    def mean_entropy(fd):
        return np.mean([fd.label_entropy(c) for c in range(fd.num_clients)])

    assert mean_entropy(dirichlet) < mean_entropy(iid) - 0.2
    assert dirichlet.describe()["mean_client_label_entropy"] == pytest.approx(mean_entropy(dirichlet))


@pytest.mark.parametrize("partitioner", ["pathological", "shard"])
def test_other_partitioners_give_few_labels(partitioner):
    fd = build_federated_data("digits", num_clients=50, partitioner=partitioner, seed=0)
    labels = [np.unique(fd.client_data(c)[1]).size for c in range(50)]
    assert max(labels) <= 2 + (partitioner == "shard")  # a shard may straddle two labels
    assert min(fd.num_examples(c) for c in range(50)) >= 1


def test_pickle_small_and_equal(dirichlet):
    blob = pickle.dumps(dirichlet)
    assert len(blob) < 2_000_000
    back = pickle.loads(blob)
    for cid in (0, 17, 99):
        for a, b in zip(dirichlet.client_data(cid), back.client_data(cid), strict=True):
            assert np.array_equal(a, b)
    assert np.array_equal(back.train_clients, dirichlet.train_clients)


def test_mnist1d_generated_offline():
    state = np.random.get_state()
    fd = build_federated_data("mnist1d", num_clients=20, num_samples=1000, seed=0)
    assert np.array_equal(np.random.get_state()[1], state[1])  # global RNG untouched
    assert (fd.input_dim, fd.num_classes) == (40, 10)
    assert fd.describe()["num_examples"] == 1000
    x, y = fd.client_data(0)
    assert x.dtype == np.float32 and x.shape[1] == 40 and y.dtype == np.int64


def test_domains_blocks_and_shift():
    fd = build_federated_data(
        "digits", num_clients=40, domains=[0.5, 0.3, 0.2], heldout_fraction=0.2, seed=0, domain_noise=0.2
    )
    assert fd.num_domains == 3 and fd.domain_sizes == (20, 12, 8)
    assert [fd.domain(c) for c in (0, 19, 20, 31, 32, 39)] == [0, 0, 1, 1, 2, 2]
    assert np.array_equal(fd.domains_of([0, 20, 39]), [0, 1, 2])
    # held-out clients are stratified by domain, and every domain keeps training clients
    assert fd.describe()["heldout_per_domain"] == [4, 2, 2]
    for d in range(3):
        assert fd.domain_clients(d).size >= 1
        assert np.all(fd.domains_of(fd.domain_clients(d, heldout=True)) == d)
    # domain 0 is the untouched data; other domains are shifted, deterministically
    assert np.array_equal(fd.client_data(0)[0], fd.x[fd.client_rows(0)])
    x1, _ = fd.client_data(25)
    assert not np.allclose(x1, fd.x[fd.client_rows(25)])
    assert np.array_equal(x1, fd.client_data(25)[0])
    equal = build_federated_data("digits", num_clients=40, domains=4, seed=0)
    assert equal.domain_sizes == (10, 10, 10, 10)


@pytest.mark.parametrize(
    "kwargs,option",
    [
        ({"dataset": "cifar"}, "dataset"),
        ({"partitioner": "zipf"}, "partitioner"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 5000}, "num_clients"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
        ({"heldout_fraction": -0.1}, "heldout_fraction"),
        ({"seed": -1}, "seed"),
        ({"partitioner": "dirichlet", "alpha": 0.0}, "alpha"),
        ({"partitioner": "dirichlet", "min_partition_size": 500}, "min_partition_size"),
        ({"partitioner": "pathological", "num_classes_per_partition": 11}, "num_classes_per_partition"),
        ({"partitioner": "pathological", "class_assignment_mode": "x"}, "class_assignment_mode"),
        ({"partitioner": "shard", "num_shards_per_partition": 0}, "num_shards_per_partition"),
        ({"partitioner": "iid", "min_partition_size": 3}, "min_partition_size"),
        ({"domains": [0.5, 0.4]}, "domains"),
        ({"domains": 0}, "domains"),
        ({"num_samples": 100}, "num_samples"),  # not a digits option
        ({"dataset": "mnist1d", "num_samples": 3}, "num_samples"),
        ({"colour": "red"}, "colour"),
        ({"domain_shift": -1.0}, "domain_shift"),
    ],
)
def test_errors_name_the_option(kwargs, option):
    args = {"dataset": "digits", "num_clients": 10} | kwargs
    with pytest.raises(ValueError, match=option):
        build_federated_data(**args)


def test_error_lists_allowed_values():
    with pytest.raises(ValueError, match="'digits', 'mnist1d', 'synthetic'"):
        build_federated_data("cifar")
    with pytest.raises(ValueError, match="'iid', 'dirichlet', 'pathological', 'shard'"):
        build_federated_data("digits", partitioner="zipf")


def test_none_options_count_as_not_given():
    fd = build_federated_data("digits", num_clients=10, num_samples=None, synthetic_alpha=None)
    assert fd.num_clients == 10


def test_bad_client_id(iid):
    with pytest.raises(ValueError, match="cid"):
        iid.client_data(100)


def test_small_alpha_tops_up_with_default_minimum_and_fails_clearly_when_pinned():
    fd = build_federated_data("digits", num_clients=100, partitioner="dirichlet", alpha=0.05, seed=0)
    info = fd.describe()
    assert info["topped_up_clients"] > 0
    assert info["examples_per_client"]["min"] >= info["min_partition_size"] >= 1
    flat = np.concatenate(_all_rows(fd))
    assert np.unique(flat).size == flat.size == 1797
    with pytest.raises(ValueError, match="min_partition_size=2"):
        build_federated_data(
            "digits", num_clients=100, partitioner="dirichlet", alpha=0.05, seed=0, min_partition_size=2
        )
