"""Generated datasets are cached on disk, keyed by their arguments; a damaged cache is rebuilt."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from fedsim.data import base
from fedsim.data.cache import cache_path


@pytest.fixture
def counted(monkeypatch, tmp_path):
    import mnist1d.data

    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    calls = []
    real = mnist1d.data.make_dataset
    monkeypatch.setattr(
        mnist1d.data, "make_dataset", lambda args: calls.append(args.num_samples) or real(args)
    )
    base.make_mnist1d_arrays.cache_clear()
    yield calls
    base.make_mnist1d_arrays.cache_clear()


def test_a_second_run_reads_mnist1d_from_disk(counted, tmp_path):
    first = base.make_mnist1d_arrays(300)
    assert counted == [300] and len(list((tmp_path / "data").glob("mnist1d-*.npz"))) == 1
    base.make_mnist1d_arrays.cache_clear()  # a new process
    t0 = time.perf_counter()
    again = base.make_mnist1d_arrays(300)
    assert time.perf_counter() - t0 < 1.0 and counted == [300]  # read back, not generated
    np.testing.assert_array_equal(first.x, again.x)
    np.testing.assert_array_equal(first.y, again.y)
    assert not again.x.flags.writeable
    base.make_mnist1d_arrays(400)  # other arguments: another entry
    assert counted == [300, 400] and len(list((tmp_path / "data").glob("mnist1d-*.npz"))) == 2


def test_a_damaged_cache_file_is_rebuilt_and_replaced(counted, tmp_path, caplog):
    first = base.make_mnist1d_arrays(300)
    (path,) = (tmp_path / "data").glob("mnist1d-*.npz")
    path.write_bytes(path.read_bytes()[:100])  # truncated
    base.make_mnist1d_arrays.cache_clear()
    with caplog.at_level(logging.WARNING, logger="fedsim.data.cache"):
        again = base.make_mnist1d_arrays(300)
    assert "cannot be read" in caplog.text and counted == [300, 300]
    np.testing.assert_array_equal(first.x, again.x)
    base.make_mnist1d_arrays.cache_clear()
    base.make_mnist1d_arrays(300)
    assert counted == [300, 300]  # the replaced file is whole again


def test_an_unwritable_cache_costs_only_the_generation(monkeypatch, tmp_path, caplog):
    import mnist1d.data  # noqa: F401 - loaded before the cache folder becomes a file

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(blocker))
    base.make_mnist1d_arrays.cache_clear()
    with caplog.at_level(logging.WARNING, logger="fedsim.data.cache"):
        data = base.make_mnist1d_arrays(300)
    base.make_mnist1d_arrays.cache_clear()
    assert data.x.shape[0] == 300 and "could not cache" in caplog.text


def test_the_key_covers_every_argument():
    a = cache_path("mnist1d", {"args": {"num_samples": 300, "seed": 42}, "mnist1d": "0.0.2"})
    assert a == cache_path("mnist1d", {"mnist1d": "0.0.2", "args": {"seed": 42, "num_samples": 300}})
    assert a != cache_path("mnist1d", {"args": {"num_samples": 300, "seed": 43}, "mnist1d": "0.0.2"})
    assert a != cache_path("mnist1d", {"args": {"num_samples": 300, "seed": 42}, "mnist1d": "0.0.3"})


def test_a_partition_is_cached_by_its_labels_and_arguments(monkeypatch, tmp_path):
    from fedsim.data import build_federated_data, partition

    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    calls = []
    real = partition.partition_rows
    monkeypatch.setattr(partition, "partition_rows", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    kw = dict(num_clients=40, partitioner="dirichlet", alpha=0.5, heldout_fraction=0.1, seed=3)
    first = build_federated_data("digits", **kw)
    again = build_federated_data("digits", **kw)
    assert calls == ["dirichlet"]  # the second build read the partition back
    for c in range(40):
        np.testing.assert_array_equal(first.client_data(c)[1], again.client_data(c)[1])
    assert first.describe() == again.describe()
    build_federated_data("digits", **{**kw, "seed": 4})  # another seed: partitioned anew
    assert calls == ["dirichlet", "dirichlet"]
