"""GPU paths: run only where CUDA is available (CI is CPU-only and skips this module).

On a GPU machine: ``python -m pytest tests/engine/test_gpu.py``. Each test compares the CUDA result with
the CPU result of the same computation, so a CUDA-only bug cannot pass as "it ran".
"""

import numpy as np
import pytest
import torch

from fedsim.training.trainer import ClientPlan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def data():
    from fedsim.data import build_federated_data

    # Synthetic clients need no partitioner (no flwr-datasets / datasets on a bare GPU image)
    return build_federated_data(
        "synthetic", num_clients=200, heldout_fraction=0.0, synthetic_alpha=1, synthetic_beta=1, seed=3
    )


def _settings(model="mlp", vectorize=False, **kw):
    from fedsim.models import MODEL_FACTORIES
    from fedsim.training.trainer import TrainSettings

    mk = {"hidden": [32]} if model == "mlp" else {}
    return TrainSettings(
        model=MODEL_FACTORIES[model],
        model_kwargs=mk,
        local_epochs=2,
        batch_size=8,
        lr=0.05,
        seed=1,
        vectorize=vectorize,
        **kw,
    )


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("model", ["mlp", "logreg"])
def test_trainer_on_cuda_matches_cpu(data, model, vectorize):
    from fedsim.training.trainer import ClientTrainer, initial_weights

    s = _settings(model, vectorize)
    w = initial_weights(s, data.input_shape, data.num_classes)
    cids = np.arange(0, 200, 9)
    cpu, m_cpu = ClientTrainer(data, s, device="cpu").train(ClientPlan(2, cids, 1.0), w)
    gpu_trainer = ClientTrainer(data, s, device="cuda")
    assert next(gpu_trainer.model.parameters()).is_cuda
    gpu, m_gpu = gpu_trainer.train(ClientPlan(2, cids, 1.0), w)
    assert gpu.count == cpu.count == cids.size and gpu.rejected == 0
    np.testing.assert_allclose(gpu.total, cpu.total, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(
        [m["update_norm"] for m in m_gpu], [m["update_norm"] for m in m_cpu], rtol=1e-3
    )


def test_conv2d_cnn_per_layer_on_cuda_matches_the_cpu_loop():
    from fedsim.data import build_federated_data
    from fedsim.training.trainer import ClientTrainer, initial_weights

    d = build_federated_data("digits", num_clients=30, partitioner="iid", heldout_fraction=0.0, seed=2)
    s = _settings("cnn2d", vectorize="per-layer")
    w = initial_weights(s, d.input_shape, d.num_classes)
    cids = np.arange(0, 30, 2)
    loop = ClientTrainer(d, _settings("cnn2d", vectorize=False), device="cpu").train(
        ClientPlan(1, cids, 0.7), w
    )[0]
    gpu = ClientTrainer(d, s, device="cuda")
    assert gpu.path.name == "per-layer"
    vec = gpu.train(ClientPlan(1, cids, 0.7), w)[0]
    np.testing.assert_allclose(vec.total, loop.total, rtol=1e-3, atol=1e-4)


def test_cnn_vectorized_on_cuda_matches_the_cpu_loop():
    from fedsim.data import build_federated_data
    from fedsim.training.trainer import ClientTrainer, initial_weights

    d = build_federated_data(
        "synthetic", num_clients=40, heldout_fraction=0.0, synthetic_alpha=0.5, synthetic_beta=0.5, seed=4
    )
    s = _settings("cnn1d", vectorize=True)
    w = initial_weights(s, d.input_shape, d.num_classes)
    cids = np.arange(0, 40, 3)
    loop = ClientTrainer(d, _settings("cnn1d", vectorize=False), device="cpu").train(
        ClientPlan(1, cids, 0.7), w
    )[0]
    vec = ClientTrainer(d, s, device="cuda").train(ClientPlan(1, cids, 0.7), w)[0]
    np.testing.assert_allclose(vec.total, loop.total, rtol=1e-3, atol=1e-4)


def test_add_batch_on_cuda_matches_numpy():
    from fedsim.round import PartialSum

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 257)) * rng.choice([0.01, 1.0, 10.0], size=(300, 1))
    rows[7, 3] = np.nan
    weights = rng.uniform(0.5, 2, 300)
    a, b = PartialSum(257), PartialSum(257)
    na = a.add_batch(torch.as_tensor(rows, device="cuda"), 1.5, weights)
    nb = b.add_batch(rows, 1.5, weights)
    np.testing.assert_allclose(a.total, b.total, rtol=1e-10)
    np.testing.assert_allclose(na, nb, rtol=1e-10, equal_nan=True)
    assert (a.count, a.rejected, a.unclipped) == (b.count, b.rejected, b.unclipped) == (299, 1, b.unclipped)


def test_ray_actors_with_fractional_gpus_train_on_cuda_and_match_cpu(data):
    import ray

    from fedsim.engine.ray_engine import LocalEngine, RayEngine

    s = _settings("mlp", vectorize=True)
    from fedsim.training.trainer import initial_weights

    w = initial_weights(s, data.input_shape, data.num_classes)

    Plan = ClientPlan(3, np.arange(0, 200, 2), 1.0)

    ref, _ = LocalEngine(data, s, device="cpu").train(Plan, w)
    engine = RayEngine(data, s, num_workers=4, num_cpus=1.0, num_gpus=0.25)
    try:
        assert [i["device"] for i in engine.infos] == ["cuda"] * 4
        assert len({i["pid"] for i in engine.infos}) == 4  # four processes share the one GPU
        assert ray.cluster_resources().get("GPU", 0) >= 1
        got, metrics = engine.train(Plan, w)
        assert got.count == Plan.cohort.size and len(metrics) == Plan.cohort.size
        np.testing.assert_allclose(got.total, ref.total, rtol=1e-3, atol=1e-4)
        rows = engine.evaluate(Plan.cohort, w)
        ref_rows = LocalEngine(data, s, device="cpu").evaluate(Plan.cohort, w)
        np.testing.assert_allclose(
            rows[np.argsort(rows[:, 0])], ref_rows[np.argsort(ref_rows[:, 0])], rtol=1e-3, atol=1e-3
        )
    finally:
        engine.close()


def test_cpu_only_actors_see_no_gpu_even_on_a_gpu_machine(data):
    from fedsim.engine.ray_engine import RayEngine

    engine = RayEngine(data, _settings(), num_workers=2, num_cpus=1.0, num_gpus=0.0)
    try:
        assert [i["device"] for i in engine.infos] == ["cpu", "cpu"]
    finally:
        engine.close()
