"""Engines that train a round's cohort: in-process (:class:`LocalEngine`) and on Ray actors (:class:`RayEngine`).

Both expose the same two calls, used by :mod:`fedsim.engine.runner`:

* ``train(plan, weights) -> (PartialSum, client_metrics)``: the cohort's clipped sum;
* ``evaluate(client_ids, weights) -> rows``: per-client ``[client, n, loss_sum, correct]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from fedsim.round import PartialSum
from fedsim.training.trainer import ClientTrainer, TrainSettings, initial_weights


class LocalEngine:
    """Everything in this process: no start-up cost; the reference the other engines must match."""

    name = "local"

    def __init__(self, data: Any, settings: TrainSettings, device: str | None = None) -> None:
        self.data = data
        self.trainer = ClientTrainer(data, settings, device=device)
        self.dim = self.trainer.dim
        self.num_workers = 1

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        return self.trainer.train(
            plan.round,
            plan.cohort,
            weights,
            plan.clip,
            plan.noise_share_std,
            plan.client_weights,
            plan.loss_bound,
            noise_seed=plan.noise_seed,
            count_share_std=plan.count_share_std,
        )

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return self.trainer.evaluate(client_ids, weights)

    def close(self) -> None:
        pass


class _Worker:
    """The Ray actor: one ClientTrainer per actor, on the GPU Ray gave it (if any)."""

    def __init__(self, data: Any, settings: TrainSettings, num_threads: int) -> None:
        import ray  # Ray is imported by the Ray engine only: the local engine and the apps never load it

        torch.set_num_threads(max(1, num_threads))
        # CUDA only when Ray assigned this actor a GPU (Ray then sets CUDA_VISIBLE_DEVICES for it)
        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        self.trainer = ClientTrainer(data, settings, device=device)

    def info(self) -> dict[str, Any]:
        import ray  # as above

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "device": str(self.trainer.device), "pid": os.getpid()}

    def train(
        self,
        server_round: int,
        client_ids: list[int],
        weights: np.ndarray,
        clip: float,
        share: float,
        client_weights: dict[int, float] | None = None,
        loss_bound: float | None = None,
        noise_seed: int | None = None,
        count_share_std: float = 0.0,
    ):
        import ray  # as above

        partial, metrics = self.trainer.train(
            server_round,
            client_ids,
            weights,
            clip,
            share,
            client_weights,
            loss_bound,
            noise_seed=noise_seed,
            count_share_std=count_share_std,
        )
        node = ray.get_runtime_context().get_node_id()
        for m in metrics:
            m["node"] = node
        return partial, metrics

    def evaluate(self, client_ids: list[int], weights: np.ndarray) -> np.ndarray:
        return self.trainer.evaluate(client_ids, weights)


class RayEngine:
    """A pool of Ray actors, each holding one model and the federated data.

    ``num_workers`` actors of ``num_cpus`` CPUs and ``num_gpus`` (fractional allowed) GPUs each. The cohort is
    balanced across actors (largest clients first); each returns one partial sum, so only partial sums and
    per-client metrics cross process boundaries. ``address`` connects to an existing Ray cluster
    (``"auto"`` or ``"ray://host:port"``); otherwise a local Ray instance is started with just the
    resources the pool needs.
    """

    name = "ray"

    def __init__(
        self,
        data: Any,
        settings: TrainSettings,
        *,
        num_workers: int = 2,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        address: str | None = None,
    ) -> None:
        import ray  # as above

        # Ray 2.55 announces a future change of its GPU-hiding default on every init; fedsim relies on the
        # current behaviour (CPU-only actors see no GPU) and says so here instead of on every run.
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        self._owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.ERROR,
                "configure_logging": True,
            }
            if address:
                ray.init(address=address, **kwargs)
            else:
                need = max(1, int(np.ceil(num_workers * num_cpus)))
                # workers import the user's model factory, loss and data function by reference: they get the
                # driver's import path through the environment the raylet (and so every worker) inherits while
                # ray.init starts it. A runtime_env would do the same at 1.4-3.5 s more per start (measured).
                # A cluster's nodes need the code installed, or a runtime_env (see the README).
                with _driver_pythonpath():
                    ray.init(num_cpus=need, num_gpus=None if num_gpus else 0, **kwargs)
            self._owns_ray = True
        total_gpus = ray.cluster_resources().get("GPU", 0.0)
        if num_gpus > 0 and total_gpus < num_gpus:
            raise ValueError(
                f"engine.num_gpus_per_worker={num_gpus} but the Ray cluster has {total_gpus} GPUs; "
                "set it to 0 on a machine without a GPU"
            )
        self.data = data
        self.num_workers = num_workers
        data_ref = ray.put(data)
        actor = ray.remote(_Worker).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self.workers = [actor.remote(data_ref, settings, int(max(1, num_cpus))) for _ in range(num_workers)]
        self.infos = ray.get([w.info.remote() for w in self.workers])
        self.dim = int(initial_weights(settings, data.input_shape, data.num_classes).size)

    def _shares(self, client_ids: np.ndarray) -> list[list[int]]:
        sizes = np.array([self.data.num_examples(int(c)) for c in client_ids])
        return balance(np.asarray(client_ids), sizes, self.num_workers)

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        import ray  # as above

        w32 = np.asarray(weights, dtype=np.float32)
        futures = [
            worker.train.remote(
                plan.round,
                share,
                w32,
                plan.clip,
                plan.noise_share_std,
                None if plan.client_weights is None else {c: plan.client_weights[c] for c in share},
                plan.loss_bound,
                plan.noise_seed,
                plan.count_share_std,
            )
            for worker, share in zip(self.workers, self._shares(plan.cohort), strict=True)
            if share
        ]
        total = PartialSum(self.dim)
        metrics: list[dict[str, Any]] = []
        for partial, m in ray.get(futures):
            total.merge(partial)
            metrics.extend(m)
        return total, metrics

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        import ray  # as above

        w32 = np.asarray(weights, dtype=np.float32)
        futures = [
            worker.evaluate.remote(share, w32)
            for worker, share in zip(self.workers, self._shares(client_ids), strict=True)
            if share
        ]
        rows = [r for r in ray.get(futures) if len(r)]
        return np.concatenate(rows) if rows else np.zeros((0, 4))

    def close(self) -> None:
        import ray  # as above

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._owns_ray:
            ray.shutdown()


@contextlib.contextmanager
def _driver_pythonpath() -> Iterator[None]:
    """``PYTHONPATH`` set to this process's ``sys.path`` for the duration (then restored)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def balance(client_ids: np.ndarray, sizes: np.ndarray, workers: int) -> list[list[int]]:
    """Largest clients first, each to the least loaded worker (LPT scheduling)."""
    loads = [0] * workers
    shares: list[list[int]] = [[] for _ in range(workers)]
    for i in np.argsort(-sizes, kind="stable"):
        w = int(np.argmin(loads))
        shares[w].append(int(client_ids[i]))
        loads[w] += int(sizes[i]) + 1
    return shares
