"""Vectorised local training: many clients trained together, each with its own copy of the model.

:func:`train_vectorized` runs, for K clients at once, exactly the SGD of
:meth:`fedsim.training.trainer.ClientTrainer.train_one`: same learning rate, momentum, local epochs, batch
size and the same batch order (:func:`fedsim.training.shuffle.client_orders`, a function of
``(seed, round, client id, epoch)``). The model's parameters are stacked along a leading client axis. For the
registry's models one SGD step of every client is a few batched matrix products with the backward pass
written out (:mod:`fedsim.training.stacked`); any other model falls back to ``vmap(grad(loss))`` over that axis
(``torch.func.functional_call``). Both give each client exactly its own gradient. On the CPU, a CNN1D chunk
is trained instead by a fused C kernel (:mod:`fedsim.training.native`, client by client with every step in
cache) when it can be compiled; ``FEDSIM_NATIVE=0`` turns it off.

Ragged clients: each client ``k`` takes ``ceil(n_k / batch_size)`` steps per epoch. Clients are sorted by
that number (most steps first), so at step ``s`` of an epoch the clients still training are a prefix of the
chunk: only that prefix is computed and updated (a client that has finished its epoch does no update and
its momentum buffer is left alone). A client's last, partial batch is padded to ``batch_size`` and masked:
its loss is the mean over its real examples only.

Clients are processed in chunks (``chunk_size``, or sized from a memory budget) to bound memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from . import native
from .shuffle import client_orders
from .stacked import dense_step, stacked_forward

#: bytes of per-client state (parameters, gradients, momentum, activations) one chunk may hold
DEFAULT_MEMORY_BUDGET = 256 * 2**20
MAX_CHUNK = 512


def _chunk_size(trainer: Any, batch_size: int, memory_budget: int) -> int:
    dim = int(trainer.dim)
    # parameters + momentum + gradient + an update copy, float32, plus a generous activation allowance
    per_client = 4 * (4 * dim + 64 * batch_size * max(trainer.data.input_dim, 1))
    return max(1, min(MAX_CHUNK, memory_budget // per_client))


def _make_step(model: torch.nn.Module) -> Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """``step(params, x, y, mask, count) -> (grads, losses)`` for ``a`` clients (leading axis of every argument).

    The loss of client k is ``sum(mask_k * cross_entropy) / count_k``. LogReg and MLPs use
    :func:`fedsim.training.stacked.dense_step` (the backward pass written out). With a stacked forward
    (:func:`fedsim.training.stacked.stacked_forward`) one autograd pass over the sum of the clients' losses
    gives each client's gradient; otherwise ``vmap(grad(functional_call(model)))``.
    """
    manual = dense_step(model)
    if manual is not None:
        return manual
    forward = stacked_forward(model)
    if forward is None:

        def loss_fn(
            params: dict[str, torch.Tensor],
            x: torch.Tensor,
            y: torch.Tensor,
            mask: torch.Tensor,
            count: torch.Tensor,
        ) -> torch.Tensor:
            logits = functional_call(model, params, (x,))
            losses = F.cross_entropy(logits, y, reduction="none")
            return (losses * mask).sum() / count

        return vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0, 0))

    def step(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        leaves = {name: v.detach().requires_grad_(True) for name, v in params.items()}
        with torch.enable_grad():
            logits = forward(leaves, x)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
            losses = (ce.view(mask.shape) * mask).sum(1) / count
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), losses.detach()

    return step


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
    ``trainer``: which implementation trained the client."""
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


def _empty_chunk(
    trainer: Any, cids: list[int], global_w: torch.Tensor, path: str
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    zeros = torch.zeros((len(cids), trainer.dim), device=trainer.device, dtype=global_w.dtype)
    return zeros, _metrics(trainer, cids, [0] * len(cids), [0.0] * len(cids), path)


def _train_chunk_native(
    trainer: Any, dims: np.ndarray, server_round: int, cids: list[int], global_w: torch.Tensor
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """:func:`_train_chunk` with the fused CPU kernel :func:`fedsim.training.native.cnn1d_train` (every step of
    the chunk in one call; the same batches, losses and updates up to float rounding)."""
    s = trainer.settings
    tensors = [trainer._tensors(c) for c in cids]
    n = np.array([int(y.shape[0]) for _, y in tensors], dtype=np.int64)
    if int(n.sum()) == 0:
        return _empty_chunk(trainer, cids, global_w, "native-cnn1d")
    starts = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    # numpy, not torch: a multi-threaded torch op here would leave PyTorch's OpenMP threads spinning on the
    # cores the kernel's threads are about to use
    x_all = np.concatenate([x.numpy() for x, _ in tensors]).reshape(int(n.sum()), -1)
    y_all = np.concatenate([y.numpy() for _, y in tensors])
    # each client's epochs in the order of train_one, as rows of the chunk's concatenated data
    order = client_orders(s.seed, server_round, cids, n, int(s.local_epochs)) + np.repeat(starts, n)[None, :]
    use_momentum = s.optimizer == "momentum" and s.momentum != 0.0
    updates, loss_sum = native.cnn1d_train(
        dims,
        global_w,
        x_all,
        y_all,
        order,
        starts,
        n,
        float(s.lr),
        float(s.momentum) if use_momentum else 0.0,
    )
    return updates, _metrics(trainer, cids, n.tolist(), loss_sum.tolist(), "native-cnn1d")


def _train_chunk(
    trainer: Any, step_fn: Any, names: list[str], server_round: int, cids: list[int], global_w: torch.Tensor
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Train clients ``cids`` (sorted by steps, most first) together; returns updates ``[K, dim]`` and metrics."""
    s = trainer.settings
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
        return _empty_chunk(trainer, cids, global_w, "vectorized")
    x_all = torch.cat([x for x, _ in tensors])
    y_all = torch.cat([y for _, y in tensors])
    idx, mask, count, max_steps = _batch_plan(trainer, server_round, cids, sizes, offsets)
    idx, mask, count = idx.to(device), mask.to(device), count.to(device)
    steps = torch.tensor([math.ceil(n / bsz) for n in sizes])
    # number of clients still training at step t (clients are sorted by steps, descending)
    active = [int((steps > t).sum()) for t in range(max_steps)]

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

    for e in range(int(s.local_epochs)):
        for t in range(max_steps):
            a = active[t]
            if a == 0:
                break
            bi = idx[e, t, :a]  # [a, B]
            xb = x_all[bi]
            yb = y_all[bi]
            sub = {name: v[:a] for name, v in params.items()} if a < k else params
            grads, losses = step_fn(sub, xb, yb, mask[e, t, :a], count[e, t, :a])
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
    return flat - global_w.unsqueeze(0), _metrics(trainer, cids, sizes, loss_sum.cpu().tolist(), "vectorized")


def train_vectorized_chunks(
    trainer: Any,
    server_round: int,
    client_ids: list[int],
    global_w: torch.Tensor,
    *,
    chunk_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Iterator[tuple[torch.Tensor, list[dict[str, Any]]]]:
    """Train ``client_ids`` from ``global_w`` together, a chunk at a time (most local steps first); yield
    ``(updates, metrics)`` per chunk: ``updates[i]`` is the flat float32 ``w - global_w`` of client
    ``metrics[i]["client"]``, on ``trainer.device``; ``metrics`` hold ``client``, ``num_examples``,
    ``train_loss`` (mean batch loss over the client's steps) and ``trainer`` (``vectorized`` or
    ``native-cnn1d``), as ``train_one``'s do."""
    s = trainer.settings
    cids = [int(c) for c in client_ids]
    if not cids:
        return
    names = [name for name, _ in trainer.model.named_parameters()]
    if len(names) != len(trainer.params):  # pragma: no cover - shared parameters are not supported
        raise ValueError("train_vectorized needs a model whose parameters are all distinct")
    nums = trainer.data.num_examples_array(cids)
    steps = [math.ceil(int(n) / s.batch_size) for n in nums]
    order = sorted(range(len(cids)), key=lambda j: -steps[j])  # stable: ties keep the given order
    size = chunk_size or _chunk_size(trainer, int(s.batch_size), memory_budget)
    gw = global_w.to(device=trainer.device, dtype=torch.float32)
    trainer.model.train()
    dims = native_dims(trainer)
    step_fn = None if dims is not None else _make_step(trainer.model)
    for start in range(0, len(order), size):
        part = [cids[j] for j in order[start : start + size]]
        if dims is not None:
            yield _train_chunk_native(trainer, dims, server_round, part, gw)
        else:
            yield _train_chunk(trainer, step_fn, names, server_round, part, gw)


def native_dims(trainer: Any) -> np.ndarray | None:
    """The fused CPU kernel's dims for ``trainer``'s model when that kernel will train it (a CNN1D on the CPU,
    :func:`fedsim.training.native.available`), else ``None`` (the PyTorch path)."""
    if trainer.device.type != "cpu" or not native.enabled():
        return None
    dims = native.cnn1d_dims(trainer.model, int(trainer.settings.batch_size))
    if dims is None or not native.available():
        return None
    return dims


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
