"""Vectorised local training: many clients trained together, each with its own copy of the user's model.

:func:`train_vectorized_chunks` runs, for K clients at once, exactly the SGD of
:meth:`fedsim.training.trainer.ClientTrainer.train_one`: same learning rate, momentum, local epochs, batch size,
loss, the same batch order (:func:`fedsim.training.shuffle.client_orders`, a function of
``(seed, round, client id, epoch)``) and the same dropout masks. The parameters are stacked along a leading
client axis; one step of every client is one forward and one backward of

* ``per-layer``: the user's own ``forward`` with each layer's per-type rule (:mod:`fedsim.training.layers`),
  for models built from supported layer types; or
* ``vmap``: ``torch.func.vmap(grad(functional_call(model)))`` over the client axis, for any other model vmap
  can run.

:func:`choose_path` picks the first of ``per-layer``, ``vmap``, ``loop`` (the per-client loop) that works for
the model, after checking on two clients that the vectorised step gives each client exactly the gradient of
the model run alone; each row names the path that trained.

Ragged clients: each client ``k`` takes ``ceil(n_k / batch_size)`` steps per epoch. Clients are sorted by
that number (most steps first), so at step ``s`` of an epoch the clients still training are a prefix of the
chunk: only that prefix is computed and updated (a client that has finished its epoch does no update and
its momentum buffer is left alone). A client's last, partial batch is padded to ``batch_size`` and masked:
its loss is the mean over its real examples only.

Clients are processed in chunks sized from a memory budget (parameters, optimiser state and the activations
the probe measured) to bound memory.
"""

from __future__ import annotations

import logging
import math
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedsim.factories import cross_entropy, per_example
from fedsim.labels import see_docs

from .layers import (
    DropoutMasks,
    StackedModel,
    Unsupported,
    check_agreement,
    dropout_layers,
    masked_cross_entropy,
)
from .shuffle import client_orders

log = logging.getLogger(__name__)

#: the ways a cohort can be trained, fastest first; ``engine.vectorize`` takes these or ``auto``
PATHS: tuple[str, ...] = ("per-layer", "vmap", "loop")
VECTORIZE: tuple[str, ...] = ("auto", *PATHS)

#: bytes of per-client state (parameters, gradients, momentum, activations) one chunk may hold
DEFAULT_MEMORY_BUDGET = 256 * 2**20
MAX_CHUNK = 512

Step = Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]]


@dataclass(frozen=True)
class TrainingPath:
    """How a trainer trains its cohorts: ``name`` (one of :data:`PATHS`), the vectorised ``step`` (``None``
    for the loop), why faster paths were not taken, and the activation floats per example the probe saw."""

    name: str
    step: Step | None
    fallbacks: tuple[str, ...] = ()
    activations_per_example: int = 0


def check_vectorize(value: Any) -> str:
    """``engine.vectorize`` as one of :data:`VECTORIZE` (``True`` is ``auto``, ``False`` is ``loop``)."""
    if value is True:
        return "auto"
    if value is False:
        return "loop"
    if value not in VECTORIZE:
        raise ValueError(
            f"invalid engine.vectorize={value!r}: allowed one of {', '.join(map(repr, VECTORIZE))}"
        )
    return str(value)


def _per_layer_step(stacked: StackedModel, loss: Callable[..., torch.Tensor]) -> Step:
    """One autograd pass over the sum of the clients' losses: their parameters are independent, so each
    client's parameters get exactly that client's gradient. The default loss (cross-entropy on ``[K, B, C]``
    logits) has its backward written out."""
    fused = loss is cross_entropy

    def step(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
        masks: DropoutMasks | None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        leaves = {name: v.detach().requires_grad_(True) for name, v in params.items()}
        a, b = y.shape[:2]
        with torch.enable_grad():
            out = stacked.forward(leaves, x, masks)
            if fused and out.dim() == 3 and y.dim() == 2:  # labels; sequence targets take the generic loss
                losses = masked_cross_entropy(out, y, mask, count)
            else:
                flat_y = y.reshape(a * b, *y.shape[2:])
                per = per_example(loss, out.reshape(a * b, *out.shape[2:]), flat_y).view(a, b)
                losses = (per * mask).sum(1) / count
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), losses.detach()

    return step


def _vmap_step(model: nn.Module, loss: Callable[..., torch.Tensor]) -> Step:
    """``vmap(grad(functional_call))`` over the client axis. Dropout draws from torch's generator here
    (``randomness="different"``): each client its own masks, not the per-client generators' masks."""

    def loss_fn(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
    ) -> torch.Tensor:
        out = functional_call(model, params, (x,))
        return (per_example(loss, out, y) * mask).sum() / count

    batched = vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0, 0), randomness="different")

    def step(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
        masks: DropoutMasks | None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return batched(params, x, y, mask, count)

    return step


def _probe(
    step: Step,
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    loss: Callable[..., torch.Tensor],
    device: torch.device,
    examples: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    def batched(
        params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, masks: Any
    ) -> Any:
        return step(
            params, x, y, mask, torch.ones(y.shape[0], device=device), masks
        )  # count 1: summed losses

    check_agreement(batched, model, input_shape, num_classes, loss, device, examples=examples)


def _activations_per_example(
    model: nn.Module, input_shape: tuple[int, ...], device: torch.device, x: torch.Tensor | None = None
) -> int:
    """Floats every module outputs for one example (what autograd keeps for the backward, roughly), on ``x`` (two
    real examples) or zeros: every tensor a module returns (an LSTM's output and states, attention's output and
    weights), and for a recurrent layer the gates it keeps for every step, which it does not return."""
    inputs = torch.zeros(2, *input_shape, device=device) if x is None else x[:2]
    n = max(1, int(inputs.shape[0]))
    total = 0

    def floats(out: Any) -> int:
        if isinstance(out, torch.Tensor):
            return out.numel()
        if isinstance(out, (tuple, list)):
            return sum(floats(o) for o in out)
        return 0

    def hook(m: nn.Module, _i: Any, out: Any) -> None:
        nonlocal total
        total += floats(out) // n
        if isinstance(m, nn.RNNBase) and isinstance(out, tuple) and isinstance(out[0], torch.Tensor):
            steps = out[0].shape[1] if m.batch_first else out[0].shape[0]
            gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1) * m.hidden_size
            total += m.num_layers * (2 if m.bidirectional else 1) * steps * gates

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(inputs)
    except Exception:  # the model may not run on zeros in this shape: leave the estimate to the caller
        total = 0
    finally:
        for h in handles:
            h.remove()
    return total


def choose_path(
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    loss: Callable[..., torch.Tensor],
    device: torch.device,
    requested: str = "auto",
    *,
    examples: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> TrainingPath:
    """The first path of :data:`PATHS` (from ``requested`` on; ``auto`` tries all) that trains ``model`` with
    per-client gradients equal to the model run alone on each client. Asking for ``per-layer`` or ``vmap``
    explicitly raises a ``ValueError`` with the reason when that path cannot train the model.

    ``examples``: real ``(inputs, labels)`` from the data, on which the paths are checked (a model that takes token
    ids must be checked on valid ids); without them, random inputs of ``input_shape``."""
    requested = check_vectorize(requested)
    if requested == "loop":
        return TrainingPath("loop", None)
    acts = _activations_per_example(model, input_shape, device, None if examples is None else examples[0])
    was_training = model.training
    fallbacks: list[str] = []
    try:
        if requested in ("auto", "per-layer"):
            try:
                model.train()
                step = _per_layer_step(StackedModel(model), loss)
                _probe(step, model, input_shape, num_classes, loss, device, examples)
                return TrainingPath("per-layer", step, (), acts)
            except Unsupported as exc:
                if requested == "per-layer":
                    raise ValueError(
                        f"engine.vectorize='per-layer' cannot train this model: {exc} ({see_docs('training-path')})"
                    ) from None
                fallbacks.append(f"per-layer: {exc}")
            except Exception as exc:  # the model raised under the rules (an Embedding on random float inputs)
                if requested == "per-layer":
                    raise ValueError(
                        f"engine.vectorize='per-layer' cannot train this model: {type(exc).__name__}: {exc} "
                        f"({see_docs('training-path')})"
                    ) from None
                fallbacks.append(_refusal("per-layer", exc, examples))
        try:
            # vmap's dropout is not the per-client generators': check it with dropout off
            model.train(not dropout_layers(model))  # those inside a layer too (a GRU's, attention's)
            step = _vmap_step(model, loss)
            _probe(step, model, input_shape, num_classes, loss, device, examples)
            return TrainingPath("vmap", step, tuple(fallbacks), acts)
        except Exception as exc:  # vmap raises many kinds of errors for what it cannot batch
            if requested == "vmap":
                raise ValueError(
                    f"engine.vectorize='vmap' cannot train this model: {exc} ({see_docs('training-path')})"
                ) from None
            fallbacks.append(_refusal("vmap", exc, examples))
        return TrainingPath("loop", None, tuple(fallbacks), acts)
    finally:
        model.train(was_training)


def _refusal(path: str, exc: Exception, examples: Any) -> str:
    """Why ``path`` cannot train the model, as ``summary.json`` publishes it: an error raised on real examples is
    named by its type and where it was raised only (its text may quote them, an id); the whole message is logged
    at INFO (``fedsim.training.vectorized``), and asking for the path (``engine.vectorize``) stops the run with
    it, whatever the engine. The check's own refusals (:class:`Unsupported`: which client's loss or parameter's
    gradient differs) quote nothing computed from the examples and are published whole."""
    if examples is None or isinstance(exc, Unsupported):
        return f"{path}: {type(exc).__name__}: {exc}"
    log.info("%s refused on real examples: %s: %s", path, type(exc).__name__, exc)
    return (
        f"{path}: {type(exc).__name__} raised{_raised_in(exc)} on real examples (its message is not published: it "
        f"may quote them; engine.vectorize={path!r} stops the run with it)"
    )


def _raised_in(exc: BaseException) -> str:
    """`` in <function> (<file>:<line>)`` for the innermost frame of ``exc`` outside torch, or ``""``: where a user's
    model failed, without the message."""
    frames = traceback.extract_tb(exc.__traceback__)
    skip = (os.path.dirname(torch.__file__), os.path.dirname(__file__), os.path.dirname(os.__file__))
    outside = [f for f in frames if not f.filename.startswith(skip)]
    if not outside:
        return ""
    f = outside[-1]
    return f" in {f.name} ({os.path.basename(f.filename)}:{f.lineno})"


def _chunk_size(trainer: Any, batch_size: int, memory_budget: int) -> int:
    dim = int(trainer.dim)
    acts = trainer.path.activations_per_example or 64 * max(trainer.data.input_dim, 1)
    # parameters + momentum + gradient + an update copy, and each layer's output kept for the backward (x3:
    # the output, its gradient and the rules' reshaped copies), all float32
    per_client = 4 * (4 * dim + 3 * batch_size * (acts + int(trainer.data.input_dim)))
    return max(1, min(MAX_CHUNK, memory_budget // per_client))


def _batch_plan(
    trainer: Any, server_round: int, cids: list[int], sizes: list[int], offsets: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Index, mask and count tensors ``[epochs, steps, K, B]`` (indices into the chunk's concatenated data).

    The batch orders are :func:`fedsim.training.shuffle.client_orders`, exactly those of ``train_one``.
    """
    s = trainer.settings
    bsz = int(s.batch_size)
    epochs = int(s.local_epochs)
    k = len(cids)
    n = np.asarray(sizes, dtype=np.int64)
    max_steps = int(-(-n.max() // bsz)) if k else 0
    orders = client_orders(s.seed, server_round, cids, n, epochs)  # [E, total], local indices
    seg = np.repeat(np.arange(k), n)
    starts = np.repeat(np.asarray(offsets, dtype=np.int64), n)
    pos = np.arange(int(n.sum())) - starts  # each example slot's position within its client's epoch
    step, slot = pos // bsz, pos % bsz
    idx = np.zeros((epochs, max_steps, k, bsz), dtype=np.int64)
    mask = np.zeros((epochs, max_steps, k, bsz), dtype=np.float32)
    glob = orders + starts[None, :]
    for e in range(epochs):
        idx[e, step, seg, slot] = glob[e]
        mask[e, step, seg, slot] = 1.0
    mask_t = torch.from_numpy(mask)
    return torch.from_numpy(idx), mask_t, mask_t.sum(-1).clamp_min(1.0), max_steps


def _metrics(
    trainer: Any, cids: list[int], sizes: list[int], loss_sums: list[float], path: str
) -> list[dict[str, Any]]:
    """Per-client metrics as ``train_one`` gives them (``train_loss``: mean of the per-step losses), and
    ``trainer``: which path trained the client."""
    bsz, epochs = int(trainer.settings.batch_size), int(trainer.settings.local_epochs)
    return [
        {
            "client": int(c),
            "num_examples": int(n),
            "train_loss": float(lv) / max(1, math.ceil(n / bsz) * epochs),
            "trainer": path,
        }
        for c, n, lv in zip(cids, sizes, loss_sums, strict=True)
    ]


def _train_chunk(
    trainer: Any, names: list[str], server_round: int, cids: list[int], global_w: torch.Tensor
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Train clients ``cids`` (sorted by steps, most first) together; returns updates ``[K, dim]`` and metrics."""
    s = trainer.settings
    path: TrainingPath = trainer.path
    device = trainer.device
    bsz = int(s.batch_size)
    k = len(cids)
    tensors = [trainer._tensors(c) for c in cids]
    sizes = [int(y.shape[0]) for _, y in tensors]
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += n
    if total == 0:
        zeros = torch.zeros((k, trainer.dim), device=device, dtype=global_w.dtype)
        return zeros, _metrics(trainer, cids, sizes, [0.0] * k, path.name)
    x_all = torch.cat([x for x, _ in tensors])
    y_all = torch.cat([y for _, y in tensors])
    idx, mask, count, max_steps = _batch_plan(trainer, server_round, cids, sizes, offsets)
    idx, mask, count = idx.to(device), mask.to(device), count.to(device)
    steps = torch.tensor([math.ceil(n / bsz) for n in sizes])
    # number of clients still training at step t (clients are sorted by steps, descending)
    active = [int((steps > t).sum()) for t in range(max_steps)]
    masks = real = None
    if trainer.has_dropout:  # each client's masks, drawn for its real examples per (epoch, step)
        masks = DropoutMasks.for_clients(s.seed, server_round, cids, device)
        real = count.to(torch.int64).cpu()

    # stacked parameters [K, *shape], in the order of trainer.params
    params: dict[str, torch.Tensor] = {}
    i = 0
    for name, p in zip(names, trainer.params, strict=True):
        n = p.numel()
        params[name] = global_w[i : i + n].view(p.shape).to(torch.float32).expand(k, *p.shape).clone()
        i += n
    use_momentum = s.optimizer == "momentum" and s.momentum != 0.0
    bufs = {name: torch.zeros_like(t) for name, t in params.items()} if use_momentum else None
    lr, mom = float(s.lr), float(s.momentum)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=device)
    step_fn = path.step
    assert step_fn is not None

    for e in range(int(s.local_epochs)):
        for t in range(max_steps):
            a = active[t]
            if a == 0:
                break
            bi = idx[e, t, :a]  # [a, B]
            sub = {name: v[:a] for name, v in params.items()} if a < k else params
            if masks is not None:
                masks.sizes = real[e, t, :a].tolist()
            grads, losses = step_fn(sub, x_all[bi], y_all[bi], mask[e, t, :a], count[e, t, :a], masks)
            with torch.no_grad():
                loss_sum[:a] += losses.detach().double()
                for name, v in params.items():
                    g = grads[name]
                    if bufs is not None:
                        b = bufs[name][:a]
                        b.mul_(mom).add_(g)
                        v[:a].add_(b, alpha=-lr)
                    else:
                        v[:a].add_(g, alpha=-lr)

    flat = torch.cat([params[name].reshape(k, -1) for name in names], dim=1)
    return flat - global_w.unsqueeze(0), _metrics(trainer, cids, sizes, loss_sum.cpu().tolist(), path.name)


def chunk_plan(
    trainer: Any,
    client_ids: list[int],
    *,
    chunk_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> list[list[int]]:
    """The chunks :func:`train_vectorized_chunks` trains, in its order: most local steps first (ties keep the
    given order), at most ``chunk_size`` clients each (default: as many as ``memory_budget`` holds)."""
    s = trainer.settings
    cids = [int(c) for c in client_ids]
    if not cids:
        return []
    nums = trainer.data.num_examples_array(cids)
    steps = [math.ceil(int(n) / s.batch_size) for n in nums]
    order = sorted(range(len(cids)), key=lambda j: -steps[j])  # stable: ties keep the given order
    size = chunk_size or _chunk_size(trainer, int(s.batch_size), memory_budget)
    return [[cids[j] for j in order[start : start + size]] for start in range(0, len(order), size)]


def train_chunk(
    trainer: Any, server_round: int, cids: list[int], global_w: torch.Tensor
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Train one chunk of :func:`chunk_plan` together on ``trainer.path``: updates ``[K, dim]`` (float32, on
    ``trainer.device``, row i of client ``metrics[i]["client"]``) and metrics as ``train_one`` gives them."""
    if trainer.path.step is None:
        raise ValueError(f"train_vectorized needs a vectorised path; this trainer's is {trainer.path.name!r}")
    names = [name for name, _ in trainer.model.named_parameters()]
    gw = global_w.to(device=trainer.device, dtype=torch.float32)
    trainer.model.train()
    return _train_chunk(trainer, names, server_round, cids, gw)


def train_vectorized_chunks(
    trainer: Any,
    server_round: int,
    client_ids: list[int],
    global_w: torch.Tensor,
    *,
    chunk_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Iterator[tuple[torch.Tensor, list[dict[str, Any]]]]:
    """Train ``client_ids`` from ``global_w`` together on ``trainer.path`` (``per-layer`` or ``vmap``), a chunk
    at a time (most local steps first); yield ``(updates, metrics)`` per chunk: ``updates[i]`` is the flat
    float32 ``w - global_w`` of client ``metrics[i]["client"]``, on ``trainer.device``; ``metrics`` hold
    ``client``, ``num_examples``, ``train_loss`` (mean batch loss over the client's steps) and ``trainer`` (the
    path), as ``train_one``'s do."""
    if trainer.path.step is None:
        raise ValueError(f"train_vectorized needs a vectorised path; this trainer's is {trainer.path.name!r}")
    for part in chunk_plan(trainer, client_ids, chunk_size=chunk_size, memory_budget=memory_budget):
        yield train_chunk(trainer, server_round, part, global_w)


def train_vectorized(
    trainer: Any,
    server_round: int,
    client_ids: list[int],
    global_w: torch.Tensor,
    *,
    chunk_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Iterator[tuple[torch.Tensor, dict[str, Any]]]:
    """:func:`train_vectorized_chunks`, one ``(update, metrics)`` per client, in the order of ``client_ids``."""
    cids = [int(c) for c in client_ids]
    found: dict[int, tuple[torch.Tensor, dict[str, Any]]] = {}
    for updates, metrics in train_vectorized_chunks(
        trainer, server_round, cids, global_w, chunk_size=chunk_size, memory_budget=memory_budget
    ):
        for row, m in enumerate(metrics):
            found[m["client"]] = (updates[row], m)
    return iter([found[c] for c in cids])
