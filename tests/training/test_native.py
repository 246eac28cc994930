"""The fused CPU kernel for CNN1D (fedsim.training.native) must train exactly as the PyTorch paths do."""

import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedsim.data import build_federated_data
from fedsim.models import build_model
from fedsim.training import native
from fedsim.training import vectorized as vec
from fedsim.training.trainer import ClientTrainer, TrainSettings, initial_weights

# where fedsim is developed and tested (x86-64 Linux, a C compiler, PyTorch's MKL) the kernel must build:
# a silent fallback there would leave it untested
EXPECTED = platform.system() == "Linux" and platform.machine() == "x86_64" and shutil.which("cc") is not None


def test_kernel_builds_here():
    if not EXPECTED:
        pytest.skip("the fused kernel is only required on x86-64 Linux with a C compiler")
    assert native.available(), native.unavailable_reason()


needs_kernel = pytest.mark.skipif(
    not native.available(), reason=f"native kernel: {native.unavailable_reason()}"
)


@pytest.fixture(scope="module")
def mnist1d():
    return build_federated_data(
        "mnist1d", num_clients=24, partitioner="dirichlet", alpha=0.3, heldout_fraction=0.0, num_samples=900
    )


def _setup(data, optimizer="sgd", epochs=2, batch_size=16, **model_kwargs):
    settings = TrainSettings(
        model="cnn1d",
        model_kwargs=model_kwargs,
        local_epochs=epochs,
        batch_size=batch_size,
        lr=0.05,
        optimizer=optimizer,
        momentum=0.9,
        seed=7,
        vectorize=True,
    )
    trainer = ClientTrainer(data, settings, device="cpu")
    w = torch.as_tensor(initial_weights(settings, data.input_dim, data.num_classes), dtype=torch.float32)
    return trainer, w


def _torch_path(trainer, cids, w, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("FEDSIM_NATIVE", "0")
        assert vec.native_dims(trainer) is None
        return list(vec.train_vectorized(trainer, 4, cids, w))


@needs_kernel
@pytest.mark.parametrize(
    "optimizer,epochs,batch_size,kwargs",
    [
        ("sgd", 2, 16, {}),  # the registry's default CNN1D: 16/32 channels, kernel 5 (vector loops)
        ("momentum", 3, 16, {}),
        ("momentum", 1, 5, {"channels": (6, 10), "kernel_size": 3}),  # channel counts off the vector width
        ("sgd", 2, 7, {"channels": (16, 8), "kernel_size": 4}),  # even kernel: asymmetric outputs
        ("sgd", 1, 64, {"channels": (32, 16), "kernel_size": 7}),  # one step per client
    ],
)
def test_native_matches_torch_path_and_loop(mnist1d, monkeypatch, optimizer, epochs, batch_size, kwargs):
    trainer, w = _setup(mnist1d, optimizer, epochs, batch_size, **kwargs)
    cids = [3, 0, 17, 9, 22, 11]
    assert len(set(trainer.data.num_examples_array(cids).tolist())) > 1
    assert vec.native_dims(trainer) is not None
    got = list(vec.train_vectorized(trainer, 4, cids, w))
    ref = _torch_path(trainer, cids, w, monkeypatch)
    for cid, (u, m), (ur, mr) in zip(cids, got, ref, strict=True):
        loop, ml = trainer.train_one(cid, 4, w)
        assert m["client"] == mr["client"] == cid and m["num_examples"] == ml["num_examples"]
        scale = float(loop.abs().max())
        assert scale > 1e-3  # the clients did train
        assert float((u - ur).abs().max()) <= 1e-5 * max(1.0, scale), cid
        assert float((u - loop).abs().max()) <= 1e-5 * max(1.0, scale), cid
        assert m["train_loss"] == pytest.approx(ml["train_loss"], rel=1e-5, abs=1e-6)
        assert m["train_loss"] == pytest.approx(mr["train_loss"], rel=1e-5, abs=1e-6)


@needs_kernel
def test_chunking_and_client_order_do_not_matter(mnist1d):
    trainer, w = _setup(mnist1d, "momentum", 1, 8)
    cids = list(range(0, 24, 2))
    whole = {m["client"]: u for u, m in vec.train_vectorized(trainer, 2, cids, w)}
    chunked = {m["client"]: u for u, m in vec.train_vectorized(trainer, 2, cids[::-1], w, chunk_size=5)}
    for cid in cids:
        assert float((whole[cid] - chunked[cid]).abs().max()) < 1e-6


@needs_kernel
def test_partial_sums_match_the_torch_path(mnist1d, monkeypatch):
    settings = TrainSettings(
        model="cnn1d", model_kwargs={}, local_epochs=1, batch_size=8, seed=2, vectorize=True
    )
    w = initial_weights(settings, mnist1d.input_dim, mnist1d.num_classes)
    cids = np.arange(0, 24, 3)
    fast, m_fast = ClientTrainer(mnist1d, settings, device="cpu").train(1, cids, w, clip=0.5)
    monkeypatch.setenv("FEDSIM_NATIVE", "0")
    slow, m_slow = ClientTrainer(mnist1d, settings, device="cpu").train(1, cids, w, clip=0.5)
    assert fast.count == slow.count == cids.size
    assert {m["trainer"] for m in m_fast} == {"native-cnn1d"} and {m["trainer"] for m in m_slow} == {
        "vectorized"
    }
    assert np.abs(fast.total - slow.total).max() < 1e-5
    np.testing.assert_allclose(
        [m["update_norm"] for m in m_fast], [m["update_norm"] for m in m_slow], rtol=1e-5
    )


def _kernel_args(data, batch_size=8):
    model = build_model("cnn1d", data.input_dim, data.num_classes)
    dims = native.cnn1d_dims(model, batch_size)
    x, y = data.client_data(0)
    x_all, y_all = np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
    n = x_all.shape[0]
    w = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    order = np.arange(n, dtype=np.int64)[None, :]
    return dims, w, x_all, y_all, order, np.array([0]), np.array([n])


@needs_kernel
def test_bad_inputs_are_refused_with_a_reason(mnist1d):
    dims, w, x_all, y_all, order, offsets, sizes = _kernel_args(mnist1d)
    bad_y = y_all.copy()
    bad_y[-1] = mnist1d.num_classes
    with pytest.raises(ValueError, match="label is outside"):
        native.cnn1d_train(dims, w, x_all, bad_y, order, offsets, sizes, 0.1, 0.0)
    with pytest.raises(ValueError, match="outside"):
        native.cnn1d_train(dims, w, x_all, y_all, order + 1, offsets, sizes, 0.1, 0.0)
    with pytest.raises(ValueError, match="within"):
        native.cnn1d_train(dims, w, x_all, y_all, order, offsets, sizes + 1, 0.1, 0.0)
    with pytest.raises(ValueError, match="global_w must be"):
        native.cnn1d_train(dims, w[:-1], x_all, y_all, order, offsets, sizes, 0.1, 0.0)
    with pytest.raises(ValueError, match="x_all must be"):
        native.cnn1d_train(dims, w, x_all[:, :-1], y_all, order, offsets, sizes, 0.1, 0.0)
    updates, losses = native.cnn1d_train(dims, w, x_all, y_all, order, offsets, sizes, 0.1, 0.0)
    assert updates.shape == (1, w.numel()) and bool(torch.isfinite(updates).all()) and losses[0] > 0


def test_unsupported_models_have_no_kernel():
    assert native.cnn1d_dims(build_model("mlp", 40, 10), 16) is None
    cnn = build_model("cnn1d", 40, 10)
    cnn.conv2 = torch.nn.Conv1d(16, 32, 5, stride=2, padding=2, bias=False)
    assert native.cnn1d_dims(cnn, 16) is None


def _probe(env_extra, tmp_path):
    code = (
        "import torch; from fedsim.training import native; from fedsim.data import build_federated_data;"
        "from fedsim.training.trainer import ClientTrainer, TrainSettings, initial_weights;"
        "from fedsim.training.vectorized import train_vectorized, native_dims;"
        "d = build_federated_data('mnist1d', num_clients=4, heldout_fraction=0.0, num_samples=200);"
        "s = TrainSettings(model='cnn1d', model_kwargs={}, batch_size=8, vectorize=True);"
        "t = ClientTrainer(d, s, device='cpu');"
        "w = torch.as_tensor(initial_weights(s, d.input_dim, d.num_classes), dtype=torch.float32);"
        "out = list(train_vectorized(t, 1, [0, 1, 2], w));"
        "assert native_dims(t) is None and len(out) == 3 and all(bool(torch.isfinite(u).all()) for u, _ in out);"
        "print('REASON', native.unavailable_reason())"
    )
    env = {**os.environ, "FEDSIM_CACHE_DIR": str(tmp_path / "cache"), **env_extra}
    res = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.split("REASON", 1)[1].strip()


def test_without_a_working_compiler_training_falls_back(tmp_path):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'broken compiler' >&2\nexit 1\n")
    failing.chmod(0o755)
    reason = _probe({"CC": str(failing)}, tmp_path)
    if _sgemm_missing(reason):
        pytest.skip(reason)
    assert "broken compiler" in reason
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("*.so"))


def test_disabled_by_environment(tmp_path):
    assert _probe({"FEDSIM_NATIVE": "0"}, tmp_path) == "disabled by FEDSIM_NATIVE"


def _sgemm_missing(reason: str) -> bool:
    return "exports no sgemm_" in reason


@needs_kernel
def test_thread_count_does_not_change_the_result(mnist1d):
    trainer, w = _setup(mnist1d, "momentum", 1, 8)
    cids = list(range(24))
    x, y = zip(*(trainer._tensors(c) for c in cids), strict=True)
    sizes = np.array([len(t) for t in y], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    order = np.arange(int(sizes.sum()), dtype=np.int64)[None, :]
    dims = native.cnn1d_dims(trainer.model, 8)
    x_all, y_all = torch.cat(x).numpy(), torch.cat(y).numpy()
    results = [
        native.cnn1d_train(dims, w, x_all, y_all, order, offsets, sizes, 0.05, 0.9, threads=threads)
        for threads in (1, 2, 5, 64)
    ]
    for updates, losses in results[1:]:
        assert torch.equal(updates, results[0][0]) and np.array_equal(losses, results[0][1])
    assert bool((results[0][0] != 0).any(dim=1).all())  # every client trained


@needs_kernel
def test_a_batch_larger_than_every_client_is_one_full_batch(mnist1d):
    # scratch memory follows the clients' sizes, not batch_size: a huge batch_size must not allocate for it
    cids = [2, 5, 8]
    out = {}
    for batch_size in (10**8, int(max(mnist1d.num_examples_array(cids)))):
        trainer, w = _setup(mnist1d, "sgd", 2, batch_size)
        out[batch_size] = [u for u, _ in vec.train_vectorized(trainer, 1, cids, w)]
    a, b = out.values()
    for ua, ub in zip(a, b, strict=True):
        assert torch.equal(ua, ub)


@needs_kernel
def test_rows_say_which_implementation_trained(monkeypatch):
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    scenario = load_scenario(
        "quickstart",
        [
            "data.dataset=mnist1d",
            "data.num_samples=2000",
            "data.num_clients=20",
            "model.name=cnn1d",
            "engine.name=local",
            "engine.vectorize=true",
            "rounds=2",
            "client.local_epochs=1",
        ],
    )
    fast = run_scenario(scenario, write=False).rows
    monkeypatch.setenv("FEDSIM_NATIVE", "0")
    slow = run_scenario(scenario, write=False).rows
    assert [r["local_training"] for r in fast] == ["native-cnn1d"] * 2
    assert [r["local_training"] for r in slow] == ["vectorized"] * 2
    assert fast[-1]["non_private"]["train_loss"] == pytest.approx(
        slow[-1]["non_private"]["train_loss"], rel=1e-4
    )


@needs_kernel
def test_a_zero_batch_size_is_refused(mnist1d):
    dims, w, x_all, y_all, order, offsets, sizes = _kernel_args(mnist1d)
    dims = dims.copy()
    dims[13] = 0
    with pytest.raises(ValueError, match="dims must be"):
        native.cnn1d_train(dims, w, x_all, y_all, order, offsets, sizes, 0.1, 0.0)
