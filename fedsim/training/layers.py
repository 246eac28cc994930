"""Per-layer-type rules: many clients' copies of one model trained in one pass, whatever the model.

K clients train together when their parameters are stacked along a leading client axis (``params[name]`` is
``[K, *shape]``) and their batches are concatenated, client-major, into one batch of ``K * B`` examples. The
user's own ``forward`` then runs unchanged: fedsim only replaces, for the duration of the call, the
``forward`` of each *layer* that holds parameters by a rule for its type that applies client ``k``'s
parameters to rows ``k*B .. (k+1)*B - 1``. As Opacus registers per-sample gradient rules per layer type,
the rules here are registered per layer type (:func:`register`, :mod:`fedsim.training.layer_registry`), found
by walking the module tree with ``named_modules()``; no rule knows a model's class or its parameter names.

* Layers with parameters: Linear (batched matrix products), Conv1d/Conv2d/Conv3d (one grouped convolution
  with K groups), LayerNorm, RMSNorm and GroupNorm (the normalisation is per example; the affine part per client),
  Embedding (one lookup in the clients' tables stacked end to end; on ids without the batch axis, nanoGPT's
  ``self.pos(torch.arange(T))``, each example gets its client's rows, :func:`_shared_embedding`); RNN, LSTM and
  GRU (the input projections of all time steps in one batched product, the recurrence one batched product per
  step, its backward written out) and MultiheadAttention (per-client projections around one attention over the
  stacked batch), in
  :mod:`fedsim.training.sequence_layers`. With these, ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder``
  need no rule of their own: their children have rules.
* A rule may own its layer's descendants (:func:`register`'s ``owns_children``): MultiheadAttention's forward
  uses its ``out_proj`` child's parameters directly, so its rule gets them (``"out_proj.weight"``) and the walk
  does not visit the child.
* Parameter-free layers that act on each example alone (activations, Flatten, pooling, ...) need no rule:
  they run as they are on the ``K * B`` batch (:data:`PER_EXAMPLE`).
* Dropout draws each client's masks from the client's own generator (:class:`DropoutMasks`), the same masks
  the per-client loop draws, so both paths train identically; so does the dropout torch applies inside a layer
  (between a recurrent layer's layers, on attention weights), whose rule draws the masks in the loop too
  (:func:`register`'s ``draws`` and ``alone``).
* A model's own parameters, held next to its layers and used by its ``forward`` directly (a table of positions,
  ``x + self.pos``), read during the stacked call as each example's client's copy, ``[K * B, *shape]``
  (:func:`_per_example_parameters`); a scalar one is refused (its broadcast axes cannot be known).
* BatchNorm is refused for every path (:func:`fedsim.factories.check_private_trainable`).

Code in a model's ``forward`` between layers (``x.flatten(1)``, ``torch.relu``, a residual ``+``) runs on
the ``K * B`` batch too, which is right for anything that treats examples independently. Something that mixes
examples (``x - x.mean(0)``) would mix clients, so a path is only used after :func:`check_agreement` has run
it on two clients with different parameters and inputs, one with a padded batch, and found each client's loss
and gradients equal to those of the model run on that client's real examples alone. Anything else falls back
to ``torch.func.vmap``
(:mod:`fedsim.training.vectorized`), then to the per-client loop.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# the rules of RNN, LSTM, GRU and MultiheadAttention register themselves when their module is imported
from . import sequence_layers as _sequence_layers  # noqa: F401

# the registry and what every rule shares, also importable from here (rules written outside fedsim use it)
from .layer_registry import RULES, Rule, Unsupported, register, stacked_linear
from .layer_registry import Check as Check
from .layer_registry import LayerRule as LayerRule

#: parameter-free layers that act on each example alone: they run unchanged on the stacked batch
PER_EXAMPLE: tuple[type[nn.Module], ...] = (
    nn.Identity,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Hardtanh,
    nn.Flatten,
    nn.Unflatten,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)


# --------------------------------------------------------------------------- the rules
@register(nn.Linear)
def _linear(m: nn.Linear, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor) -> torch.Tensor:
    w = p["weight"]
    y = stacked_linear(x.reshape(k, -1, x.shape[-1]), w, p.get("bias"))  # [K, B * (other dims), out]
    return y.reshape(*x.shape[:-1], w.shape[1])


_CONV = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}


@register(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv(m: nn.Conv1d, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor) -> torch.Tensor:
    """One grouped convolution: the K clients' inputs side by side as channel groups ``[B, K*C, ...]``. (An
    im2col rule with batched matrix products and the backward written out measured 1.7-1.9x slower than this
    on the CPU, for small 1-D and 2-D CNNs with 100 clients of batch 16.)"""
    w, b = p["weight"], p.get("bias")
    n, c, spatial = x.shape[0] // k, x.shape[1], x.shape[2:]
    xg = x.reshape(k, n, c, *spatial).transpose(0, 1).reshape(n, k * c, *spatial)
    padding: Any = m.padding
    if m.padding_mode != "zeros":
        xg = F.pad(xg, m._reversed_padding_repeated_twice, mode=m.padding_mode)
        padding = 0
    co = w.shape[1]
    y = _CONV[type(m)](
        xg,
        w.reshape(k * co, *w.shape[2:]),
        None if b is None else b.reshape(k * co),
        m.stride,
        padding,
        m.dilation,
        m.groups * k,
    )
    return y.reshape(n, k, co, *y.shape[2:]).transpose(0, 1).reshape(k * n, co, *y.shape[2:])


@register(nn.GroupNorm)
def _group_norm(
    m: nn.GroupNorm, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor
) -> torch.Tensor:
    y = F.group_norm(x, m.num_groups, None, None, m.eps)
    w, b = p.get("weight"), p.get("bias")
    if w is None and b is None:
        return y
    yk = y.reshape(k, -1, *y.shape[1:])  # [K, B, C, *spatial]
    per_channel = (k, 1, y.shape[1]) + (1,) * (y.dim() - 2)
    if w is not None:
        yk = yk * w.view(per_channel)
    if b is not None:
        yk = yk + b.view(per_channel)
    return yk.reshape(y.shape)


def _embedding_check(m: nn.Embedding) -> str | None:
    if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
        return "with max_norm, scale_grad_by_freq or sparse has no per-layer rule"
    return None


@register(nn.Embedding, check=_embedding_check)
def _embedding(
    m: nn.Embedding, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor
) -> torch.Tensor:
    """One lookup in the K clients' tables stacked end to end: client k's ids are offset by ``k * num_embeddings``.
    An id outside ``[0, num_embeddings)`` is an ``IndexError`` here, as in ``nn.Embedding``: offset, it would
    silently read another client's table. ``padding_idx`` rows get no gradient (their output is detached)."""
    w = p["weight"]  # [K, num_embeddings, dim]
    v = w.shape[1]
    if x.numel():
        lo, hi = (int(e) for e in torch.aminmax(x))  # one pass over the ids
        if lo < 0 or hi >= v:
            raise IndexError(f"nn.Embedding: an id outside [0, {v}) (got {lo} .. {hi})")
    offsets = torch.arange(k, device=x.device).mul_(v).view(k, *([1] * x.dim()))
    ids = (x.reshape(k, -1, *x.shape[1:]) + offsets).reshape(x.shape)
    out = F.embedding(ids, w.reshape(k * v, w.shape[2]))
    if m.padding_idx is not None:
        out = torch.where((x == m.padding_idx).unsqueeze(-1), out.detach(), out)
    return out


def _shared_embedding(
    m: nn.Embedding, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor, *, batch: int
) -> torch.Tensor:
    """An ``nn.Embedding`` called on ids without the batch axis, the same for every example (nanoGPT's positions,
    ``self.pos(torch.arange(T))``): torch returns ``[*x.shape, dim]``, which the model broadcasts against its batched
    activations. Here each example gets its own client's rows, ``[N, *x.shape, dim]`` for the ``N = K * B`` stacked
    examples (a leading axis of 1, ids ``[1, T]``, becomes the ``N`` axis), an expanded view: the same broadcast gives
    each example its client's rows, and autograd sums each client's gradient over its examples, scattered to the
    ids. Whether a call is batched is found by :meth:`StackedModel.trace`, never from the shapes of the stacked call
    (``T`` may equal ``N``); what the model does with the result is checked by :func:`check_agreement`."""
    w = p["weight"]  # [K, num_embeddings, dim]
    v = w.shape[1]
    if x.numel():
        lo, hi = (int(e) for e in torch.aminmax(x))
        if lo < 0 or hi >= v:
            raise IndexError(f"nn.Embedding: an id outside [0, {v}) (got {lo} .. {hi})")
    ids = x[0] if x.dim() and x.shape[0] == 1 else x
    out = w[:, ids]  # [K, *ids.shape, dim]: client k's rows
    if m.padding_idx is not None:
        out = torch.where((ids == m.padding_idx).unsqueeze(-1), out.detach(), out)
    b = batch // k
    return out.unsqueeze(1).expand(k, b, *out.shape[1:]).flatten(0, 1)


@register(nn.LayerNorm)
def _layer_norm(
    m: nn.LayerNorm, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor
) -> torch.Tensor:
    shape = tuple(m.normalized_shape)
    y = F.layer_norm(x, shape, None, None, m.eps)
    w, b = p.get("weight"), p.get("bias")
    if w is None and b is None:
        return y
    yk = y.reshape(k, -1, *shape)  # the normalised dims are the last ones
    if w is not None:
        yk = yk * w.unsqueeze(1)
    if b is not None:
        yk = yk + b.unsqueeze(1)
    return yk.reshape(y.shape)


@register(nn.RMSNorm)
def _rms_norm(m: nn.RMSNorm, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor) -> torch.Tensor:
    """``nn.RMSNorm``: the normalisation is per example, the scale per client (as :func:`_layer_norm`)."""
    shape = tuple(m.normalized_shape)
    y = F.rms_norm(x, shape, None, m.eps)
    w = p.get("weight")
    return y if w is None else (y.reshape(k, -1, *shape) * w.unsqueeze(1)).reshape(y.shape)


@register(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, draws=lambda m: True)
def _dropout(m: nn.Dropout, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor) -> torch.Tensor:
    if not m.training or m.p == 0.0:
        return x
    if masks is None:
        raise RuntimeError("a training-mode Dropout ran without per-client masks (fedsim.training.layers)")
    # Dropout1d/2d/3d drop whole channels: one draw per (example, channel)
    channelwise = type(m) is not nn.Dropout
    shape = (*x.shape[:2], *([1] * (x.dim() - 2))) if channelwise else tuple(x.shape)
    return x * masks.draw(shape, k, float(m.p), x)


# --------------------------------------------------------------------------- losses
class _MaskedCrossEntropy(torch.autograd.Function):
    """Each client's mean cross-entropy over its real examples, ``sum_b mask[k,b] * CE[k,b] / count[k]``, for
    logits ``[K, B, C]``; the backward is ``(softmax - onehot(y)) * mask / count``, written out."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=-1)
        yi = y.unsqueeze(-1)
        ctx.save_for_backward(logp, yi, weight)
        return -(logp.gather(-1, yi).squeeze(-1) * weight).sum(1)

    @staticmethod
    def backward(ctx: Any, dl: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logp, yi, weight = ctx.saved_tensors
        d = logp.exp()
        d.scatter_add_(-1, yi, torch.full_like(yi, -1.0, dtype=d.dtype))
        return d.mul_((weight * dl.unsqueeze(1)).unsqueeze(-1)), None, None


def masked_cross_entropy(
    logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, count: torch.Tensor
) -> torch.Tensor:
    """Per-client mean cross-entropy (see :class:`_MaskedCrossEntropy`) for logits ``[K, B, C]``."""
    return _MaskedCrossEntropy.apply(logits, y, mask / count.unsqueeze(1))


# --------------------------------------------------------------------------- dropout masks
@dataclass
class DropoutMasks:
    """Each client's dropout masks, from its own generator: client ``j`` of a stacked call draws a mask for
    its ``sizes[j]`` real examples (the padded rows of a ragged last batch get ones, and are masked out of the
    loss), so the per-client loop (K = 1) and the stacked path draw the same numbers in the same order."""

    generators: list[torch.Generator]
    sizes: list[int] | None = None  # real examples per client in the current step (None: all B)

    @classmethod
    def for_clients(cls, seed: int, server_round: int, cids: list[int], device: torch.device) -> DropoutMasks:
        gens = []
        for c in cids:
            state = np.random.SeedSequence(
                [int(seed), int(server_round), _TAG_DROPOUT, int(c)]
            ).generate_state(2)
            g = torch.Generator(device=device)
            g.manual_seed(int(state[0]) << 32 | int(state[1]))
            gens.append(g)
        return cls(gens)

    def draw(self, shape: tuple[int, ...], k: int, p: float, like: torch.Tensor) -> torch.Tensor:
        n = shape[0] // k
        if k > len(self.generators):
            raise RuntimeError(f"dropout masks for {len(self.generators)} clients, {k} asked")
        out = torch.ones((k, n, *shape[1:]), dtype=like.dtype, device=like.device)
        for j in range(k):
            real = n if self.sizes is None else min(n, int(self.sizes[j]))
            keep = torch.rand((real, *shape[1:]), generator=self.generators[j], device=like.device) >= p
            out[j, :real] = keep.to(like.dtype) / (1.0 - p) if p < 1.0 else 0.0  # p = 1 drops all, as torch
        return out.reshape(shape)


_TAG_DROPOUT = 0xD809


# --------------------------------------------------------------------------- the stacked model
def _direct_parameters(*args: Any, **kwargs: Any) -> Any:
    """The marker of :func:`plan` for parameters a module's own ``forward`` uses directly, outside its layers (a
    table of positions held by the model): not a rule (the module's forward runs as it is); during the stacked call
    the module's attribute reads as each example's client's copy (:meth:`StackedModel._bind`)."""
    raise AssertionError("_direct_parameters marks parameters; it is never called")


@dataclass(frozen=True)
class _Bound:
    module: nn.Module
    rule: Rule
    names: dict[str, str]  # local parameter name -> the model's parameter name


def plan(model: nn.Module) -> list[_Bound]:
    """The layers to rebind, found by walking the module tree; :class:`Unsupported` names the first layer the
    per-layer path cannot train."""
    owner: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in owner:
            raise Unsupported(f"parameter {name!r} is shared with {owner[id(param)]!r} (tied weights)")
        owner[id(param)] = name
    out: list[_Bound] = []
    owned: set[int] = set()  # the descendants of layers whose rule owns them
    for name, m in model.named_modules():
        if id(m) in owned:
            continue
        own = {n: p for n, p in m._parameters.items() if p is not None}
        rule = RULES.get(type(m))
        if rule is not None:
            reason = None if rule.check is None else rule.check(m)
            if reason is not None:
                raise Unsupported(f"{type(m).__name__} at {name or '<root>'!r} {reason}")
            if rule.owns_children:
                owned.update(id(d) for d in m.modules() if d is not m)
                own = dict(m.named_parameters())
            prefix = f"{name}." if name else ""
            out.append(_Bound(m, rule.forward, {n: prefix + n for n in own}))
        elif own:
            if not any(True for _ in m.children()):  # a layer: its forward is the operation, and has no rule
                raise Unsupported(
                    f"{type(m).__name__} at {name or '<root>'!r} holds parameters ({', '.join(own)}) and no "
                    "per-layer rule is registered for its type"
                )
            # a model's own parameters, next to its layers, used by the code between them (a table of positions)
            scalars = [n for n, p in own.items() if p.dim() == 0]
            if scalars:
                raise Unsupported(
                    f"{type(m).__name__} at {name or '<root>'!r} holds a scalar parameter ({', '.join(scalars)}) "
                    "that its forward uses directly: torch broadcasts a scalar over every axis, and giving each "
                    "example its client's copy needs the axes it meets, which the per-layer path cannot know (a "
                    "parameter with axes is given as [batch, *shape])"
                )
            prefix = f"{name}." if name else ""
            out.append(_Bound(m, _direct_parameters, {n: prefix + n for n in own}))
        elif not any(True for _ in m.children()) and type(m) not in PER_EXAMPLE:
            raise Unsupported(f"layer {type(m).__name__} at {name!r} has no per-layer rule")
    return out


class StackedModel:
    """The user's model run for K clients at once by the per-layer rules (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.bound = plan(model)
        #: the Embedding layers called on ids without the batch axis (:meth:`trace`; ``None``: not traced yet)
        self.shared: set[int] | None = None

    def trace(self, x: torch.Tensor) -> None:
        """Find which Embedding layers are called on ids without the batch axis (nanoGPT's positions): run the model
        as it is (in eval mode, without gradients) on the first of the examples ``x [B, *input]``, alone and twice,
        and compare the ids each Embedding gets. Ids whose first axis doubles are batched (``[n, T]``, or flattened
        ``[n * T]``); ids of the same shape whatever the batch are shared by every
        example (:func:`_shared_embedding`); anything else is :class:`Unsupported`, naming the layer. Found from the
        model run alone, never from the stacked call's shapes, where a sequence length may equal the stacked batch."""
        names = {id(m): name for name, m in self.model.named_modules()}
        embeddings = [b.module for b in self.bound if b.rule is _embedding]
        self.shared = set()
        if not embeddings:
            return
        seen: dict[int, list[tuple[int, ...]]] = {}

        def hook(m: nn.Module, args: tuple[Any, ...]) -> None:
            ids = args[0] if args else None
            seen.setdefault(id(m), []).append(tuple(ids.shape) if isinstance(ids, torch.Tensor) else ())

        one = x[:1]
        runs = []
        modes = {m: m.training for m in self.model.modules()}
        handles = [m.register_forward_pre_hook(hook) for m in embeddings]
        try:
            self.model.eval()  # the shapes, without drawing dropout from torch's generator
            with torch.no_grad():
                for batch in (one, one.expand(2, *one.shape[1:])):
                    seen.clear()
                    self.model(batch)
                    runs.append(dict(seen))
        finally:
            for h in handles:
                h.remove()
            for m, mode in modes.items():
                m.training = mode
        for m in embeddings:
            calls1, calls2 = runs[0].get(id(m), []), runs[1].get(id(m), [])
            kinds = set()
            for s1, s2 in zip(calls1, calls2, strict=False):
                if s1 and s2 and s2[0] == 2 * s1[0] > 0 and s1[1:] == s2[1:]:  # [n, ...] or flattened [n * T]
                    kinds.add("batched")
                elif s1 == s2:
                    kinds.add("shared")
                else:
                    kinds.add(f"ids of shape {s1} for 1 example and {s2} for 2")
            where = f"nn.Embedding at {names.get(id(m), '?')!r}"
            if len(calls1) != len(calls2):
                raise Unsupported(
                    f"{where} is called {len(calls1)} times for 1 example and {len(calls2)} for 2"
                )
            odd = sorted(kind for kind in kinds if kind not in ("batched", "shared"))
            if odd:
                raise Unsupported(
                    f"{where} is called on {odd[0]}: its per-layer rule takes ids whose first axis is the batch, or "
                    "ids shared by every example (without the batch axis)"
                )
            if kinds == {"batched", "shared"}:
                raise Unsupported(f"{where} is called both on batched ids and on ids without the batch axis")
            if kinds == {"shared"}:
                self.shared.add(id(m))

    @contextlib.contextmanager
    def _bind(self, params: dict[str, torch.Tensor], k: int, n: int, masks: Any) -> Iterator[None]:
        shared = self.shared or set()
        layers = [b for b in self.bound if b.rule is not _direct_parameters]
        direct = [b for b in self.bound if b.rule is _direct_parameters]
        with (
            _rebound(
                (
                    b.module,
                    functools.partial(_shared_embedding, batch=k * n) if id(b.module) in shared else b.rule,
                    {name: params[full] for name, full in b.names.items()},
                    k,
                    masks,
                )
                for b in layers
            ),
            _per_example_parameters(
                (b.module, local, params[full], n) for b in direct for local, full in b.names.items()
            ),
        ):
            yield

    def forward(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: DropoutMasks | None
    ) -> torch.Tensor:
        """``x [K, B, *input]`` -> outputs ``[K, B, *out]`` with client k's parameters ``params[name][k]``."""
        k, n = x.shape[0], x.shape[1]
        if self.shared is None:
            self.trace(x[0])
        with self._bind(params, k, n, masks):
            out = self.model(x.reshape(k * n, *x.shape[2:]))
        if not isinstance(out, torch.Tensor) or out.shape[0] != k * n:
            raise Unsupported(
                f"the model's output has shape {tuple(getattr(out, 'shape', ()))} for a stacked batch of {k * n}"
            )
        return out.reshape(k, n, *out.shape[1:])


def dropout_layers(model: nn.Module) -> list[nn.Module]:
    """The layers of ``model`` that draw per-client dropout masks: its Dropout layers, and the layers whose rule
    draws the dropout torch applies inside them (between a recurrent layer's layers)."""
    out = []
    for m in model.modules():
        rule = RULES.get(type(m))
        if rule is not None and rule.draws is not None and rule.draws(m):
            out.append(m)
    return out


@contextlib.contextmanager
def client_dropout(model: nn.Module, masks: DropoutMasks | None) -> Iterator[None]:
    """One client's forward with the layers that draw dropout drawing from ``masks`` (the per-client loop and the
    reference of :func:`check_agreement`); a no-op for a model without dropout."""
    with _rebound(
        (m, RULES[type(m)].alone or RULES[type(m)].forward, {}, 1, masks) for m in dropout_layers(model)
    ):
        yield


@contextlib.contextmanager
def _per_example_parameters(swaps: Iterable[tuple[nn.Module, str, torch.Tensor, int]]) -> Iterator[None]:
    """For the duration, each ``(module, name, stacked [K, *shape], B)``'s parameter reads as ``[K * B, *shape]``
    (the leading axis of 1 of a parameter of two axes or more, ``[1, T, dim]``, becomes the ``K * B`` axis): each
    example of the stacked batch gets its client's copy, as torch would broadcast the parameter against one client's
    batch. What the module's code does with it is checked by :func:`check_agreement`; autograd sums each client's
    gradient over its examples."""
    saved: list[tuple[nn.Module, str, Any]] = []
    try:
        for module, name, stacked, b in swaps:
            v = stacked[:, 0] if stacked.dim() > 2 and stacked.shape[1] == 1 else stacked
            saved.append((module, name, module._parameters[name]))
            module._parameters[name] = v.unsqueeze(1).expand(v.shape[0], b, *v.shape[1:]).flatten(0, 1)
        yield
    finally:
        for module, name, original in reversed(saved):
            module._parameters[name] = original


@contextlib.contextmanager
def _rebound(bindings: Iterable[tuple[nn.Module, Rule, dict[str, torch.Tensor], int, Any]]) -> Iterator[None]:
    """For the duration, each ``(module, rule, params, k, masks)``'s module runs ``rule(module, params, k,
    masks, x)`` as its forward (an instance attribute over the class's method, so hooks still run); restored
    on the way out, whatever happens."""
    modules: list[nn.Module] = []
    try:
        for module, rule, params, k, masks in bindings:
            module.forward = functools.partial(rule, module, params, k, masks)
            modules.append(module)
        yield
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)


# --------------------------------------------------------------------------- the probe
def check_agreement(
    batched: Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]],
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    examples: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Run a vectorised step on two clients with different parameters and inputs, and check that each client's
    loss and gradients equal those of ``model`` run on that client's real examples alone (dropout masks drawn
    the same way). Raises :class:`Unsupported` with the largest difference when they do not agree.

    ``batched(params, x, y, mask, masks) -> (grads of each client's summed loss, summed losses [K])``: ``mask``
    ``[K, B]`` marks real examples (client 1's last slot is padding, as in a ragged client's last batch: a model
    that mixes the examples of a batch would mix the padding in), ``masks`` the two clients' dropout masks.

    ``examples``: real ``(inputs, labels)`` from the data (token ids must be valid ids), dealt to the two clients
    (cycled when there are fewer than ``2 * 3``); without them, standard normal inputs and random labels.
    """
    from torch.func import functional_call

    k, b = 2, 3
    # the stacked batch's size differs from every axis of an example, so that a model whose code confuses the two
    # (an Embedding on ids without the batch axis, sliced by the sequence length) fails here, not by chance later
    dims = set(input_shape if examples is None else examples[0].shape[1:])
    while k * b in dims:
        b += 1
    real = [b, b - 1]  # client 1's batch is padded, as a ragged client's last batch is
    gen = torch.Generator().manual_seed(1234)
    base = {n: p.detach() for n, p in model.named_parameters()}
    params = {
        n: (
            v.unsqueeze(0).expand(k, *v.shape) + 0.05 * torch.randn(k, *v.shape, generator=gen).to(v)
        ).contiguous()
        for n, v in base.items()
    }
    if examples is None or len(examples[1]) == 0:
        x = torch.randn(k, b, *input_shape, generator=gen).to(device)
        y = torch.randint(0, max(1, num_classes), (k, b), generator=gen).to(device)
    else:
        pick = torch.arange(k * b) % len(examples[1])  # each client its own examples where there are enough
        x = examples[0][pick].reshape(k, b, *examples[0].shape[1:]).to(device)
        y = examples[1][pick].reshape(k, b, *examples[1].shape[1:]).to(device)
    mask = torch.tensor([[1.0 if i < r else 0.0 for i in range(b)] for r in real], device=device)
    masks = DropoutMasks.for_clients(0, 0, list(range(k)), device)
    masks.sizes = real
    grads, totals = batched(params, x, y, mask, masks)
    for j in range(k):
        leaves = {n: v[j].detach().clone().requires_grad_(True) for n, v in params.items()}
        masks = DropoutMasks.for_clients(0, 0, [j], device)  # client j's generator, as in the batched call
        with torch.enable_grad(), client_dropout(model, masks):
            out = functional_call(model, leaves, (x[j, : real[j]],))
            ref = loss(out, y[j, : real[j]])
            ref_grads = torch.autograd.grad(ref.sum(), list(leaves.values()), allow_unused=True)
        if not torch.allclose(totals[j], ref.detach().sum(), rtol=rtol, atol=atol):
            raise Unsupported(
                f"client {j}'s loss differs from the model run alone on its real examples (does forward mix "
                "the examples of a batch?)"
            )
        for (name, g_ref), got in zip(
            zip(leaves, ref_grads, strict=True), (grads[n][j] for n in leaves), strict=True
        ):
            want = torch.zeros_like(got) if g_ref is None else g_ref
            if not torch.allclose(got, want, rtol=rtol, atol=atol):
                # on real examples the reason names no number computed from them (summary.json publishes it)
                by = "" if examples is not None else f" by {float((got - want).abs().max()):.3g}"
                raise Unsupported(f"client {j}'s gradient of {name!r} differs from the model run alone{by}")
