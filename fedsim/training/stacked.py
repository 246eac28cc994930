"""Local SGD steps of the registry's models for K clients at once, each client with its own parameters.

Two levels, both over parameters with a leading client axis (``params[name]`` is ``[K, *shape]``, the names
and shapes of ``model.named_parameters()``), inputs ``x [K, B, input_dim]`` and logits ``[K, B, classes]``:

* :func:`dense_step` (LogReg, ReLU MLPs, CNN1D): ``step(params, x, y, mask, count) -> (grads, losses)`` with
  the backward pass written out as batched GEMMs (``torch.bmm``/``baddbmm``), no autograd graph. This is
  what :mod:`fedsim.training.vectorized` uses for the registry's models.
* :func:`stacked_forward`: ``f(params, x) -> logits`` for the same models; the clients' parameters are
  independent, so one autograd pass over the *sum* of their losses gives every client its own gradient.
  The fallback when a written-out step is missing, and a reference for it in the tests.

Convolutions are im2col GEMMs in channels-last layout ``[K, B, L, C]`` (elementwise layers then run on
contiguous memory; the head's weight is permuted, a small copy, instead of the activations). Anything else
returns ``None`` and :mod:`fedsim.training.vectorized` uses ``torch.func.vmap``. All three agree to float
rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.models.registry import CNN1D, MLP, LogReg

StackedForward = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x [K, N, in]``, ``w [K, out, in]``, ``b [K, out]`` -> ``[K, N, out]``."""
    if b is None:
        return torch.bmm(x, w.transpose(1, 2))
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def _conv1d(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, conv: nn.Conv1d) -> torch.Tensor:
    """Channels-last ``h [K, B, L, C]``, ``w [K, Co, C, k]`` -> ``[K, B, Lo, Co]`` (``conv``'s stride and
    zero padding; dilation 1, groups 1)."""
    k_, n, length, c = h.shape
    co, ksize = w.shape[1], w.shape[3]
    stride, pad = conv.stride[0], conv.padding[0]
    lo = (length + 2 * pad - ksize) // stride + 1
    hp = F.pad(h, (0, 0, pad, pad)) if pad else h
    span = stride * (lo - 1) + 1
    cols = torch.cat([hp[:, :, j : j + span : stride, :] for j in range(ksize)], dim=-1)  # [K, B, Lo, k*C]
    wm = w.permute(0, 3, 2, 1).reshape(k_, ksize * c, co)  # rows ordered (tap, channel) like cols
    out = (
        torch.bmm(cols.reshape(k_, n * lo, ksize * c), wm)
        if b is None
        else torch.baddbmm(b.unsqueeze(1), cols.reshape(k_, n * lo, ksize * c), wm)
    )
    return out.view(k_, n, lo, co)


def _supported_conv(conv: nn.Conv1d) -> bool:
    return (
        conv.groups == 1
        and conv.dilation == (1,)
        and conv.padding_mode == "zeros"
        and isinstance(conv.padding, tuple)
    )


def stacked_forward(model: nn.Module) -> StackedForward | None:
    """The stacked forward of ``model`` (see the module docstring), or ``None`` if it has none."""
    if isinstance(model, LogReg):

        def logreg(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return _linear(x.flatten(2), p["linear.weight"], p["linear.bias"])

        return logreg

    if isinstance(model, MLP):
        layers: list[tuple[str, str | None]] = []
        for i, m in enumerate(model.net):
            if isinstance(m, nn.Linear):
                layers.append(("linear", f"net.{i}"))
            elif isinstance(m, nn.ReLU):
                layers.append(("relu", None))
            else:
                return None

        def mlp(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            h = x.flatten(2)
            for kind, name in layers:
                h = (
                    _linear(h, p[f"{name}.weight"], p.get(f"{name}.bias"))
                    if kind == "linear"
                    else torch.relu(h)
                )
            return h

        return mlp

    if isinstance(model, CNN1D):
        if not (
            _supported_conv(model.conv1) and _supported_conv(model.conv2) and isinstance(model.act, nn.ReLU)
        ):
            return None
        c1, c2 = model.conv1, model.conv2

        def cnn(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            k_, n = x.shape[0], x.shape[1]
            h = x.reshape(k_, n, -1, 1)  # channels last, one input channel
            h = torch.relu(_conv1d(h, p["conv1.weight"], p.get("conv1.bias"), c1))
            h = torch.relu(_conv1d(h, p["conv2.weight"], p.get("conv2.bias"), c2))
            length, ch = h.shape[2], h.shape[3]
            hw = p["head.weight"]  # [K, out, C*L], flattened channel-major by the module
            hw = hw.view(k_, -1, ch, length).transpose(2, 3).reshape(k_, -1, length * ch)
            return _linear(h.reshape(k_, n, length * ch), hw, p.get("head.bias"))

        return cnn

    return None


StackedStep = Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]]


def _dense_layers(model: nn.Module) -> list[tuple[str, bool]] | None:
    """``[(prefix, relu_after)]`` of a LogReg or an MLP of Linear+ReLU layers; ``None`` for anything else."""
    if isinstance(model, LogReg):
        return [("linear", False)]
    if not isinstance(model, MLP):
        return None
    mods = list(model.net)
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(mods):
        if not isinstance(mods[i], nn.Linear):
            return None
        relu = i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU)
        out.append((f"net.{i}", relu))
        i += 2 if relu else 1
    return out if not out[-1][1] else None


def dense_step(model: nn.Module) -> StackedStep | None:
    """For a LogReg, a ReLU MLP or the CNN1D: ``step(params, x, y, mask, count) -> (grads, losses)`` with the
    backward pass written out (batched GEMMs, no autograd graph): the per-step cost of a small model is mostly
    autograd's bookkeeping and copies, and this cuts it by a third to a half. The loss of client k is ``sum(mask_k * CE) / count_k``;
    ``d loss_k / d logits = mask / count_k * (softmax(logits) - onehot(y))``. ``None`` for other models."""
    if isinstance(model, CNN1D):
        return _cnn1d_step(model)
    layers = _dense_layers(model)
    if layers is None:
        return None

    @torch.no_grad()
    def step(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        acts = [x.flatten(2)]
        for name, relu in layers:
            h = _linear(acts[-1], params[f"{name}.weight"], params.get(f"{name}.bias"))
            acts.append(h.relu_() if relu else h)
        logp = torch.log_softmax(acts.pop(), dim=-1)  # [K, B, C]
        yi = y.unsqueeze(-1)
        weight = mask / count.unsqueeze(1)  # [K, B]
        losses = -(logp.gather(-1, yi).squeeze(-1) * weight).sum(1)
        d = logp.exp_()
        d.scatter_add_(-1, yi, torch.full_like(yi, -1.0, dtype=d.dtype))
        d.mul_(weight.unsqueeze(-1))
        grads: dict[str, torch.Tensor] = {}
        for li in range(len(layers) - 1, -1, -1):
            name, _relu = layers[li]
            a = acts[li]
            grads[f"{name}.weight"] = torch.bmm(d.transpose(1, 2), a)
            if f"{name}.bias" in params:
                grads[f"{name}.bias"] = d.sum(1)
            if li:
                d = torch.bmm(d, params[f"{name}.weight"]).mul_(a > 0)  # a is a ReLU output
        return grads, losses

    return step


def _im2col(h: torch.Tensor, conv: nn.Conv1d) -> tuple[torch.Tensor, int]:
    """Channels-last ``h [K, B, L, C]`` -> columns ``[K, B * Lo, k * C]`` ordered (tap, channel), and ``Lo``."""
    ksize, stride, pad = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    lo = (h.shape[2] + 2 * pad - ksize) // stride + 1
    hp = F.pad(h, (0, 0, pad, pad)) if pad else h
    cols = hp.unfold(2, ksize, stride).transpose(3, 4)  # [K, B, Lo, k, C] (a view; the reshape copies once)
    return cols.reshape(h.shape[0], h.shape[1] * lo, ksize * h.shape[3]), lo


def _col2im(dcols: torch.Tensor, conv: nn.Conv1d, length: int, channels: int) -> torch.Tensor:
    """The adjoint of :func:`_im2col`: ``[K, B * Lo, k * C]`` -> ``[K, B, L, C]`` (``k`` strided adds)."""
    ksize, stride, pad = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    lo = (length + 2 * pad - ksize) // stride + 1
    k_, n = dcols.shape[0], dcols.shape[1] // lo
    d = dcols.view(k_, n, lo, ksize, channels)
    out = torch.zeros(k_, n, length + 2 * pad, channels, dtype=dcols.dtype, device=dcols.device)
    span = stride * (lo - 1) + 1
    for j in range(ksize):
        out[:, :, j : j + span : stride, :] += d[:, :, :, j, :]
    return out[:, :, pad : pad + length, :]


def _cnn1d_step(model: CNN1D) -> StackedStep | None:
    """:func:`dense_step` for :class:`CNN1D` (two stride/padding Conv1d+ReLU layers and a linear head), with
    the convolutions as im2col GEMMs in channels-last layout and their backward written out."""
    c1, c2 = model.conv1, model.conv2
    if not (
        _supported_conv(c1)
        and _supported_conv(c2)
        and isinstance(model.act, nn.ReLU)
        and c1.bias is not None
        and c2.bias is not None
        and model.head.bias is not None
    ):
        return None
    relu_grad = torch.ops.aten.threshold_backward  # grad * (output > 0), one kernel

    @torch.no_grad()
    def step(
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        count: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        k_, n = x.shape[0], x.shape[1]
        w1, b1 = params["conv1.weight"], params["conv1.bias"]
        w2, b2 = params["conv2.weight"], params["conv2.bias"]
        head, bh = params["head.weight"], params["head.bias"]
        (ch1, ch0, k1), (ch2, _, k2) = w1.shape[1:], w2.shape[1:]
        w1m = w1.permute(0, 3, 2, 1).reshape(k_, k1 * ch0, ch1)
        w2m = w2.permute(0, 3, 2, 1).reshape(k_, k2 * ch1, ch2)
        cols1, l1 = _im2col(x.reshape(k_, n, -1, 1), c1)
        a1 = torch.baddbmm(b1.unsqueeze(1), cols1, w1m).relu_()  # [K, B*L1, C1]
        cols2, l2 = _im2col(a1.view(k_, n, l1, ch1), c2)
        a2 = torch.baddbmm(b2.unsqueeze(1), cols2, w2m).relu_()  # [K, B*L2, C2]
        hm = head.view(k_, -1, ch2, l2).transpose(2, 3).reshape(k_, -1, l2 * ch2)  # channels-last flatten
        flat = a2.view(k_, n, l2 * ch2)
        logp = torch.log_softmax(torch.baddbmm(bh.unsqueeze(1), flat, hm.transpose(1, 2)), dim=-1)
        yi = y.unsqueeze(-1)
        weight = mask / count.unsqueeze(1)
        losses = -(logp.gather(-1, yi).squeeze(-1) * weight).sum(1)
        d = logp.exp_()
        d.scatter_add_(-1, yi, torch.full_like(yi, -1.0, dtype=d.dtype))
        d.mul_(weight.unsqueeze(-1))  # d loss / d logits  [K, B, classes]
        g_head = torch.bmm(d.transpose(1, 2), flat).view(k_, -1, l2, ch2).transpose(2, 3).reshape(head.shape)
        dz2 = relu_grad(torch.bmm(d, hm).view(k_, n * l2, ch2), a2, 0.0)
        g_w2 = torch.bmm(cols2.transpose(1, 2), dz2).view(k_, k2, ch1, ch2).permute(0, 3, 2, 1).contiguous()
        da1 = _col2im(torch.bmm(dz2, w2m.transpose(1, 2)), c2, l1, ch1).reshape(k_, n * l1, ch1)
        dz1 = relu_grad(da1, a1, 0.0)
        g_w1 = torch.bmm(cols1.transpose(1, 2), dz1).view(k_, k1, ch0, ch1).permute(0, 3, 2, 1).contiguous()
        grads = {
            "conv1.weight": g_w1,
            "conv1.bias": dz1.sum(1),
            "conv2.weight": g_w2,
            "conv2.bias": dz2.sum(1),
            "head.weight": g_head,
            "head.bias": d.sum(1),
        }
        return grads, losses

    return step
