"""pfl-research (Apple's ``pfl`` 0.6.0) on the workload of ``benchmarks/engine.py``: the pfl side of that comparison.

Workload (the same as ``benchmarks/engine.py``):

* MNIST-1D generated locally with ``mnist1d.data.make_dataset`` (never downloaded): ``num_samples = 50,000``,
  mnist1d's default arguments otherwise (its default generator seed 42, as ``fedsim.data`` uses), the library's
  train and test splits concatenated back into one pool of 50,000 examples of 40 float32 features;
* 1,000 clients, Dirichlet(0.5) label partition with seed 0 (a plain NumPy partitioner below: each class is
  split among the clients by proportions drawn from Dirichlet(0.5 * ones(1000)); clients left empty get one
  example moved from the largest client);
* an MLP 40 -> 100 -> ReLU -> 10 with cross-entropy loss (PyTorch, ``pfl.model.pytorch.PyTorchModel``);
* per round: Poisson sampling of clients with rate q = 0.1 (about 100 a round), 1 local epoch of batch 16 with
  local SGD at lr 0.1, FedAvg on the server (central SGD, lr 1.0), each client's update clipped to l2 norm 1
  and Gaussian noise with multiplier 1 added centrally to the sum (pfl's ``CentrallyAppliedPrivacyMechanism``
  wrapping ``GaussianMechanism(clipping_bound=1.0, relative_noise_stddev=1.0)``, i.e. noise std 1.0 on the
  sum, before pfl divides by the number of sampled clients); 30 rounds; no evaluation during training.

pfl 0.6 has no Poisson user sampler (``FederatedDataset`` draws a fixed ``train_cohort_size`` of users, each
uniformly with replacement). Poisson sampling is built here from pfl's own extension points: a
``HyperParam`` + ``TrainingProcessCallback`` cohort size that changes every round (the pattern of pfl's
``HyperParam`` docstring) and a ``FederatedDatasetBase`` subclass whose ``get_cohort`` returns that round's
Poisson sample (each client independently with probability q), split round-robin among the workers the way
pfl's ``FederatedDataset.get_cohort`` splits a cohort. ``--cohort fixed`` uses pfl's stock
``FederatedDataset`` with its ``'random'`` user sampler and a fixed cohort of 100 instead.

Processes: ``--processes 2`` runs pfl's own multi-worker simulation on CPU: pfl 0.6 starts a
``torch.distributed`` gloo process group when each process has ``PFL_WORKER_ADDRESSES`` (all workers'
``host:port``, the first is the rendezvous) and ``PFL_WORKER_RANK`` set (``pfl.internal.platform.
generic_platform``; ``torchrun`` is the other supported launcher, Horovod is not needed). Each worker trains
its share of the cohort and the updates are summed with ``all_reduce``. This script is its own launcher: the
outer process generates and partitions the data once (timed separately, excluded from end-to-end, as in
``engine.py``), writes it to a temporary ``.npz``, then starts the worker processes with ``subprocess`` and
times them from launch to exit (imports, pfl setup and loading the ``.npz`` included). Each of 2 workers uses
``torch.set_num_threads(1)``; the 1-process run keeps PyTorch's default thread count (printed in the notes)
unless ``--threads`` is given.

Per-round wall-clock times (``time.perf_counter``) come from a pfl callback on worker 0: the time between
consecutive ``after_central_iteration`` calls (the first from ``on_train_begin``). Steady state excludes the
first 3 rounds.

Run from the repository root with the venv that has pfl (it is not a fedsim dependency)::

    /tmp/pflv/bin/python benchmarks/pfl_workload.py --processes 1
    /tmp/pflv/bin/python benchmarks/pfl_workload.py --processes 2 --rounds 30 --json /tmp/pfl2.json

The last line printed is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

STEADY_SKIP = 3  # rounds excluded from the steady state
NUM_SAMPLES = 50_000
NUM_CLIENTS = 1000
ALPHA = 0.5
SEED = 0
Q = 0.1
FIXED_COHORT = 100
HIDDEN = 100
EPOCHS = 1
BATCH = 16
LOCAL_LR = 0.1
CENTRAL_LR = 1.0
CLIP = 1.0
NOISE_MULTIPLIER = 1.0


# ---------------------------------------------------------------- data (outer process)
def make_mnist1d(num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples  # everything else (seed 42 included) at mnist1d's defaults, as fedsim
    data = make_dataset(args)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


def dirichlet_partition(y: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Split each class among the clients by Dirichlet(alpha) proportions; no client is left empty."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(alpha * np.ones(num_clients))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].extend(chunk.tolist())
    for k in range(num_clients):  # reassign: move one example from the largest client to each empty one
        if not parts[k]:
            donor = max(range(num_clients), key=lambda j: len(parts[j]))
            parts[k].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def poisson_schedule(rounds: int, num_clients: int, q: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [np.flatnonzero(rng.random(num_clients) < q) for _ in range(rounds)]


# ---------------------------------------------------------------- one pfl worker
def worker(args: argparse.Namespace) -> None:
    t_import = time.perf_counter()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset, FederatedDatasetBase
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.hyperparam.base import HyperParam
    from pfl.internal.ops.selector import get_default_framework_module as get_ops
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

    import_s = time.perf_counter() - t_import
    rank = get_ops().distributed.global_rank
    world = get_ops().distributed.world_size
    assert world == args.processes, (world, args.processes)

    np.random.seed(SEED)  # pfl's internal generators must agree on all workers
    torch.manual_seed(SEED)  # same initial model on all workers

    blob = np.load(args.data)
    x, y, offsets = blob["x"], blob["y"], blob["offsets"]
    order = blob["order"]
    users = [
        (torch.from_numpy(x[order[a:b]]), torch.from_numpy(y[order[a:b]]))
        for a, b in itertools.pairwise(offsets.tolist())
    ]
    schedule = [blob[f"round{r}"] for r in range(args.rounds)] if args.cohort == "poisson" else None

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(40, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
            )

        def forward(self, xb: torch.Tensor) -> torch.Tensor:
            return self.net(xb)

        def loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            self.train()
            return torch.nn.functional.cross_entropy(self(xb), yb)

        @torch.no_grad()
        def metrics(self, xb: torch.Tensor, yb: torch.Tensor) -> dict[str, Weighted]:
            self.eval()
            logits = self(xb)
            n = len(yb)
            return {
                "loss": Weighted(float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum")), n),
                "accuracy": Weighted(float((logits.argmax(1) == yb).sum()), n),
            }

    class PoissonCohortSize(HyperParam, TrainingProcessCallback):
        """Cohort size of the current round's Poisson sample (pfl reads it once per round)."""

        def __init__(self, sched: list[np.ndarray]) -> None:
            self._sched = sched
            self._round = 0

        def value(self) -> int:
            return len(self._sched[min(self._round, len(self._sched) - 1)])

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self._round = central_iteration + 1
            return False, Metrics()

    class PoissonFederatedDataset(FederatedDatasetBase):
        """Round r's cohort is ``sched[r]``, split round-robin among the workers like pfl's get_cohort."""

        def __init__(self, sched: list[np.ndarray]) -> None:
            super().__init__()
            self._sched = sched
            self._round = 0

        def _make(self, uid: int) -> Dataset:
            return Dataset(users[uid], user_id=str(uid))

        def __next__(self):
            uid = int(np.random.randint(len(users)))
            return self._make(uid), self._get_seed()

        def get_cohort(self, cohort_size: int):
            cohort = self._sched[self._round]
            self._round += 1
            assert cohort_size == len(cohort), (cohort_size, len(cohort))
            seeds = [self._get_seed() for _ in cohort]  # drawn on every worker, so they stay in step
            for i, uid in enumerate(cohort):
                if i % world == rank:
                    yield self._make(int(uid)), seeds[i]

    class NoEvalFedAvg(FederatedAveraging):
        """FedAvg with the per-client evaluation pfl does on round 0 (``0 % frequency == 0``) turned off."""

        def get_next_central_contexts(self, *a, **kw):
            import dataclasses

            contexts, model, metrics = super().get_next_central_contexts(*a, **kw)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
            return contexts, model, metrics

    class RoundTimer(TrainingProcessCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._last = 0.0

        def on_train_begin(self, *, model):
            self._last = time.perf_counter()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            now = time.perf_counter()
            self.times.append(now - self._last)
            self._last = now
            return False, Metrics()

    callbacks: list[Any] = []
    if args.cohort == "poisson":
        cohort_size: Any = PoissonCohortSize(schedule)
        callbacks.append(cohort_size)
        train_data: Any = PoissonFederatedDataset(schedule)
    else:
        cohort_size = FIXED_COHORT
        train_data = FederatedDataset(
            lambda uid: Dataset(users[uid], user_id=str(uid)), get_user_sampler("random", range(len(users)))
        )
    timer = RoundTimer()
    callbacks.append(timer)

    pytorch_model = MLP()
    model = PyTorchModel(
        model=pytorch_model,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(pytorch_model.parameters(), lr=CENTRAL_LR),
    )
    dp = CentrallyAppliedPrivacyMechanism(
        GaussianMechanism(clipping_bound=CLIP, relative_noise_stddev=NOISE_MULTIPLIER)
    )
    backend = SimulatedBackend(training_data=train_data, val_data=None, postprocessors=[dp])
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=args.rounds,
        evaluation_frequency=args.rounds + 1,
        train_cohort_size=cohort_size,
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=EPOCHS, local_learning_rate=LOCAL_LR, local_batch_size=BATCH
    )
    setup_s = time.perf_counter() - t_import

    t_train = time.perf_counter()
    NoEvalFedAvg().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=callbacks,
        send_metrics_to_platform=False,
    )
    train_s = time.perf_counter() - t_train

    if rank == 0:  # a sanity check after training (not timed per round): accuracy on all 50,000 examples
        m = pytorch_model.metrics(torch.from_numpy(x), torch.from_numpy(y))
        result = {
            "round_times": timer.times,
            "import_s": import_s,
            "setup_s": setup_s,
            "train_s": train_s,
            "torch_threads": torch.get_num_threads(),
            "final_accuracy_all_data": m["accuracy"].overall_value,
            "cohort_sizes": [len(c) for c in schedule] if schedule is not None else None,
        }
        with open(args.result, "w") as f:
            json.dump(result, f)
    if world > 1:  # leave together: a worker exiting while the other still holds the gloo group aborts
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- launcher (outer process)
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="pfl-bench-")
    t0 = time.perf_counter()
    x, y = make_mnist1d(NUM_SAMPLES)
    gen_s = time.perf_counter() - t0
    parts = dirichlet_partition(y, NUM_CLIENTS, ALPHA, SEED)
    sizes = np.array([len(p) for p in parts])
    arrays: dict[str, np.ndarray] = {
        "x": x,
        "y": y,
        "order": np.concatenate(parts),
        "offsets": np.concatenate([[0], np.cumsum(sizes)]),
    }
    sched = poisson_schedule(args.rounds, NUM_CLIENTS, Q, SEED)
    for r, c in enumerate(sched):
        arrays[f"round{r}"] = c
    data_path = os.path.join(tmp, "data.npz")
    np.savez(data_path, **arrays)
    data_s = time.perf_counter() - t0
    print(
        f"data: {len(x)} examples x {x.shape[1]} features, {NUM_CLIENTS} clients (sizes {sizes.min()}.."
        f"{sizes.max()}, median {int(np.median(sizes))}); generated in {gen_s:.1f} s, "
        f"with partitioning and .npz {data_s:.1f} s",
        flush=True,
    )

    threads = args.threads or (1 if args.processes > 1 else 0)
    result_path = os.path.join(tmp, "result.json")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--data",
        data_path,
        "--result",
        result_path,
    ]
    cmd += ["--rounds", str(args.rounds), "--processes", str(args.processes), "--cohort", args.cohort]
    cmd += ["--threads", str(threads)]
    env = dict(os.environ)
    for k in ("PFL_WORKER_ADDRESSES", "PFL_WORKER_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    if args.processes > 1:
        env["PFL_WORKER_ADDRESSES"] = ",".join(f"127.0.0.1:{free_port()}" for _ in range(args.processes))

    t_start = time.perf_counter()
    procs = []
    for r in range(args.processes):
        penv = dict(env)
        if args.processes > 1:
            penv["PFL_WORKER_RANK"] = str(r)
        procs.append(subprocess.Popen(cmd, env=penv))
    codes = [p.wait() for p in procs]
    e2e_s = time.perf_counter() - t_start
    if any(codes):
        raise SystemExit(f"worker exit codes {codes}")

    with open(result_path) as f:
        w = json.load(f)
    shutil.rmtree(tmp, ignore_errors=True)
    times = w["round_times"]
    steady = times[STEADY_SKIP:] or times
    if args.cohort == "poisson":
        cs = w["cohort_sizes"]
        cohort = f"poisson q={Q}"
        cohort_note = (
            f"Poisson sampling (each of {NUM_CLIENTS} clients with prob. {Q}, cohort sizes {min(cs)}..{max(cs)}, "
            f"mean {np.mean(cs):.1f}) via a per-round HyperParam cohort size and a FederatedDatasetBase "
            "subclass (pfl 0.6 has no Poisson user sampler)"
        )
    else:
        cohort = f"fixed {FIXED_COHORT} (pfl 'random' user sampler, uniform with replacement)"
        cohort_note = "fixed cohort of 100 with pfl's stock FederatedDataset"
    thread_note = (
        f"torch.set_num_threads({threads}) in each worker"
        if threads
        else f"PyTorch's default threads ({w['torch_threads']})"
    )
    notes = (
        f"{cohort_note}; central DP: CentrallyAppliedPrivacyMechanism(GaussianMechanism(clipping_bound={CLIP}, "
        f"relative_noise_stddev={NOISE_MULTIPLIER})), noise on the sum, then FedAvg divides by the number of "
        f"sampled clients; {args.processes} process(es), "
        + ("torch.distributed gloo via PFL_WORKER_ADDRESSES/PFL_WORKER_RANK; " if args.processes > 1 else "")
        + f"{thread_note}; worker 0: imports {w['import_s']:.1f} s, setup {w['setup_s']:.1f} s, "
        f"training {w['train_s']:.1f} s; e2e = launch to exit of the worker processes, data excluded; "
        f"mnist1d seed 42 (its default, as fedsim), partition seed 0; "
        f"accuracy on all data after training {w['final_accuracy_all_data']:.3f}"
    )
    return {
        "system": f"pfl-research 0.6.0, {args.processes} process{'es' if args.processes > 1 else ''}",
        "processes": args.processes,
        "rounds": args.rounds,
        "steady_s_round_median": round(statistics.median(steady), 4),
        "steady_s_round_mean": round(statistics.fmean(steady), 4),
        "e2e_s": round(e2e_s, 2),
        "data_s": round(data_s, 2),
        "cohort": cohort,
        "notes": notes,
        "round_times_s": [round(t, 4) for t in times],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=1, help="pfl worker processes (1 or 2)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--cohort", choices=["poisson", "fixed"], default="poisson")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads per worker (0: 1 if several, else default)"
    )
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    out = launch(args)
    print(
        f"{out['system']}: steady state (rounds {STEADY_SKIP + 1}..{args.rounds}) median "
        f"{out['steady_s_round_median']:.3f} s/round, mean {out['steady_s_round_mean']:.3f} s/round; "
        f"end-to-end {out['e2e_s']:.1f} s; data {out['data_s']:.1f} s (excluded)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
