"""Local training of clients: the code that runs inside every worker (Ray actor, Flower ClientApp, in-process).

A :class:`ClientTrainer` keeps one model and the federated data, copies the global weights into the model in
place, trains a list of clients one after the other (or together when vectorised: :mod:`fedsim.training.vectorized`),
clips each update with :func:`fedsim.round.clip_update` and returns only a
:class:`~fedsim.round.PartialSum` plus per-client metrics.

Client randomness (batch order: :mod:`fedsim.training.shuffle`; distributed noise shares) comes from
``(seed, round, client_id)``, so the result does not depend on which worker trains which client.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.factories import build_model, per_example, resolve_loss
from fedsim.round import STREAM_NOISE_SHARE, PartialSum, bounded_value, clip_update, make_rng

from .layers import DropoutMasks, client_dropout, dropout_layers
from .shuffle import client_orders
from .vectorized import TrainingPath, choose_path, train_vectorized, train_vectorized_chunks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """What a worker needs to train a client (plain values: cheap to ship to workers).

    ``model``: the model factory, a ``"package.module:function"`` reference (resolved in the worker) or a
    callable; ``model_kwargs``: its options; ``loss``: ``"cross_entropy"``, a reference or a callable
    (:mod:`fedsim.factories`); ``vectorize``: ``auto``, ``per-layer``, ``vmap`` or ``loop``
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
            seed=scenario.seed,
            vectorize=scenario.engine.vectorize,
            loss=scenario.model.loss,
        )


def make_model(settings: TrainSettings, input_shape: Any, num_classes: int) -> nn.Module:
    """The model the factory builds, initialised from the seed (PyTorch's default initialisation)."""
    torch.manual_seed(settings.seed)
    return build_model(settings.model, input_shape, num_classes, settings.model_kwargs)


def initial_weights(settings: TrainSettings, input_shape: Any, num_classes: int) -> np.ndarray:
    """The global model's starting point (float64 flat vector), a function of the seed only."""
    model = make_model(settings, input_shape, num_classes)
    return nn.utils.parameters_to_vector(model.parameters()).detach().double().numpy()


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
        self.has_dropout = bool(dropout_layers(self.model))
        #: how cohorts are trained: per-layer, vmap or loop (the first that agrees with the model run alone)
        self.path: TrainingPath = choose_path(
            self.model, self.input_shape, data.num_classes, self.loss, self.device, settings.vectorize
        )
        for reason in self.path.fallbacks:
            log.info("local training falls back from %s", reason)

    # ------------------------------------------------------------------ helpers
    def _tensors(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is not None and cid in self._cache:
            return self._cache[cid]
        x, y = self.data.client_data(int(cid))
        t = (
            torch.as_tensor(x, dtype=torch.float32, device=self.device),
            torch.as_tensor(y, dtype=torch.long, device=self.device),
        )
        if self._cache is not None:
            self._cache[cid] = t
        return t

    def _load(self, weights: torch.Tensor) -> None:
        # copy in place: vector_to_parameters would make the parameters *views* of ``weights``, and
        # training would then write into the global model
        with torch.no_grad():
            i = 0
            for p in self.params:
                n = p.numel()
                p.copy_(weights[i : i + n].view_as(p))
                i += n

    def _flat(self) -> torch.Tensor:
        return nn.utils.parameters_to_vector(self.params).detach()

    def _global(self, weights: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ training
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
        self,
        server_round: int,
        client_ids: list[int] | np.ndarray,
        weights: np.ndarray,
        clip: float,
        noise_share_std: float = 0.0,
        client_weights: dict[int, float] | None = None,
        loss_bound: float | None = None,
        *,
        noise_seed: int | None = None,
        count_share_std: float = 0.0,
    ) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Train ``client_ids`` from ``weights``; return the sum of their clipped updates and their metrics.

        With ``noise_share_std > 0`` (distributed noise) each client clips its update and adds its own
        Gaussian share before the update leaves the client; the partial sum then holds noised updates. The shares
        come from ``(noise_seed, round, client)`` (simulation) or, with ``noise_seed=None``, from the operating
        system's entropy (deployment). ``count_share_std > 0`` (adaptive clipping with distributed noise): each
        client also noises its unclipped bit (``partial.unclipped_noised``).
        ``client_weights``: per-client aggregation weights (agnostic FL); ``loss_bound``: also compute each
        client's loss of the *global* model, per example clipped to ``[0, loss_bound]`` and divided by it (so
        in [0, 1]), and accumulate the sums per domain in ``partial.extras`` (``domain_loss``, ``domain_count``).
        A client whose loss is not finite is rejected whole (it enters neither noised sum).
        """
        global_w = self._global(weights)
        partial = PartialSum(self.dim)
        cids = [int(c) for c in client_ids]
        losses: dict[int, float] = {}
        if loss_bound is not None:
            self._load(global_w)
            kept = []
            for cid in cids:
                loss = bounded_value(self.bounded_loss(cid, loss_bound), 0.0, 1.0)
                if loss is None:  # a NaN loss would make lambda NaN for the rest of the run
                    partial.reject()
                    continue
                losses[cid] = loss
                kept.append(cid)
            cids = kept
        partial, metrics = self._train_cohort(
            partial,
            server_round,
            cids,
            global_w,
            clip,
            noise_share_std,
            client_weights,
            noise_seed,
            count_share_std,
        )
        if losses:  # the losses of the clients whose update was accepted join the per-domain sums
            num_domains = int(self.data.num_domains)
            for m in metrics:
                if math.isfinite(m["update_norm"]):
                    d = int(self.data.domain(m["client"]))
                    partial.add_extra("domain_loss", d, losses[m["client"]], num_domains)
                    partial.add_extra("domain_count", d, 1.0, num_domains)
        return partial, metrics

    def _train_cohort(
        self,
        partial: PartialSum,
        server_round: int,
        cids: list[int],
        global_w: torch.Tensor,
        clip: float,
        noise_share_std: float,
        client_weights: dict[int, float] | None,
        noise_seed: int | None,
        count_share_std: float,
    ) -> tuple[PartialSum, list[dict[str, Any]]]:
        metrics: list[dict[str, Any]] = []
        vectorized = self.path.step is not None and bool(cids)
        if vectorized and noise_share_std == 0:
            # the whole chunk is clipped and summed on the device at once; only the sum leaves it
            for updates, chunk_metrics in train_vectorized_chunks(self, server_round, cids, global_w):
                weights = (
                    None if client_weights is None else [client_weights[m["client"]] for m in chunk_metrics]
                )
                norms = partial.add_batch(updates, clip, weights)
                for m, norm in zip(chunk_metrics, norms, strict=True):
                    m["update_norm"] = float(norm)
                    metrics.append(m)
            position = {c: i for i, c in enumerate(cids)}
            metrics.sort(key=lambda m: position[m["client"]])  # the order of client_ids, as the loop gives
            return partial, metrics
        if vectorized:
            results = train_vectorized(self, server_round, cids, global_w)
        else:
            results = (self.train_one(c, server_round, global_w) for c in cids)
        for update, m in results:
            if noise_share_std > 0:
                clipped, norm, finite = clip_update(update.double(), clip)
                if finite:
                    rng = make_rng(noise_seed, server_round, STREAM_NOISE_SHARE, m["client"])
                    share = rng.normal(0.0, noise_share_std, size=self.dim)
                    partial.add(clipped.cpu().numpy() + share, clip, already_clipped_and_noised=True)
                    partial.unclipped += int(norm <= clip)
                    partial.norms.append(norm)
                    if count_share_std > 0:
                        partial.add_noised_count(int(norm <= clip) + rng.normal(0.0, count_share_std))
                else:
                    partial.reject()
            else:
                w = 1.0 if client_weights is None else float(client_weights[m["client"]])
                norm = partial.add(update, clip, weight=w)
            m["update_norm"] = norm
            metrics.append(m)
        return partial, metrics

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
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
    def evaluate(self, client_ids: list[int] | np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per client: ``[client, num_examples, loss_sum, correct]`` (float64 array, one row per client)."""
        self._load(self._global(weights))
        self.model.eval()
        rows = np.zeros((len(client_ids), 4))
        for i, cid in enumerate(client_ids):
            x, y = self._tensors(int(cid))
            if y.shape[0] == 0:
                rows[i] = (cid, 0, 0.0, 0.0)
                continue
            outputs = self.model(x)
            loss = per_example(self.loss, outputs, y).sum()
            correct = (outputs.argmax(1) == y).sum()
            rows[i] = (cid, y.shape[0], float(loss), float(correct))
        return rows
