"""The Ray engine (:class:`RayEngine`): a round's cohort trains on a pool of Ray actors.

It implements :class:`fedsim.loop.Engine`:

* ``train(plan, weights) -> (PartialSum, client_metrics)``: the cohort's clipped sum;
* ``evaluate(client_ids, weights) -> rows``: per-client ``[client, n, loss_sum, correct]``.

:func:`init_ray` starts (or connects to) Ray for this engine and for ``fedsim sweep``'s parallel runs. The
in-process engine is :mod:`fedsim.engine.local_engine` (``LocalEngine`` is also importable from here).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from fedsim.data.user import data_fingerprint
from fedsim.factories import describe
from fedsim.round import PartialSum
from fedsim.training.evaluation import WIDTH as EVAL_WIDTH
from fedsim.training.trainer import ClientTrainer, TrainSettings, initial_weights

from .base import EngineError
from .local_engine import LocalEngine
from .threads import AUTO, choose_threads

__all__ = ["EngineError", "LocalEngine", "RayEngine", "balance", "init_ray"]

log = logging.getLogger(__name__)

#: how long a replacement worker may take to start (build its trainer) before the round fails loudly
_START_TIMEOUT_S = 300.0


def _lost_worker_errors() -> tuple[type[BaseException], ...]:
    from ray import exceptions as rx  # Ray is imported by the Ray engine only

    # the process is gone (killed, crashed, out of memory) or what it made is: not an error in the user's code,
    # which the worker catches client by client; anything else (a RayTaskError) is a bug and is raised
    return (rx.RayActorError, rx.WorkerCrashedError, rx.ObjectLostError, rx.OutOfMemoryError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _Worker:
    """The Ray actor: one ClientTrainer per actor, on the GPU Ray gave it (if any), with torch's thread count
    chosen for its training path and its ``num_cpus`` (:func:`fedsim.engine.threads.choose_threads`)."""

    def __init__(
        self, data: Any, settings: TrainSettings, num_cpus: float, torch_threads: int | str = AUTO
    ) -> None:
        import ray  # Ray is imported by the Ray engine only: the local engine and the apps never load it

        torch.set_num_threads(max(1, math.floor(num_cpus)))  # while the trainer probes its path
        # CUDA only when Ray assigned this actor a GPU (Ray then sets CUDA_VISIBLE_DEVICES for it)
        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        self.trainer = ClientTrainer(data, settings, device=device)
        self.threads, self.threads_why = choose_threads(
            torch_threads, self.trainer.path.name, worker_cpus=num_cpus
        )
        torch.set_num_threads(self.threads)

    def info(self) -> dict[str, Any]:
        import ray  # as above

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "device": str(self.trainer.device),
            "pid": os.getpid(),
            "path": self.trainer.path.name,
            "fallbacks": list(self.trainer.path.fallbacks),
            "torch_threads": self.threads,
            "torch_threads_why": self.threads_why,
            "data_fingerprint": data_fingerprint(self.trainer.data),
        }

    def train(
        self, plan: Any, client_ids: list[int], weights: np.ndarray
    ) -> Iterator[tuple[PartialSum, list[dict[str, Any]]]]:
        """A Ray streaming generator: this worker's share ``client_ids`` of ``plan.cohort``, trained under the
        round's ``plan``; a partial sum and its clients' metrics per unit of work (a client on the loop, a chunk
        when vectorised: :meth:`ClientTrainer.train_stream`). Each is sent as it is made, so the driver keeps what
        was finished if this process hangs later in the round, and all but the last few units (Ray reports them
        asynchronously) if it is killed."""
        import ray  # as above

        node = ray.get_runtime_context().get_node_id()
        for partial, metrics in self.trainer.train_stream(plan, weights, client_ids):
            for m in metrics:
                m["node"] = node
            yield partial, metrics

    def train_whole(
        self, plan: Any, client_ids: list[int], weights: np.ndarray
    ) -> tuple[PartialSum, list[dict[str, Any]]]:
        """:meth:`train` in one reply: ``(partial, metrics)`` of ``client_ids`` (one client, when the driver
        isolates the clients a lost worker had not reported)."""
        partial, metrics = PartialSum(self.trainer.dim), []
        for unit, new in self.train(plan, client_ids, weights):
            partial.merge(unit)
            metrics.extend(new)
        return partial, metrics

    def evaluate(self, client_ids: list[int], weights: np.ndarray) -> np.ndarray:
        return self.trainer.evaluate(client_ids, weights)


class RayEngine:
    """A pool of Ray actors, each holding one model and the federated data.

    ``num_workers`` actors of ``num_cpus`` CPUs and ``num_gpus`` (fractional allowed) GPUs each. The cohort is
    balanced across actors (largest clients first); each returns one partial sum, so only partial sums and
    per-client metrics cross process boundaries. ``address`` connects to an existing Ray cluster
    (``"auto"`` or the GCS address ``"host:6379"``; Ray Client ``"ray://"`` addresses cannot stream and are refused by
    the scenario schema); otherwise a local Ray instance is started with just the
    resources the pool needs. ``round_timeout_s``: a round's training deadline (:meth:`train`). ``torch_threads``:
    ``engine.torch_threads`` (each worker chooses for its path and CPUs: :mod:`fedsim.engine.threads`).

    Each worker fingerprints the data it was shipped (:func:`fedsim.data.user.data_fingerprint`) and the driver
    compares it with its own, at the start and for every replaced worker: a ``FederatedData`` whose clients' data
    is not a function of what it holds is refused with a ``ValueError`` naming ``data_name`` (the data function).
    """

    name = "ray"

    @classmethod
    def start(cls, scenario: Any, data: Any, settings: TrainSettings) -> RayEngine:
        """The engine of ``engine.name = "ray"`` (:mod:`fedsim.registry`), sized by ``scenario.engine``: its
        ``num_workers``, ``num_cpus_per_worker``, ``num_gpus_per_worker``, ``ray_address``, ``round_timeout_s`` and
        ``torch_threads``."""
        e = scenario.engine
        return cls(
            data,
            settings,
            num_workers=e.num_workers,
            num_cpus=e.num_cpus_per_worker,
            num_gpus=e.num_gpus_per_worker,
            address=e.ray_address,
            round_timeout_s=e.round_timeout_s,
            torch_threads=e.torch_threads,
            data_name=describe(scenario.data.dataset),
        )

    def __init__(
        self,
        data: Any,
        settings: TrainSettings,
        *,
        num_workers: int = 2,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        address: str | None = None,
        round_timeout_s: float | None = None,
        torch_threads: int | str = AUTO,
        data_name: str | None = None,
    ) -> None:
        import ray  # as above

        need = max(1, int(np.ceil(num_workers * num_cpus)))
        t0 = time.perf_counter()
        self._owns_ray = init_ray(address, num_cpus=need, num_gpus=None if num_gpus else 0)
        t_workers = time.perf_counter()
        total_gpus = ray.cluster_resources().get("GPU", 0.0)
        if num_gpus > 0 and total_gpus < num_gpus:
            raise ValueError(
                f"engine.num_gpus_per_worker={num_gpus} but the Ray cluster has {total_gpus} GPUs; "
                "set it to 0 on a machine without a GPU"
            )
        self.data = data
        #: what made the data (``data.dataset``: a data function's reference), named when a worker's differs
        self.data_name = data_name
        self.num_workers = num_workers
        self.round_timeout_s = round_timeout_s
        #: workers replaced so far: ``{"worker", "why", "old_pid", "new_pid"}``
        self.replaced: list[dict[str, Any]] = []
        data_ref = ray.put(data)
        actor = ray.remote(_Worker).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self._new_worker = lambda: actor.remote(data_ref, settings, num_cpus, torch_threads)
        self.workers = [self._new_worker() for _ in range(num_workers)]
        self.infos = ray.get([w.info.remote() for w in self.workers])
        #: what the driver holds (:func:`fedsim.data.user.data_fingerprint`): every worker must hold the same
        self.data_fingerprint = data_fingerprint(data)
        try:
            for i, info in enumerate(self.infos):
                self._check_data(i, info)
        except ValueError:
            self.close()
            raise
        #: seconds to start (or join) Ray, and to start the workers (each builds its trainer): summary.json's timings
        self.start_timings = {
            "ray_start_s": t_workers - t0,
            "workers_start_s": time.perf_counter() - t_workers,
        }
        #: the training path the workers chose (``per-layer``, ``vmap`` or ``loop``: the same check in each)
        self.training_path = str(self.infos[0]["path"])
        #: torch's thread count in each worker, and why (:func:`fedsim.engine.threads.choose_threads`)
        self.torch_threads = int(self.infos[0]["torch_threads"])
        self.torch_threads_why = str(self.infos[0]["torch_threads_why"])
        #: why the workers refused faster paths (the same check in each: the first worker's reasons)
        self.training_fallbacks: tuple[str, ...] = tuple(str(f) for f in self.infos[0].get("fallbacks", ()))
        self.dim = int(initial_weights(settings, data.input_shape, data.num_classes).size)

    def _check_data(self, i: int, info: dict[str, Any]) -> None:
        """Worker ``i`` holds the data the driver holds, or a ValueError naming the data function: its clients'
        data is not a function of what was shipped (drawn afresh on each call, or read from files that differ
        between the nodes), so the workers would train clients the driver does not describe or evaluate."""
        got, want = info.get("data_fingerprint"), self.data_fingerprint
        if got == want:
            return
        settings = getattr(self.data, "dataset_settings", None) or {}
        source = (
            self.data_name
            or settings.get("data_function")
            or getattr(self.data, "dataset", type(self.data).__name__)
        )
        raise ValueError(
            f"the data of {source!r} differs between this process and Ray worker {i} (pid {info.get('pid')}): "
            f"clients {want['clients']} hash to {want['sha256'][:12]} here and {str(got.get('sha256'))[:12]} "
            f"there ({want['num_examples']} against {got.get('num_examples')} examples). A data function and the "
            "FederatedData it returns must give the same data every time they are called with the same arguments: "
            "seed every random draw from the seed argument (np.random.default_rng(seed)), never from the clock or "
            "global state, and read the same files on every node"
        )

    def _shares(self, client_ids: np.ndarray) -> list[list[int]]:
        sizes = np.array([self.data.num_examples(int(c)) for c in client_ids])
        return balance(np.asarray(client_ids), sizes, self.num_workers)

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Each worker streams a partial sum per unit of work (:meth:`_Worker.train`); they are merged per worker
        in the order sent, then across workers in worker order (so a seeded run is bit for bit reproducible).

        One client's fault never changes another client's contribution. A worker that dies mid-round
        (``worker_lost``: a client's data killed it, or the node went away) or has not finished by
        ``round_timeout_s`` (it is killed: some client hangs) loses what it had not reported, and which of its
        clients caused it is unknown (a killed process can take its last few streamed reports with it). So it is
        replaced at once, and every client it had not reported is trained again alone
        (:meth:`_isolate`): one client per worker at a time, each with its own ``round_timeout_s``. Only a
        client whose own training kills or outlasts its worker there is a zero update; the others are in the sum
        before the round is released, each exactly once (what the driver received is never trained again).
        A round with such a fault takes one more ``round_timeout_s`` (about ``ceil(k / workers)`` more with k clients
        that hang), plus the workers' restarts."""
        import ray  # as above

        lost_errors = _lost_worker_errors()
        w_ref = _shipped(weights)
        shares = self._shares(plan.cohort)
        deadline = None if self.round_timeout_s is None else time.monotonic() + self.round_timeout_s
        streams: dict[int, Any] = {}
        for i, share in enumerate(shares):
            if share:
                streams[i] = self._call(
                    self.workers[i].train.options(num_returns="streaming"), plan, share, w_ref
                )
        sums = {i: PartialSum(self.dim) for i in streams}
        reported: dict[int, list[dict[str, Any]]] = {i: [] for i in streams}
        lost: dict[int, str] = {}
        pending = dict(streams)
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=wait_s)
            if not ready:  # the deadline passed: whoever is still training has timed out
                lost.update(dict.fromkeys(pending, "timeout"))
                break
            for gen in ready:
                i = next(k for k, g in pending.items() if g is gen)
                try:
                    partial, metrics = ray.get(next(gen))
                except StopIteration:
                    del pending[i]
                    continue
                except lost_errors as exc:
                    log.warning("round %d: Ray worker %d died: %s", plan.round, i, _first_line(exc))
                    lost[i] = "worker_lost"
                    del pending[i]
                    continue
                sums[i].merge(partial)
                reported[i].extend(metrics)
        total = PartialSum(self.dim)
        out: list[dict[str, Any]] = []
        unreported: list[int] = []
        for i in sorted(streams):
            total.merge(sums[i])
            position = {c: j for j, c in enumerate(shares[i])}
            out.extend(sorted(reported[i], key=lambda m: position[m["client"]]))
            if i in lost:
                done = {m["client"] for m in reported[i]}
                unreported.extend(c for c in shares[i] if c not in done)
                self._replace(i, f"{lost[i]} in round {plan.round}")
        if unreported:
            log.warning(
                "round %d: training the %d clients that the lost workers had not reported again, one at a time",
                plan.round,
                len(unreported),
            )
            partial, metrics = self._isolate(plan, unreported, w_ref)
            total.merge(partial)
            out.extend(metrics)
        return total, out

    def _call(self, method: Any, plan: Any, clients: list[int], w_ref: Any) -> Any:
        """``method.remote`` (a worker's ``train`` or ``train_whole``) for ``clients`` under ``plan`` (sent whole)."""
        return method.remote(plan, clients, w_ref)

    def _isolate(self, plan: Any, clients: list[int], w_ref: Any) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Train ``clients`` alone (:meth:`_one_at_a_time`): a client that kills or outlasts its worker there is the
        fault and contributes zero (``worker_lost`` or ``timeout``). Merged in the order of ``clients`` (the same
        sum whichever worker trained which)."""
        got = self._one_at_a_time(
            clients, lambda w, c: self._call(w.train_whole, plan, [c], w_ref), f"round {plan.round}: training"
        )
        total, out = PartialSum(self.dim), []
        for c in clients:
            result = got[c]
            if isinstance(result, str):  # the reason it failed
                partial = PartialSum(self.dim)
                partial.reject(reason=result)
                result = (partial, [{"client": c, "failed": result, "update_norm": math.nan}])
            total.merge(result[0])
            out.extend(result[1])
        return total, out

    def _one_at_a_time(self, clients: list[int], submit: Any, what: str) -> dict[int, Any]:
        """``submit(worker, client)`` for each of ``clients``, one client per worker at a time, each with its own
        deadline (``round_timeout_s`` from when it starts), so that a worker that dies or hangs is working on exactly
        one client. Returns ``{client: result}``, with ``"worker_lost"`` or ``"timeout"`` for a client whose call
        killed or outlasted its worker (which is then replaced). With k such clients and W workers this takes up to
        about ``ceil(k / W)`` deadlines, plus the restarts."""
        import ray  # as above

        lost_errors = _lost_worker_errors()
        queue = list(clients)
        results: dict[int, Any] = {}
        running: dict[int, tuple[int, Any, float | None]] = {}  # worker -> (client, future, deadline)
        while queue or running:
            for i in range(self.num_workers):
                if i not in running and queue:
                    c = queue.pop(0)
                    limit = None if self.round_timeout_s is None else time.monotonic() + self.round_timeout_s
                    running[i] = (c, submit(self.workers[i], c), limit)
            futures = [f for _, f, _ in running.values()]
            limits = [t for _, _, t in running.values() if t is not None]
            wait_s = None if not limits else max(0.0, min(limits) - time.monotonic())
            ray.wait(futures, num_returns=1, timeout=wait_s)
            # every call finished by now, not only the first: one past its deadline but done is not a timeout
            done, _ = ray.wait(futures, num_returns=len(futures), timeout=0)
            done, now = set(done), time.monotonic()
            failed: list[tuple[int, int, str]] = []
            for i, (c, future, limit) in list(running.items()):
                if future in done:
                    del running[i]
                    try:
                        results[c] = ray.get(future)
                    except lost_errors as exc:
                        log.warning("%s client %d alone killed its Ray worker: %s", what, c, _first_line(exc))
                        failed.append((i, c, "worker_lost"))
                elif limit is not None and now >= limit:
                    del running[i]
                    log.warning("%s client %d alone did not finish within round_timeout_s", what, c)
                    failed.append((i, c, "timeout"))
            # replaced after every verdict of this pass: a restart delays no verdict
            for i, c, reason in failed:
                results[c] = reason
                self._replace(i, f"{reason} ({what} client {c} alone)")
        return results

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per-client evaluation rows (:data:`fedsim.training.evaluation.COLUMNS`). A worker that dies or passes
        ``round_timeout_s`` while evaluating is replaced, and the clients of its share are evaluated again alone
        (:meth:`_one_at_a_time`); a client whose evaluation kills or outlasts its worker there is left out of the
        rows (logged). Evaluation releases nothing private, so evaluating a client twice counts nothing twice."""
        import ray  # as above

        lost_errors = _lost_worker_errors()
        w_ref = _shipped(weights)
        shares = self._shares(client_ids)
        futures = {
            i: self.workers[i].evaluate.remote(share, w_ref) for i, share in enumerate(shares) if share
        }
        deadline = None if self.round_timeout_s is None else time.monotonic() + self.round_timeout_s
        rows: dict[int, np.ndarray] = {}
        again: list[int] = []
        pending = dict(futures)
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=wait_s)
            ready_set = set(ready)
            for i, future in list(pending.items()):
                if future in ready_set:
                    del pending[i]
                    try:
                        rows[i] = ray.get(future)
                    except lost_errors as exc:
                        self._replace(i, f"died while evaluating ({_first_line(exc)})")
                        again.extend(shares[i])
            if pending and not ready:  # the deadline passed
                for i in pending:
                    self._replace(i, "did not finish evaluating within round_timeout_s")
                    again.extend(shares[i])
                break
        out = [r for _, r in sorted(rows.items()) if len(r)]
        if again:
            alone = self._one_at_a_time(again, lambda w, c: w.evaluate.remote([c], w_ref), "evaluation:")
            out.extend(r for c in again if not isinstance(r := alone[c], str) and len(r))
            left = [c for c in again if isinstance(alone[c], str)]
            if left:
                log.warning(
                    "evaluation: clients %s left out (their evaluation killed or outlasted a worker)", left
                )
        return np.concatenate(out) if out else np.zeros((0, EVAL_WIDTH))

    def _replace(self, i: int, why: str) -> None:
        """Kill worker ``i`` (if it still runs) and start a fresh one in its place; return once it is ready."""
        import ray  # as above

        old = self.infos[i].get("pid")
        ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._new_worker()
        try:
            self.infos[i] = ray.get(self.workers[i].info.remote(), timeout=_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise EngineError(
                f"Ray worker {i} ({why}) could not be replaced: its successor did not start within "
                f"{_START_TIMEOUT_S:.0f} s (is the Ray cluster short of the CPUs/GPUs a worker asks for?)"
            ) from None
        self._check_data(i, self.infos[i])
        self.replaced.append({"worker": i, "why": why, "old_pid": old, "new_pid": self.infos[i]["pid"]})
        log.warning("Ray worker %d (pid %s): %s; replaced by pid %s", i, old, why, self.infos[i]["pid"])

    def close(self) -> None:
        import ray  # as above

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._owns_ray:
            ray.shutdown()


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Start Ray in this process, unless it runs already: connected to the cluster at ``address`` (``"auto"`` or
    ``"host:6379"``), or else a local instance of ``num_cpus`` CPUs and ``num_gpus`` GPUs (``None``: what Ray
    detects). True when this call started it (the caller then owns it: ``ray.shutdown()`` when done), False when
    Ray was running already.

    Quiet: no dashboard, the workers' output not sent to the driver, Ray's own logging at ERROR. A local
    instance's workers get the driver's import path (:func:`_driver_pythonpath`). Used by :class:`RayEngine` and
    by ``fedsim sweep --parallel`` (:func:`fedsim.sweep.run_sweep`)."""
    import ray  # Ray is imported by the Ray engine only: the local engine and the apps never load it

    # Ray 2.55 announces a future change of its GPU-hiding default on every init; fedsim relies on the
    # current behaviour (CPU-only actors see no GPU) and says so here instead of on every run.
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    if address:
        ray.init(address=address, **kwargs)
    else:
        # workers import the user's model factory, loss and data function by reference: they get the
        # driver's import path through the environment the raylet (and so every worker) inherits while
        # ray.init starts it. A runtime_env would do the same at 1.4-3.5 s more per start (measured).
        # A cluster's nodes need the code installed, or a runtime_env (docs/how-to/ray-cluster.md).
        with _driver_pythonpath():
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
    return True


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


#: weights up to this size go to the workers inside each call; larger ones are put in the object store once per
#: round and every worker reads that one copy. Ray inlines arguments up to 100 KiB in the task itself
#: (``max_direct_call_object_size``); an explicit ``ray.put`` of a small vector cost more than the call it saves
#: (about 5 ms of a 15 ms round of the perceptron workload on 2 workers, timed around the calls)
INLINE_WEIGHTS_BYTES = 100 * 1024


def _shipped(weights: np.ndarray) -> Any:
    """The round's weights as the workers' calls take them: the float32 array itself when small
    (:data:`INLINE_WEIGHTS_BYTES`), else a reference to one copy in the object store."""
    import ray  # as above

    w = np.asarray(weights, dtype=np.float32)
    return w if w.nbytes <= INLINE_WEIGHTS_BYTES else ray.put(w)


def balance(client_ids: np.ndarray, sizes: np.ndarray, workers: int) -> list[list[int]]:
    """Largest clients first, each to the least loaded worker (LPT scheduling)."""
    loads = [0] * workers
    shares: list[list[int]] = [[] for _ in range(workers)]
    for i in np.argsort(-sizes, kind="stable"):
        w = int(np.argmin(loads))
        shares[w].append(int(client_ids[i]))
        loads[w] += int(sizes[i]) + 1
    return shares
