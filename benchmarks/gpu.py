"""GPU benchmark: fedsim's local training on CUDA against the CPU, and Ray actors sharing one GPU.

Run on a machine with a CUDA device (the CPU-only CI never runs it):

    python benchmarks/gpu.py                       # builds the engine benchmark's MNIST-1D population
    python benchmarks/gpu.py --data population.pkl # a pickled FederatedData (no flwr-datasets needed)

Figures: seconds per round of ``ClientTrainer.train`` (train, clip and sum a cohort) for

* the engine benchmark's workload (MNIST-1D, 1,000 Dirichlet clients, MLP(100), batch 16, 1 epoch) with
  100 and 1,000 clients per round: CPU (1 thread and all threads) vs CUDA, loop vs vectorised;
* cnn1d on the same data, vectorised, with its achieved training FLOP/s;
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
    from fedsim.training.trainer import ClientTrainer, TrainSettings, initial_weights

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
    print(f"population: {data.num_clients} clients, input_dim {data.input_dim}")
    rng = np.random.default_rng(0)
    ids = np.arange(data.num_clients)
    cohort100 = ids[rng.random(ids.size) < 100 / ids.size]
    threads = torch.get_num_threads()

    def settings(model: str, vectorize: bool) -> TrainSettings:
        mk = {"hidden": [100]} if model == "mlp" else {}
        return TrainSettings(
            model=model, model_kwargs=mk, local_epochs=1, batch_size=16, lr=0.1, seed=0, vectorize=vectorize
        )

    print(
        f"\n{'model':6s} {'cohort':>6s} {'path':10s} {'CPU 1 thr':>10s} {'CPU all':>10s} {'CUDA':>10s}"
        f" {'CPU1/CUDA':>9s}   (seconds per round: train + clip + sum)"
    )
    for model in ("mlp", "cnn1d"):
        for cohort in (cohort100, ids):
            for vec in (False, True):
                if not vec and cohort.size > 200:
                    continue  # the per-client loop over 1,000 clients on CUDA is launch-bound: not informative
                s = settings(model, vec)
                w = initial_weights(s, data.input_dim, data.num_classes)
                row = {}
                for dev, nthreads in (("cpu", 1), ("cpu", threads), ("cuda", threads)):
                    torch.set_num_threads(nthreads)
                    tr = ClientTrainer(data, s, device=dev)
                    row[(dev, nthreads)] = timed(lambda: tr.train(1, cohort, w, 1.0), args.reps)
                torch.set_num_threads(threads)
                c1, ca, g = row[("cpu", 1)], row[("cpu", threads)], row[("cuda", threads)]
                print(
                    f"{model:6s} {cohort.size:6d} {'vectorized' if vec else 'loop':10s} {c1:10.4f} {ca:10.4f}"
                    f" {g:10.4f} {c1 / g:8.1f}x",
                    flush=True,
                )

    # achieved FLOP/s of cnn1d, vectorised on CUDA, 1,000 clients (useful FLOPs: a plain step's per-example FLOPs)
    from torch.utils.flop_counter import FlopCounterMode

    from fedsim.models import build_model

    m = build_model("cnn1d", data.input_dim, data.num_classes)
    xb, yb = torch.randn(16, data.input_dim), torch.randint(0, data.num_classes, (16,))
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.cross_entropy(m(xb), yb).backward()
    per_example = fc.get_total_flops() / 16
    s = settings("cnn1d", True)
    w = initial_weights(s, data.input_dim, data.num_classes)
    tr = ClientTrainer(data, s, device="cuda")
    t = timed(lambda: tr.train(1, ids, w, 1.0), args.reps)
    examples = int(data.num_examples_array(ids).sum())
    a, b = torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")
    tf = timed(lambda: torch.mm(a, b), 10)
    torch.backends.cuda.matmul.allow_tf32 = False
    peak = 2 * 8192**3 / tf
    print(
        f"\ncnn1d vectorised on CUDA, {ids.size} clients, {examples} examples: {t:.4f} s/round,"
        f" {per_example * examples / t / 1e9:.1f} GFLOP/s useful; fp32 matmul peak here {peak / 1e12:.1f} TFLOP/s"
        " (tiny per-client GEMMs: launch- and bandwidth-bound, far from peak)"
    )

    if not args.skip_ray:
        import ray

        from fedsim.engine.ray_engine import RayEngine

        class Plan:
            round, clip, noise_share_std, client_weights, loss_bound = 1, 1.0, 0.0, None, None
            cohort = ids

        s = settings("mlp", True)
        w = initial_weights(s, data.input_dim, data.num_classes)
        print("\nRayEngine, mlp, all clients per round, vectorised:")
        for workers, gpus in ((1, 1.0), (2, 0.5), (4, 0.25), (4, 0.0)):
            eng = RayEngine(data, s, num_workers=workers, num_cpus=1.0, num_gpus=gpus)
            try:
                devices = sorted({i["device"] for i in eng.infos})
                for cohort in (cohort100, ids):
                    Plan.cohort = cohort
                    t = timed(lambda: eng.train(Plan, w), args.reps)
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


if __name__ == "__main__":
    sys.exit(main())
