"""Local training of clients: the code that runs inside every worker (Ray actor, Flower ClientApp, in-process).

A :class:`ClientTrainer` keeps one model and the federated data, copies the global weights into the model in
place, trains a list of clients one after the other (or together when vectorised: :mod:`fedsim.training.vectorized`),
clips each update with :func:`fedsim.round.clip_update` and returns only a
:class:`~fedsim.round.PartialSum` plus per-client metrics.

Client randomness (batch order: :mod:`fedsim.training.shuffle`; distributed noise shares) comes from
``(seed, round, client_id)``, so the result does not depend on which worker trains which client.

On CUDA the trainer computes in full FP32: its training, the training-path check and its evaluation run inside
:func:`fedsim.training.precision.full_fp32`, which turns TensorFloat-32 off for cuDNN's convolutions and cuBLAS's
matrix products around each call and gives the caller's settings back after it. TF32 (PyTorch's default for cuDNN
on Ampere and later GPUs) moves results by ~1e-3 relative: the path check, which compares each client's batched
gradient with the model run alone, would refuse the fast paths; DP clipping compares each update's norm with the
clip; and a run on CUDA would no longer give the CPU's results.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.factories import (
    build_model,
    cross_entropy,
    describe,
    per_example,
    resolve_loss,
    resolve_metric,
)
from fedsim.round import NoiseSource, PartialSum, bounded_value, clip_update

from .evaluation import WIDTH as EVAL_WIDTH
from .evaluation import evaluate_outputs
from .layers import DropoutMasks, client_dropout, dropout_layers
from .precision import full_fp32
from .shuffle import client_orders
from .vectorized import TrainingPath, choose_path, chunk_plan, train_chunk

log = logging.getLogger(__name__)


def blas_threads(n: int) -> Any:
    """NumPy's BLAS limited to ``n`` threads inside the block (threadpoolctl; torch's own threads are untouched)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=n, user_api="blas")


@dataclass(frozen=True)
class ClientPlan:
    """What training a round's clients needs, for a caller that holds no server plan: a deployed ClientApp, which
    reads the clip and its noise shares from the server's message, checked against its own node's policy.

    The trainer reads these attributes of whatever plan it is given; in simulation that is the server's
    :class:`fedsim.strategies.RoundPlan`, whose clip and noise shares all come from its mechanism."""

    round: int
    cohort: Any
    clip: float
    noise_share_std: float = 0.0
    count_share_std: float = 0.0
    noise: NoiseSource | None = None
    client_weights: dict[int, float] | None = None
    loss_bound: float | None = None
    #: a mechanism whose clients encode: the encoding the server sent (its public parameters and randomness)
    encoding: dict[str, Any] | None = None

    @property
    def encodes(self) -> bool:
        return self.encoding is not None

    def encoding_for(self, size: int) -> dict[str, Any]:
        assert self.encoding is not None
        return self.encoding


@dataclass(frozen=True)
class TrainSettings:
    """What a worker needs to train a client (plain values: cheap to ship to workers).

    ``model``: the model factory, a ``"package.module:function"`` reference (resolved in the worker) or a
    callable; ``model_kwargs``: its options; ``loss``: ``"cross_entropy"``, a reference or a callable
    (:mod:`fedsim.factories`); ``metric``: ``None`` or a reference or callable giving one value per example,
    reported on evaluation; ``vectorize``: ``auto``, ``per-layer``, ``vmap`` or ``loop``
    (:func:`fedsim.training.vectorized.choose_path`; ``True``/``False`` mean ``auto``/``loop``).
    """

    model: Any
    model_kwargs: dict[str, Any]
    local_epochs: int = 1
    batch_size: int = 16
    lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    seed: int = 0
    vectorize: Any = "auto"
    loss: Any = "cross_entropy"
    metric: Any = None

    @classmethod
    def from_scenario(cls, scenario: Any) -> TrainSettings:
        return cls(
            model=scenario.model.reference(),
            model_kwargs=scenario.model.options(),
            local_epochs=scenario.client.local_epochs,
            batch_size=scenario.client.batch_size,
            lr=scenario.client.lr,
            optimizer=scenario.client.optimizer,
            momentum=scenario.client.momentum,
            seed=scenario.data_seed,  # initialisation, batch orders, dropout: the data side (scenarios.schema.SEEDS)
            vectorize=scenario.engine.vectorize,
            loss=scenario.model.loss,
            metric=scenario.model.metric,
        )


def make_model(settings: TrainSettings, input_shape: Any, num_classes: int) -> nn.Module:
    """The model the factory builds, initialised from the seed (PyTorch's default initialisation)."""
    torch.manual_seed(settings.seed)
    return build_model(settings.model, input_shape, num_classes, settings.model_kwargs)


def initial_weights(settings: TrainSettings, input_shape: Any, num_classes: int) -> np.ndarray:
    """The global model's starting point (float64 flat vector), a function of the seed only."""
    model = make_model(settings, input_shape, num_classes)
    return nn.utils.parameters_to_vector(model.parameters()).detach().double().numpy()


def copy_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the flat vector ``flat`` into ``params`` in place, in their order: the one order in which fedsim flattens
    and loads a model (``parameters_to_vector`` of ``module.parameters()``). In place: ``vector_to_parameters`` would
    make the parameters *views* of ``flat``, and training would then write into the global model."""
    with torch.no_grad():
        i = 0
        for p in params:
            n = p.numel()
            p.copy_(flat[i : i + n].view_as(p))
            i += n


def client_tensors(x: Any, y: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's arrays as training sees them, on ``device``: int64 labels, and int64 inputs when they are integers
    (token ids for an ``nn.Embedding``), float32 inputs otherwise."""
    x = np.asarray(x)
    integer = np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_
    return (
        torch.as_tensor(x, dtype=torch.long if integer else torch.float32, device=device),
        torch.as_tensor(y, dtype=torch.long, device=device),
    )


def probe_examples(data: Any, device: torch.device, n: int = 8) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For the checks that choose a training path: up to ``n`` real training examples (the first training
    clients') when the data's inputs are integers (token ids), so that a model that takes ids is checked on valid
    ids. Float inputs are checked on standard normal inputs (that check, and the fallback reasons ``summary.json``
    publishes, then depend on the model and the settings only): ``None`` for labels, or, for sequence targets,
    random inputs and random targets of the data's shapes. ``None`` too when there are no examples."""
    xs, ys, have = [], [], 0
    for cid in np.asarray(data.train_clients)[:50]:
        x, y = client_tensors(*data.client_data(int(cid)), device)
        if x.is_floating_point():
            return _random_examples(data, tuple(y.shape[1:]), device, n) if y.dim() > 1 else None
        if len(y):
            xs.append(x[: n - have])
            ys.append(y[: n - have])
            have += len(ys[-1])
        if have >= n:
            break
    return (torch.cat(xs), torch.cat(ys)) if xs else None


def _random_examples(
    data: Any, target_shape: tuple[int, ...], device: torch.device, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4321)
    x = torch.randn(n, *data.input_shape, generator=gen)
    y = torch.randint(0, max(1, int(data.num_classes)), (n, *target_shape), generator=gen)
    return x.to(device), y.to(device)


#: clients whose token ids :func:`check_fits` scans for the extreme ids
SCAN_CLIENTS = 2000


def check_fits(settings: TrainSettings, data: Any) -> None:
    """The model runs on the data before anything else does: a forward pass, the loss (and ``model.metric``) on a
    few real examples of a training client and, for integer inputs, on the examples holding the smallest and the
    largest id among the first :data:`SCAN_CLIENTS` clients; then the explicitly requested training path's check
    (``engine.vectorize`` ``per-layer`` or ``vmap``). Raises a ``ValueError`` that names the model, the data's
    shapes and what failed (outputs that do not match the targets, a vocabulary smaller than the ids, a loss of
    the wrong shape), instead of a shape error deep in training (or a worker that dies at start-up)."""
    model = make_model(settings, data.input_shape, data.num_classes)
    loss = resolve_loss(settings.loss)
    metric = resolve_metric(settings.metric)
    target_shape = tuple(getattr(data, "target_shape", ()))  # a duck-typed data object may not say
    target = f"targets {list(target_shape)} per example" if target_shape else "one label per example"
    what = (
        f"the model {describe(settings.model)!r} does not fit the data (inputs {list(data.input_shape)} per "
        f"example, {target}, {data.num_classes} classes)"
    )
    cpu = torch.device("cpu")
    x = y = None
    for cid in np.asarray(data.train_clients)[:20]:
        cx, cy = client_tensors(*data.client_data(int(cid)), cpu)
        if len(cy):
            x, y = cx[:4], cy[:4]
            break
    if x is not None and y is not None:
        ids = None if x.is_floating_point() else _extreme_ids(data, cpu)
        if ids is not None:
            x, y = torch.cat([x, ids[0]]), torch.cat([y, ids[1]])
        model.eval()
        try:
            with torch.no_grad():
                outputs = model(x)
        except Exception as exc:
            raise ValueError(f"{what}: the forward pass failed: {_forward_failure(model, x, exc)}") from None
        _check_outputs(outputs, y, loss, data.num_classes, what)
        try:
            with torch.no_grad():
                per_example(loss, outputs, y)
                if metric is not None:
                    per_example(metric, outputs, y, "metric")
        except Exception as exc:
            raise ValueError(
                f"{what}: for outputs {list(outputs.shape)} and targets {list(y.shape)}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if settings.vectorize in ("per-layer", "vmap"):  # asked for explicitly: refused here if it cannot train
        choose_path(
            model,
            tuple(data.input_shape),
            data.num_classes,
            loss,
            cpu,
            settings.vectorize,
            examples=probe_examples(data, cpu),
        )


def _extreme_ids(data: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The examples holding the smallest and the largest input id among the first :data:`SCAN_CLIENTS` clients."""
    low: tuple[Any, np.ndarray, np.ndarray] | None = None  # (id, x [1, ...], y [1, ...])
    high: tuple[Any, np.ndarray, np.ndarray] | None = None
    for cid in range(min(int(data.num_clients), SCAN_CLIENTS)):
        x, y = data.client_data(cid)
        if len(y) == 0:
            continue
        flat = np.asarray(x).reshape(len(y), -1)
        mins, maxs = flat.min(1), flat.max(1)
        i, j = int(mins.argmin()), int(maxs.argmax())
        if low is None or mins[i] < low[0]:
            low = (mins[i], x[i : i + 1], y[i : i + 1])
        if high is None or maxs[j] > high[0]:
            high = (maxs[j], x[j : j + 1], y[j : j + 1])
    if low is None or high is None:
        return None
    (x_lo, y_lo), (x_hi, y_hi) = (client_tensors(e[1], e[2], device) for e in (low, high))
    return torch.cat([x_lo, x_hi]), torch.cat([y_lo, y_hi])


def _forward_failure(model: nn.Module, x: torch.Tensor, exc: Exception) -> str:
    """What a failed forward pass says, and for integer inputs that an ``nn.Embedding`` refuses, the ids' range
    and the vocabularies of the model's Embedding layers."""
    said = f"{type(exc).__name__}: {exc}"
    tables = [(name, m.num_embeddings) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    if x.is_floating_point() or not tables or not isinstance(exc, (IndexError, RuntimeError)):
        return said
    lo, hi = (int(v) for v in torch.aminmax(x))
    sizes = ", ".join(f"{name or '<root>'!r}: {v}" for name, v in tables)
    return (
        f"{said}; the input ids range over [{lo}, {hi}]; the model's nn.Embedding layers hold {sizes} rows: an "
        f"id outside [0, rows) is refused (a vocabulary smaller than the ids? give the model at least {hi + 1})"
    )


def _check_outputs(outputs: Any, y: torch.Tensor, loss: Any, num_classes: int, what: str) -> None:
    """The default cross-entropy's shapes: logits ``[n, classes]`` for labels ``[n]``, ``[n, *T, classes]`` for
    targets ``[n, *T]``, with at least the data's ``num_classes`` classes."""
    if not isinstance(outputs, torch.Tensor):
        raise ValueError(f"{what}: the model returned {type(outputs).__name__}: allowed a tensor")
    if loss is not cross_entropy:
        return
    if outputs.dim() != y.dim() + 1 or outputs.shape[:-1] != y.shape:
        allowed = (
            f"logits [{', '.join(map(str, y.shape))}, classes]: cross_entropy takes logits [n, classes] for "
            "labels [n], or [n, *T, classes] for sequence targets [n, *T]"
        )
        raise ValueError(
            f"{what}: the model outputs {list(outputs.shape)} for targets {list(y.shape)}; allowed {allowed}"
        )
    if outputs.shape[-1] < num_classes:
        raise ValueError(
            f"{what}: the model outputs {outputs.shape[-1]} classes (outputs {list(outputs.shape)}) but the data "
            f"has {num_classes} (targets up to {num_classes - 1}): allowed at least {num_classes} logits"
        )


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ClientTrainer:
    """Trains and evaluates clients of one :class:`~fedsim.data.FederatedData` with one model."""

    def __init__(
        self, data: Any, settings: TrainSettings, device: str | None = None, cache_clients: int = 20000
    ):
        self.data = data
        self.settings = settings
        self.device = pick_device(device)
        self.input_shape = tuple(data.input_shape)
        self.model = make_model(settings, self.input_shape, data.num_classes).to(self.device)
        self.params = [p for p in self.model.parameters()]
        if len(self.params) != len(dict(self.model.named_parameters(remove_duplicate=False))):
            raise ValueError(
                "the model shares parameters between layers (tied weights): fedsim needs distinct ones"
            )
        self.dim = sum(p.numel() for p in self.params)
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = (
            {} if data.num_clients <= cache_clients else None
        )
        self.loss = resolve_loss(settings.loss)
        self.metric = resolve_metric(settings.metric)
        self.has_dropout = bool(dropout_layers(self.model))
        #: how cohorts are trained: per-layer, vmap or loop (the first that agrees with the model run alone)
        with full_fp32():  # checked in the arithmetic it will train in
            self.path: TrainingPath = choose_path(
                self.model,
                self.input_shape,
                data.num_classes,
                self.loss,
                self.device,
                settings.vectorize,
                examples=probe_examples(data, self.device),
            )
        for reason in self.path.fallbacks:
            log.info("local training falls back from %s", reason)

    # ------------------------------------------------------------------ helpers
    def _tensors(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is not None and cid in self._cache:
            return self._cache[cid]
        t = client_tensors(*self.data.client_data(int(cid)), self.device)
        if self._cache is not None:
            self._cache[cid] = t
        return t

    def _load(self, weights: torch.Tensor) -> None:
        copy_flat(self.params, weights)

    def _flat(self) -> torch.Tensor:
        return nn.utils.parameters_to_vector(self.params).detach()

    def _global(self, weights: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ training
    @full_fp32()
    def train_one(
        self, cid: int, server_round: int, global_w: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Local training of one client from ``global_w``; returns (update, metrics)."""
        s = self.settings
        self._load(global_w)
        x, y = self._tensors(cid)
        n = int(y.shape[0])
        orders = torch.from_numpy(client_orders(s.seed, server_round, [cid], [n], s.local_epochs)).to(
            self.device
        )
        # plain SGD (heavy-ball momentum with torch.optim.SGD's convention: buf = momentum * buf + grad,
        # w -= lr * buf), written out: torch.optim's first use costs about a second of imports per process
        lr, mom = float(s.lr), float(s.momentum) if s.optimizer == "momentum" else 0.0
        bufs = [torch.zeros_like(p) for p in self.params] if mom else None
        loss_sum, steps = 0.0, 0
        self.model.train()
        # the client's dropout masks come from its own generator, as on the vectorised paths
        masks = (
            DropoutMasks.for_clients(s.seed, server_round, [cid], self.device) if self.has_dropout else None
        )
        with client_dropout(self.model, masks):
            for order in orders:
                for start in range(0, n, s.batch_size):
                    idx = order[start : start + s.batch_size]
                    loss = per_example(self.loss, self.model(x[idx]), y[idx]).mean()
                    grads = torch.autograd.grad(loss, self.params)
                    with torch.no_grad():
                        for j, (p, g) in enumerate(zip(self.params, grads, strict=True)):
                            if bufs is not None:
                                g = bufs[j].mul_(mom).add_(g)
                            p.add_(g, alpha=-lr)
                    loss_sum += float(loss.detach())
                    steps += 1
        update = self._flat() - global_w
        metrics = {
            "client": int(cid),
            "num_examples": n,
            "train_loss": loss_sum / max(steps, 1),
            "trainer": "loop",
        }
        return update, metrics

    def train(
        self, plan: Any, weights: np.ndarray, client_ids: list[int] | np.ndarray | None = None
    ) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Train ``client_ids`` (default: the plan's cohort) from ``weights`` for round ``plan.round``; return the
        sum of their clipped updates and their metrics, in the order of ``client_ids``.

        ``plan`` is the round's plan (:class:`fedsim.strategies.RoundPlan`, or a :class:`ClientPlan`): ``clip``;
        ``noise_share_std > 0`` (distributed noise): each client clips its update and adds its own Gaussian share,
        drawn from ``plan.noise`` (purpose ``"share"``, the client's own stream; seeded in simulation, the
        operating system's entropy in deployment), before the update leaves the client, and the partial sum then
        holds noised updates; ``count_share_std > 0`` (adaptive clipping with distributed noise): each client also
        noises its unclipped bit (``partial.unclipped_noised``); ``client_weights``: per-client aggregation weights
        (agnostic FL); ``loss_bound``: also compute each client's loss of the *global* model, per example clipped
        to ``[0, loss_bound]`` and divided by it (so in [0, 1]), and accumulate the sums per domain in
        ``partial.extras`` (``domain_loss``, ``domain_count``).

        A client fails alone (:meth:`train_stream`): an exception in its training, a non-finite update or loss
        rejects it (counted in ``partial.failures``, contributing zero) and the others are trained. Its metrics
        then hold ``failed`` (the reason) and ``error`` instead of ``train_loss``.
        """
        client_ids = plan.cohort if client_ids is None else client_ids
        metrics: list[dict[str, Any]] = []
        partial = PartialSum(self.dim)
        for unit, new in self.train_stream(plan, weights, client_ids):
            partial.merge(unit)
            metrics.extend(new)
        position = {int(c): i for i, c in enumerate(client_ids)}
        metrics.sort(key=lambda m: position[m["client"]])  # the order of client_ids, whatever the path
        return partial, metrics

    def train_stream(
        self, plan: Any, weights: np.ndarray, client_ids: list[int] | np.ndarray | None = None
    ) -> Iterator[tuple[PartialSum, list[dict[str, Any]]]]:
        """:meth:`train` as it goes: yields ``(partial, metrics)`` for each unit of work (one client on the loop,
        one chunk when vectorised; first, with a ``loss_bound``, the clients whose loss failed). ``partial`` holds
        that unit's clients only and ``metrics`` one entry per client of it, so a caller that stops listening
        knows exactly which clients are in what it received (a Ray worker that dies or times out mid-round:
        :class:`fedsim.engine.ray_engine.RayEngine`). Merging the partials in order gives, bit for bit, the sum
        of adding every client to one partial: each unit's sum enters the total in one addition either way."""
        server_round, loss_bound = int(plan.round), plan.loss_bound
        global_w = self._global(weights)
        cids = [int(c) for c in (plan.cohort if client_ids is None else client_ids)]
        losses: dict[int, float] = {}
        if loss_bound is not None:
            self._load(global_w)
            failed, new, kept = PartialSum(self.dim), [], []
            for cid in cids:
                try:
                    loss = bounded_value(self.bounded_loss(cid, loss_bound), 0.0, 1.0)
                except Exception as exc:  # the user's model or loss failed on this client's data
                    new.append(self._failed(failed, cid, server_round, "error", exc))
                    continue
                if loss is None:  # a NaN loss would make lambda NaN for the rest of the run
                    new.append(self._failed(failed, cid, server_round, "non_finite"))
                    continue
                losses[cid] = loss
                kept.append(cid)
            cids = kept
            if new:
                yield failed, new
        distributed = plan.noise_share_std > 0 or plan.encodes
        for results in self._units(server_round, cids, global_w):
            partial, new = PartialSum(self.dim), []
            # the encoding's Hadamard transform is many small matrix products: one BLAS thread each is several times
            # faster than BLAS threads waiting on each other (and on the other workers) on busy cores
            with blas_threads(1) if plan.encodes else contextlib.nullcontext():
                for update, m in results:
                    if update is None:  # failed while training: already described in m
                        partial.reject(reason=m["failed"])
                        new.append(m)
                    elif isinstance(update, torch.Tensor) and update.ndim == 2:  # a vectorised chunk
                        if distributed:  # each client noises its own update: row by row
                            for row, mi in enumerate(m):
                                self._add_one(partial, update[row], mi, plan)
                        else:  # summed on the device: only the sum and the norms leave it
                            self._add_chunk(partial, update, m, plan.clip, plan.client_weights)
                        new.extend(m)
                    else:
                        self._add_one(partial, update, m, plan)
                        new.append(m)
            if losses:  # the losses of the clients whose update was accepted join the per-domain sums
                self._domain_losses(partial, new, losses)
            yield partial, new

    def _units(
        self, server_round: int, cids: list[int], global_w: torch.Tensor
    ) -> Iterator[list[tuple[Any, Any]]]:
        """The cohort's training, a unit at a time: a list of ``(update, metrics)`` per client, ``(None, metrics)``
        for a client that failed, or one ``([K, dim] updates, [K metrics])`` pair for a vectorised chunk. A chunk
        that raises is trained again client by client on the loop, so only the clients that fail are lost."""
        if self.path.step is None:
            for cid in cids:
                yield [self._train_isolated(cid, server_round, global_w)]
            return
        for part in chunk_plan(self, cids):
            try:
                with full_fp32():  # around the chunk only: not across the yield, where the caller's code runs
                    updates, chunk_metrics = train_chunk(self, server_round, part, global_w)
            except Exception as exc:
                log.warning(
                    "round %d: a chunk of %d clients failed on the %s path (%s: %s); training them one by one",
                    server_round,
                    len(part),
                    self.path.name,
                    type(exc).__name__,
                    exc,
                )
                yield [self._train_isolated(cid, server_round, global_w) for cid in part]
                continue
            yield [(updates, chunk_metrics)]

    def _train_isolated(
        self, cid: int, server_round: int, global_w: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        try:
            return self.train_one(cid, server_round, global_w)
        except Exception as exc:  # the user's model, loss or data failed on this client
            return None, self._failure(cid, server_round, "error", exc)

    def _failure(
        self, cid: int, server_round: int, reason: str, exc: BaseException | None = None
    ) -> dict[str, Any]:
        m: dict[str, Any] = {"client": int(cid), "failed": reason, "update_norm": math.nan}
        if exc is not None:  # one line per client; the traceback at DEBUG (a broken model fails every client)
            m["error"] = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("round %d: client %d failed: %s", server_round, cid, m["error"])
            log.debug("round %d: client %d's traceback", server_round, cid, exc_info=exc)
        return m

    def _failed(
        self, partial: PartialSum, cid: int, server_round: int, reason: str, exc: BaseException | None = None
    ) -> dict[str, Any]:
        partial.reject(reason=reason)
        return self._failure(cid, server_round, reason, exc)

    def _add_chunk(
        self,
        partial: PartialSum,
        updates: torch.Tensor,
        metrics: list[dict[str, Any]],
        clip: float,
        client_weights: dict[int, float] | None,
    ) -> None:
        weights = None if client_weights is None else [client_weights[m["client"]] for m in metrics]
        norms = partial.add_batch(updates, clip, weights)
        for m, norm in zip(metrics, norms, strict=True):
            m["update_norm"] = float(norm)
            if not math.isfinite(norm):
                m["failed"] = "non_finite"

    def _add_one(self, partial: PartialSum, update: torch.Tensor, m: dict[str, Any], plan: Any) -> None:
        clip, share_std = plan.clip, plan.noise_share_std
        if (
            plan.encodes
        ):  # the client encodes its update (integers for secure aggregation) with its noise share
            encoded, info = plan.noise.encode(
                plan.round,
                m["client"],
                update.detach().double().cpu().numpy(),
                clip,
                plan.encoding_for(self.dim),
            )
            norm = info.get("norm", math.nan)
            if encoded is None:
                partial.reject(reason="non_finite")
                m["failed"] = "non_finite"
            else:
                partial.add_encoded(encoded, norm, info.get("sums"))
                partial.unclipped += int(norm <= clip)
        elif share_std > 0:
            clipped, norm, finite = clip_update(update.double(), clip)
            if finite:
                share, count_noise = self._shares(plan, m["client"], share_std)
                partial.add(clipped.cpu().numpy() + share, clip, already_clipped_and_noised=True)
                partial.unclipped += int(norm <= clip)
                partial.norms.append(norm)
                if count_noise is not None:
                    partial.add_noised_count(int(norm <= clip) + count_noise)
            else:
                partial.reject(reason="non_finite")
                m["failed"] = "non_finite"
        else:
            w = 1.0 if plan.client_weights is None else float(plan.client_weights[m["client"]])
            norm = partial.add(update, clip, weight=w)
            if not math.isfinite(norm):
                m["failed"] = "non_finite"
        m["update_norm"] = norm

    def _shares(self, plan: Any, cid: int, share_std: float) -> tuple[np.ndarray, float | None]:
        """Client ``cid``'s noise share of the model update and, with adaptive clipping, of its unclipped bit: one
        draw from the client's own stream of ``plan.noise`` (the bit's noise follows the update's)."""
        if plan.noise is None:
            raise ValueError("distributed noise needs the plan's noise source (plan.noise)")
        count_std = plan.count_share_std
        if count_std <= 0:
            return plan.noise.noise(plan.round, "share", self.dim, share_std, client=cid), None
        std = np.full(self.dim + 1, share_std)
        std[-1] = count_std
        draw = plan.noise.noise(plan.round, "share", self.dim + 1, std, client=cid)
        return draw[:-1], float(draw[-1])

    def _domain_losses(
        self, partial: PartialSum, metrics: list[dict[str, Any]], losses: dict[int, float]
    ) -> None:
        num_domains = int(self.data.num_domains)
        for m in metrics:
            if "failed" not in m:
                d = int(self.data.domain(m["client"]))
                partial.add_extra("domain_loss", d, losses[m["client"]], num_domains)
                partial.add_extra("domain_count", d, 1.0, num_domains)

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    @full_fp32()
    def bounded_loss(self, cid: int, bound: float, weights: np.ndarray | torch.Tensor | None = None) -> float:
        """Mean over the client's examples of ``min(cross_entropy, bound) / bound`` for ``weights`` (default:
        the model as loaded)."""
        if weights is not None:
            self._load(self._global(weights))
        x, y = self._tensors(cid)
        if y.shape[0] == 0:
            return 0.0
        self.model.eval()
        losses = per_example(self.loss, self.model(x), y)
        return float(torch.clamp(losses, min=0.0, max=bound).mean() / bound)

    @torch.no_grad()
    @full_fp32()
    def evaluate(self, client_ids: list[int] | np.ndarray, weights: np.ndarray) -> np.ndarray:
        """One row per client, float64, in the layout of :data:`fedsim.training.evaluation.COLUMNS`:
        ``[client, examples, loss_sum, correct, scored, nll_sum, metric_sum]``."""
        self._load(self._global(weights))
        self.model.eval()
        rows = np.zeros((len(client_ids), EVAL_WIDTH))
        for i, cid in enumerate(client_ids):
            x, y = self._tensors(int(cid))
            if y.shape[0] == 0:
                rows[i, 0] = cid
                continue
            rows[i] = (cid, y.shape[0], *evaluate_outputs(self.model(x), y, self.loss, self.metric))
        return rows
