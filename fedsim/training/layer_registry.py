"""The registry of per-layer rules, and what every rule shares: the error that refuses a model and the batched
product of the clients' weights.

:mod:`fedsim.training.layers` (the rules for layers without time, and the path that uses them) and
:mod:`fedsim.training.sequence_layers` (RNN, LSTM, GRU, MultiheadAttention) both register their rules here with
:func:`register`; the path reads them from :data:`RULES`. A rule written outside fedsim registers the same way
(importing :mod:`fedsim.training.layers`, which re-exports these names, registers the shipped rules too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Rule = Callable[..., Any]
#: why a rule cannot run a layer as it is configured (``None``: it can)
Check = Callable[[nn.Module], str | None]


@dataclass(frozen=True)
class LayerRule:
    """How the per-layer path runs one layer type (see :func:`register`)."""

    #: the rule: ``forward(module, params, k, masks, x, *args, **kwargs)``, the layer run for ``k`` stacked clients
    forward: Rule
    #: whether the rule also applies the parameters of the layer's descendants (the walk then skips them)
    owns_children: bool = False
    #: why the rule cannot run the layer as it is configured (``None``: it can)
    check: Check | None = None
    #: whether the layer, as configured, draws dropout in training mode (its rule then draws each client's masks)
    draws: Callable[[nn.Module], bool] | None = None
    #: the layer run for one client with its own parameters and that client's masks (the per-client loop)
    alone: Rule | None = None


#: layer type -> its rule: ``forward(module, params, k, masks, x, *args, **kwargs)`` on ``x [K*B, ...]`` with
#: ``params[local] [K, ...]``
RULES: dict[type[nn.Module], LayerRule] = {}


class Unsupported(Exception):
    """The per-layer path cannot train this model; the message says which layer and why."""


def register(
    *types: type[nn.Module],
    owns_children: bool = False,
    check: Check | None = None,
    draws: Callable[[nn.Module], bool] | None = None,
    alone: Rule | None = None,
) -> Callable[[Rule], Rule]:
    """A decorator: ``@register(nn.Linear)`` registers the function below it, ``rule``, for exactly these layer
    types (a subclass may override ``forward``: it gets no rule).

    ``rule(module, params, k, masks, x, *args, **kwargs)`` replaces the layer's ``forward`` (it receives the
    same arguments) for a stacked batch of ``k`` clients; ``params`` holds the layer's parameters ``[K, *shape]``
    by their names in the layer.

    ``owns_children``: the rule also applies the parameters of the layer's descendants (``params`` then holds
    them by their names relative to the layer, ``"out_proj.weight"``), and the walk
    (:func:`~fedsim.training.layers.plan`) neither visits nor refuses the descendants. ``check(module)``: why the
    rule cannot run this layer as it is configured, or ``None``; the walk refuses the model with that reason and
    the layer's place in it.

    ``draws(module)``: whether the layer, as configured, draws dropout in training mode; its rule then draws each
    client's masks from ``masks`` (:class:`~fedsim.training.layers.DropoutMasks`), and
    ``alone(module, {}, 1, masks, x, ...)`` runs the layer for one client with its own parameters, drawing the
    same masks (the per-client loop, :func:`~fedsim.training.layers.client_dropout`)."""

    def deco(rule: Rule) -> Rule:
        for t in types:
            RULES[t] = LayerRule(rule, owns_children, check, draws, alone)
        return rule

    return deco


class _StackedLinear(torch.autograd.Function):
    """``x [K, N, in] @ w[k]^T + b[k]`` with the backward written out: one autograd node instead of four, and
    the weight gradient computed directly in the weight's layout (contiguous, so the update is one pass)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        wt = w.transpose(1, 2)
        return torch.bmm(x, wt) if b is None else torch.baddbmm(b.unsqueeze(1), x, wt)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        gx = torch.bmm(dy, w) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(dy.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        gb = dy.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def stacked_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x [K, N, in]`` -> ``x[k] @ w[k]^T + b[k]`` ``[K, N, out]`` for weights ``[K, out, in]``, biases ``[K, out]``."""
    return _StackedLinear.apply(x, w, b)
