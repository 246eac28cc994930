"""Synthetic(alpha, beta): on-demand clients, determinism, domains."""

import pickle
import time
import tracemalloc

import numpy as np
import pytest

from fedsim.data import build_federated_data


def test_million_clients_on_demand():
    tracemalloc.start()
    t0 = time.perf_counter()
    fd = build_federated_data("synthetic", num_clients=1_000_000, heldout_fraction=0.1, seed=7)
    data = [fd.client_data(c) for c in (0, 123_456, 999_999)]
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 2.0
    assert peak < 5_000_000  # a few clients' arrays, nothing per population member
    assert len(pickle.dumps(fd)) < 10_000
    x, y = data[1]
    assert x.dtype == np.float32 and x.shape[1] == 60 and y.dtype == np.int64
    assert x.shape[0] == fd.num_examples(123_456)
    again = build_federated_data("synthetic", num_clients=1_000_000, heldout_fraction=0.1, seed=7)
    for a, b in zip(again.client_data(123_456), data[1], strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(fd.client_data(123_456), data[1], strict=True):
        assert np.array_equal(a, b)


def test_heldout_and_sizes():
    fd = build_federated_data(
        "synthetic",
        num_clients=1000,
        heldout_fraction=0.2,
        seed=0,
        synthetic_min_samples=20,
        synthetic_max_samples=300,
    )
    assert fd.heldout_clients.size == 200 and fd.train_clients.size == 800
    assert np.intersect1d(fd.heldout_clients, fd.train_clients).size == 0
    sizes = fd.num_examples_array(np.arange(1000))
    assert sizes.min() >= 20 and sizes.max() <= 300
    assert len(np.unique(sizes)) > 50  # lognormal spread, not constant
    assert fd.num_examples(5) == sizes[5] == fd.client_data(5)[0].shape[0]


def test_seed_changes_data():
    a = build_federated_data("synthetic", num_clients=10, seed=0).client_data(3)
    b = build_federated_data("synthetic", num_clients=10, seed=1).client_data(3)
    assert a[0].shape != b[0].shape or not np.array_equal(a[0], b[0])


def test_labels_follow_a_client_model_and_heterogeneity():
    iid = build_federated_data("synthetic", num_clients=20, seed=0, synthetic_iid=True)
    het = build_federated_data("synthetic", num_clients=20, seed=0, synthetic_alpha=1.0, synthetic_beta=1.0)

    def mean_feature_spread(fd):
        return np.std([fd.client_data(c)[0].mean() for c in range(20)])

    assert mean_feature_spread(het) > 3 * mean_feature_spread(iid)
    x, y = iid.client_data(0)
    assert x.shape[1] == iid.input_dim == 60 and iid.num_classes == 10 and y.max() < 10


def test_domains_share_draws():
    fd = build_federated_data("synthetic", num_clients=30, domains=3, seed=0, synthetic_beta=5.0)
    assert fd.num_domains == 3 and [fd.domain(c) for c in (0, 10, 29)] == [0, 1, 2]
    first = np.array([fd.client_data(c)[0][:, 0].mean() for c in range(30)]).reshape(3, 10)
    # clients of a domain share B_d, so their first-feature means cluster around it
    assert np.std(first.mean(axis=1)) > np.mean(first.std(axis=1))
    assert fd.describe()["domain_means"] is not None


def test_synthetic_ignores_partitioner_but_rejects_partition_options():
    fd = build_federated_data("synthetic", num_clients=10, partitioner="dirichlet", seed=0)
    assert fd.describe()["partitioner"] == "natural"
    with pytest.raises(ValueError, match="min_partition_size"):
        build_federated_data("synthetic", num_clients=10, min_partition_size=3)
    with pytest.raises(ValueError, match="synthetic_alpha"):
        build_federated_data("synthetic", num_clients=10, synthetic_alpha=-1.0)
    with pytest.raises(ValueError, match="synthetic_max_samples"):
        build_federated_data("synthetic", num_clients=10, synthetic_min_samples=10, synthetic_max_samples=5)
