"""Vectorised local training (the per-layer path, which the shipped models take) must reproduce
ClientTrainer.train_one client by client."""

import numpy as np
import pytest
import torch

from fedsim.data import build_federated_data
from fedsim.models import MODEL_FACTORIES
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights
from fedsim.training.vectorized import train_vectorized


@pytest.fixture(scope="module")
def digits():
    return build_federated_data(
        "digits", num_clients=30, partitioner="dirichlet", alpha=0.3, heldout_fraction=0.0
    )


@pytest.fixture(scope="module")
def mnist1d():
    return build_federated_data(
        "mnist1d", num_clients=30, partitioner="dirichlet", alpha=0.3, heldout_fraction=0.0, num_samples=1000
    )


def _trainer(data, model, optimizer, epochs, batch_size=8, **kw):
    settings = TrainSettings(
        model=MODEL_FACTORIES[model],
        model_kwargs=kw,
        local_epochs=epochs,
        batch_size=batch_size,
        lr=0.05,
        optimizer=optimizer,
        momentum=0.9,
        seed=3,
    )
    trainer = ClientTrainer(data, settings, device="cpu")
    assert trainer.path.name == "per-layer"
    w = torch.as_tensor(initial_weights(settings, data.input_shape, data.num_classes), dtype=torch.float32)
    return trainer, w


def _compare(trainer, w, cids, server_round=2, **kw):
    sizes = trainer.data.num_examples_array(cids)
    assert len(set(sizes.tolist())) > 1, "the test needs clients of unequal sizes"
    got = list(train_vectorized(trainer, server_round, cids, w, **kw))
    assert len(got) == len(cids)
    for cid, (update, m) in zip(cids, got, strict=True):
        ref, ref_m = trainer.train_one(cid, server_round, w)
        assert update.shape == ref.shape and update.dtype == torch.float32
        assert m["client"] == cid and m["num_examples"] == ref_m["num_examples"]
        assert float((update - ref).abs().max()) < 1e-5, cid
        assert m["train_loss"] == pytest.approx(ref_m["train_loss"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_digits_mlp_matches_loop(digits, optimizer):
    trainer, w = _trainer(digits, "mlp", optimizer, epochs=3, hidden=[32])
    cids = [5, 0, 17, 9, 22]
    _compare(trainer, w, cids)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_mnist1d_cnn1d_matches_loop(mnist1d, optimizer):
    trainer, w = _trainer(mnist1d, "cnn1d", optimizer, epochs=2, batch_size=16)
    cids = [1, 4, 28, 13]
    _compare(trainer, w, cids, server_round=5)


def test_chunks_and_order_do_not_matter(digits):
    trainer, w = _trainer(digits, "mlp", "momentum", epochs=1, hidden=[16])
    cids = list(range(0, 30, 4))
    whole = [u for u, _ in train_vectorized(trainer, 1, cids, w)]
    chunked = [u for u, _ in train_vectorized(trainer, 1, cids, w, chunk_size=3)]
    rev = {m["client"]: u for u, m in train_vectorized(trainer, 1, cids[::-1], w)}
    for cid, a, b in zip(cids, whole, chunked, strict=True):
        assert float((a - b).abs().max()) < 1e-6
        assert float((a - rev[cid]).abs().max()) < 1e-6


def test_trainer_vectorize_flag_gives_the_same_partial_sum(digits):
    """``vectorize = false`` is the loop, ``true`` is ``auto`` (per-layer here): the same clipped sum."""
    settings = TrainSettings(
        model=MODEL_FACTORIES["mlp"],
        model_kwargs={"hidden": [16]},
        local_epochs=2,
        batch_size=8,
        seed=1,
        vectorize=False,
    )
    w = initial_weights(settings, digits.input_shape, digits.num_classes)
    cids = np.arange(0, 30, 3)
    loop, mloop = ClientTrainer(digits, settings, device="cpu").train(ClientPlan(1, cids, 0.5), w)
    vec_settings = TrainSettings(**{**settings.__dict__, "vectorize": True})
    vec, mvec = ClientTrainer(digits, vec_settings, device="cpu").train(ClientPlan(1, cids, 0.5), w)
    assert vec.count == loop.count == cids.size
    assert np.abs(vec.total - loop.total).max() < 1e-5
    assert [m["client"] for m in mvec] == [m["client"] for m in mloop]
    np.testing.assert_allclose([m["update_norm"] for m in mvec], [m["update_norm"] for m in mloop], rtol=1e-5)


def test_empty_and_single_client(digits):
    trainer, w = _trainer(digits, "mlp", "sgd", epochs=1, hidden=[16])
    assert list(train_vectorized(trainer, 1, [], w)) == []
    ((u, _m),) = train_vectorized(trainer, 1, [4], w)
    ref, _ = trainer.train_one(4, 1, w)
    assert float((u - ref).abs().max()) < 1e-5
