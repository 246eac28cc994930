"""Hugging Face datasets through ``dataset="hf:<repo>"``: local data files work, offline fails clearly."""

import numpy as np
import pytest

from fedsim.data import base, build_federated_data


def test_unreachable_hub_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(base, "_hub_reachable", lambda timeout=2.0: False)  # never touch the network
    with pytest.raises(ValueError, match=r"hf:fedsim-tests/does-not-exist.*Hugging Face Hub.*local cache"):
        build_federated_data("hf:fedsim-tests/does-not-exist", num_clients=4)


def test_local_data_files_become_arrays(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (60, 4, 4), dtype=np.uint8)
    ds = datasets.Dataset.from_dict(
        {"image": images.tolist(), "label": np.arange(60) % 3},
        features=datasets.Features(
            {"image": datasets.Array2D((4, 4), "uint8"), "label": datasets.ClassLabel(num_classes=3)}
        ),
    )
    folder = tmp_path / "repo"
    folder.mkdir()
    ds.to_parquet(str(folder / "train.parquet"))
    fd = build_federated_data(f"hf:{folder}", num_clients=6, partitioner="iid", heldout_fraction=0.0, seed=0)
    assert (fd.input_dim, fd.num_classes, fd.num_clients) == (16, 3, 6)
    xs, ys = zip(*(fd.client_data(c) for c in range(6)), strict=True)
    x, y = np.concatenate(xs), np.concatenate(ys)
    assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 1.0 and y.dtype == np.int64
    assert x.shape == (60, 16) and sorted(np.bincount(y)) == [20, 20, 20]
    with pytest.raises(ValueError, match="hub_label"):
        build_federated_data(f"hf:{folder}", num_clients=6, hub_label="colour")
