"""GPU benchmark: fedsim's local training on CUDA against the CPU, and Ray actors sharing one GPU.

Run on a machine with a CUDA device (the CPU-only CI never runs it):

    python benchmarks/gpu.py                       # builds the engine benchmark's MNIST-1D population
    python benchmarks/gpu.py --data population.pkl # a pickled FederatedData (no flwr-datasets needed)

Figures: seconds per round of ``ClientTrainer.train`` (train, clip and sum a cohort), CPU (1 thread and all
threads) vs CUDA, the per-client loop vs the vectorised path (``auto``: per-layer rules for these models), with
100 and 1,000 clients per round, for

* the engine benchmark's workload: MNIST-1D, 1,000 Dirichlet clients, MLP(100), batch 16, 1 epoch; and cnn1d
  on the same data;
* the Conv2d CNN (``cnn2d``, GroupNorm) on 1x8x8 digit images: 1,000 clients of 50 images each (the 1,797
  digits shifted by up to one pixel, so that every client has a batch's worth);
* a ``RayEngine`` of 2 and 4 actors each holding a fraction of the one GPU.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

import numpy as np
import torch

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-gpu-")


def timed(fn, reps: int) -> float:
    fn()  # warm-up (caches, CUDA context, kernels)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", help="a pickled FederatedData (default: build the engine benchmark's population)"
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip-ray", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights

    if args.data:
        with open(args.data, "rb") as f:
            data = pickle.load(f)
    else:
        from fedsim.data import build_federated_data

        data = build_federated_data(
            "mnist1d",
            num_clients=1000,
            partitioner="dirichlet",
            alpha=0.5,
            heldout_fraction=0.0,
            num_samples=50_000,
            seed=0,
        )
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; training in full FP32 (TF32 off)")
    print(f"population: {data.num_clients} clients, input shape {data.input_shape}")
    rng = np.random.default_rng(0)
    ids = np.arange(data.num_clients)
    cohort100 = ids[rng.random(ids.size) < 100 / ids.size]
    threads = torch.get_num_threads()

    def settings(model: str, vectorize: bool) -> TrainSettings:
        from fedsim.models import MODEL_FACTORIES

        mk = {"hidden": [100]} if model == "mlp" else {}
        return TrainSettings(
            model=MODEL_FACTORIES[model],
            model_kwargs=mk,
            local_epochs=1,
            batch_size=16,
            lr=0.1,
            seed=0,
            vectorize="auto" if vectorize else "loop",
        )

    from fedsim.data import build_federated_data

    images = build_federated_data(
        shifted_digits,
        num_clients=1000,
        heldout_fraction=0.0,
        seed=0,
        options={"per_client": 50},
    )
    print(
        f"\n{'model':6s} {'cohort':>6s} {'path':10s} {'CPU 1 thr':>10s} {'CPU all':>10s} {'CUDA':>10s}"
        f" {'CPU1/CUDA':>9s}   (seconds per round: train + clip + sum)"
    )
    for model, population in (("mlp", data), ("cnn1d", data), ("cnn2d", images)):
        pids = np.arange(population.num_clients)
        for cohort in (pids[rng.random(pids.size) < 100 / pids.size], pids):
            for vec in (False, True):
                if not vec and cohort.size > 200:
                    continue  # the per-client loop over 1,000 clients on CUDA is launch-bound: not informative
                s = settings(model, vec)
                w = initial_weights(s, population.input_shape, population.num_classes)
                row, path = {}, ""
                for dev, nthreads in (("cpu", 1), ("cpu", threads), ("cuda", threads)):
                    torch.set_num_threads(nthreads)
                    tr = ClientTrainer(population, s, device=dev)
                    path = tr.path.name
                    plan = ClientPlan(round=1, cohort=cohort, clip=1.0)
                    row[(dev, nthreads)] = timed(lambda: tr.train(plan, w), args.reps)
                torch.set_num_threads(threads)
                c1, ca, g = row[("cpu", 1)], row[("cpu", threads)], row[("cuda", threads)]
                print(
                    f"{model:6s} {cohort.size:6d} {path:10s} {c1:10.4f} {ca:10.4f} {g:10.4f} {c1 / g:8.1f}x",
                    flush=True,
                )

    if not args.skip_ray:
        import ray

        from fedsim.engine.ray_engine import RayEngine

        s = settings("mlp", True)
        w = initial_weights(s, data.input_shape, data.num_classes)
        print("\nRayEngine, mlp, all clients per round, vectorised:")
        for workers, gpus in ((1, 1.0), (2, 0.5), (4, 0.25), (4, 0.0)):
            eng = RayEngine(data, s, num_workers=workers, num_cpus=1.0, num_gpus=gpus)
            try:
                devices = sorted({i["device"] for i in eng.infos})
                for cohort in (cohort100, ids):
                    plan = ClientPlan(round=1, cohort=cohort, clip=1.0)
                    t = timed(lambda: eng.train(plan, w), args.reps)
                    print(
                        f"  {workers} actors x {gpus:4.2f} GPU ({','.join(devices)}), cohort {cohort.size:5d}:"
                        f" {t:.4f} s/round",
                        flush=True,
                    )
            finally:
                eng.close()
            if ray.is_initialized():
                ray.shutdown()
    return 0


def shifted_digits(num_clients: int, seed: int, per_client: int = 50) -> dict:
    """A data function (fedsim.data.user): ``per_client`` 1x8x8 digit images per client, drawn from the 1,797
    scikit-learn digits and shifted by up to one pixel each way."""
    from fedsim.data.base import load_digits_arrays

    base = load_digits_arrays()
    rng = np.random.default_rng(seed)
    n = num_clients * per_client
    pick = rng.integers(0, len(base), size=n)
    padded = np.pad(base.x[pick], ((0, 0), (0, 0), (1, 1), (1, 1)))
    dy, dx = rng.integers(0, 3, size=n), rng.integers(0, 3, size=n)
    x = np.stack([padded[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8] for i in range(n)])
    clients = [np.arange(c * per_client, (c + 1) * per_client) for c in range(num_clients)]
    return {"x": x, "y": base.y[pick], "clients": clients, "num_classes": 10}


if __name__ == "__main__":
    sys.exit(main())
