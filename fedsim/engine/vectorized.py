"""Vectorised local training: many clients trained together with ``torch.func``.

:func:`train_vectorized` runs, for K clients at once, exactly the SGD of
:meth:`fedsim.engine.trainer.ClientTrainer.train_one`: same learning rate, momentum, local epochs, batch
size and the same batch order (a ``torch.Generator`` seeded from ``(seed, round, STREAM_CLIENT, cid)`` and one
``torch.randperm(n)`` per epoch). The model's parameters are stacked along a leading client axis and one
SGD step of every client is ``vmap(grad(loss))`` over that axis (``torch.func.functional_call``).

Ragged clients: each client ``k`` takes ``ceil(n_k / batch_size)`` steps per epoch. Clients are sorted by
that number (most steps first), so at step ``s`` of an epoch the clients still training are a prefix of the
chunk: only that prefix is computed and updated (a client that has finished its epoch does no update and
its momentum buffer is left alone). A client's last, partial batch is padded to ``batch_size`` and masked:
its loss is the mean over its real examples only.

Clients are processed in chunks (``chunk_size``, or sized from a memory budget) to bound memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from fedsim.privacy.aggregation import STREAM_CLIENT, make_rng

#: bytes of per-client state (parameters, gradients, momentum, activations) one chunk may hold
DEFAULT_MEMORY_BUDGET = 256 * 2**20
MAX_CHUNK = 512


def _chunk_size(trainer: Any, batch_size: int, memory_budget: int) -> int:
    dim = int(trainer.dim)
    # parameters + momentum + gradient + an update copy, float32, plus a generous activation allowance
    per_client = 4 * (4 * dim + 64 * batch_size * max(trainer.data.input_dim, 1))
    return max(1, min(MAX_CHUNK, memory_budget // per_client))


def _make_step(model: torch.nn.Module):
    def loss_fn(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                count: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, params, (x,))
        losses = F.cross_entropy(logits, y, reduction="none")
        return (losses * mask).sum() / count

    return vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0, 0))


def _batch_plan(
    trainer: Any, server_round: int, cids: list[int], sizes: list[int], offsets: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Index, mask and count tensors ``[epochs, steps, K, B]`` (indices into the chunk's concatenated data)."""
    s = trainer.settings
    bsz = int(s.batch_size)
    epochs = int(s.local_epochs)
    k = len(cids)
    steps = [math.ceil(n / bsz) for n in sizes]
    max_steps = max(steps) if steps else 0
    idx = torch.zeros((epochs, max_steps * bsz, k), dtype=torch.long)
    mask = torch.zeros((epochs, max_steps * bsz, k), dtype=torch.float32)
    for j, (cid, n, off) in enumerate(zip(cids, sizes, offsets, strict=True)):
        gen = torch.Generator().manual_seed(
            int(make_rng(s.seed, server_round, STREAM_CLIENT, cid).integers(2**62))
        )
        for e in range(epochs):
            order = torch.randperm(n, generator=gen)
            idx[e, :n, j] = order + off
            mask[e, :n, j] = 1.0
    # [E, S*B, K] -> [E, S, K, B]
    idx = idx.view(epochs, max_steps, bsz, k).permute(0, 1, 3, 2).contiguous()
    mask = mask.view(epochs, max_steps, bsz, k).permute(0, 1, 3, 2).contiguous()
    count = mask.sum(-1).clamp_min(1.0)
    return idx, mask, count, max_steps


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
        return torch.zeros((k, trainer.dim), device=device, dtype=global_w.dtype), [
            {"client": int(c), "num_examples": 0, "train_loss": 0.0} for c in cids
        ]
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
    updates = flat - global_w.unsqueeze(0)
    total_steps = (steps * int(s.local_epochs)).clamp_min(1).double()
    losses = (loss_sum.cpu() / total_steps).tolist()
    metrics = [
        {"client": int(c), "num_examples": int(n), "train_loss": float(lv)}
        for c, n, lv in zip(cids, sizes, losses, strict=True)
    ]
    return updates, metrics


def train_vectorized(
    trainer: Any,
    server_round: int,
    client_ids: list[int],
    global_w: torch.Tensor,
    *,
    chunk_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Iterator[tuple[torch.Tensor, dict[str, Any]]]:
    """Train ``client_ids`` from ``global_w`` together; yield ``(update, metrics)`` per client, in order.

    ``update`` is the flat float32 ``w_k - global_w`` on ``trainer.device``; ``metrics`` holds ``client``,
    ``num_examples`` and ``train_loss`` (mean batch loss over the client's steps), as ``train_one`` does.
    """
    s = trainer.settings
    cids = [int(c) for c in client_ids]
    if not cids:
        return iter(())
    names = [name for name, _ in trainer.model.named_parameters()]
    if len(names) != len(trainer.params):  # pragma: no cover - shared parameters are not supported
        raise ValueError("train_vectorized needs a model whose parameters are all distinct")
    nums = trainer.data.num_examples_array(cids)
    steps = [math.ceil(int(n) / s.batch_size) for n in nums]
    order = sorted(range(len(cids)), key=lambda j: -steps[j])  # stable: ties keep the given order
    size = chunk_size or _chunk_size(trainer, int(s.batch_size), memory_budget)
    step_fn = _make_step(trainer.model)
    gw = global_w.to(device=trainer.device, dtype=torch.float32)
    out: list[tuple[torch.Tensor, dict[str, Any]] | None] = [None] * len(cids)
    trainer.model.train()
    for start in range(0, len(order), size):
        part = order[start : start + size]
        updates, metrics = _train_chunk(trainer, step_fn, names, server_round, [cids[j] for j in part], gw)
        for row, j in enumerate(part):
            out[j] = (updates[row], metrics[row])
    return iter(out)  # type: ignore[arg-type]
