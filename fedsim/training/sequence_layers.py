"""Per-layer rules for the sequence layers: ``nn.RNN``, ``nn.LSTM``, ``nn.GRU`` and ``nn.MultiheadAttention``.

They follow :mod:`fedsim.training.layers`, which imports this module (so they are registered, in
:mod:`fedsim.training.layer_registry`, whenever the per-layer path is): the layer's input holds the clients'
batches concatenated client-major (``N = K * B`` examples), its parameters are stacked along a leading client
axis, and each rule returns what the layer's own ``forward`` returns, in the same shapes and layouts.

* **RNN, LSTM, GRU** (any number of layers, either ``batch_first``, bidirectional, with or without biases and an
  initial state). Per layer and direction, the input projections of all time steps are one batched product over
  the clients (``[K, T*B, in] @ W_ih[k]^T``), then each time step one more (``h [K, B, H] @ W_hh[k]^T``) and
  the gates as torch defines them (LSTM: i, f, g, o; GRU: r, z, n with ``n = tanh(W_in x + b_in + r * (W_hn h
  + b_hn))``). A layer direction's recurrence is one autograd node with its backward (back-propagation through
  time) written out, the recurrent weights' gradient one batched product over all steps: on a CPU, 10-20% faster
  for LSTM and RNN layers than letting autograd record every step's operations, as fast for GRU layers, and
  10-30% less memory.
* **MultiheadAttention.** The query, key, value and output projections are per client (batched products); the
  attention itself holds no parameters and acts on each example alone, so it runs once on the stacked batch:
  ``F.scaled_dot_product_attention`` as in torch, or the explicit softmax when the attention weights are asked
  for. Masks are handled as ``F.multi_head_attention_forward`` handles them (a 3-D ``attn_mask`` holds one mask
  per example, in the stacked batch's order since the model builds it for the stacked batch). The rule owns the
  ``out_proj`` child, whose parameters torch's forward reads directly. ``nn.TransformerEncoderLayer`` and
  ``nn.TransformerEncoder`` need nothing more: their other children are Linear, LayerNorm and Dropout.

Dropout inside the layers, in training mode, draws each client's masks from its own generator
(:class:`~fedsim.training.layers.DropoutMasks`), as ``nn.Dropout`` does: between a recurrent layer's layers (a mask
``[B, T, features]`` per client on every layer's output but the last, as torch applies it) and on attention weights
(``[B, heads, L, S]`` after the softmax, as torch applies it; the explicit softmax is then used), which includes every
``nn.TransformerEncoderLayer`` built with ``dropout > 0``. The per-client loop runs these layers through the same
rules, one client at a time (``alone``), so both paths draw the same masks.

Refused with :class:`~fedsim.training.layers.Unsupported`, naming the layer and why (``auto`` then tries vmap):
input these rules do not take (a ``PackedSequence``, an unbatched sequence) and options they do not implement (LSTM's
``proj_size``; attention's ``add_bias_kv`` and ``add_zero_attn``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .layer_registry import Unsupported, register, stacked_linear

_UNBATCHED = "without a batch dimension, the stacked batch's clients cannot be told apart"


# --------------------------------------------------------------------------- recurrences
# Each recurrence below runs one layer direction of K clients. Its input projections, states and gradients are
# client-major ``[K, T, B, ...]`` (time steps in time order, whichever the direction), as the batched products over
# all steps need them; what only the steps read (the gates) is time-major ``[T, K, B, ...]``, so that each step's
# product writes a contiguous block. Per-step results and gradients are allocated once and filled a step at a
# time: on a CPU, large temporaries cost more than the arithmetic (fresh memory is page-faulted in).
def _steps(length: int, reverse: bool) -> range:
    """The time steps in the order a direction processes them."""
    return range(length - 1, -1, -1) if reverse else range(length)


def _tanh(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``tanh(x)`` into ``out`` (may be ``x``). On a CPU as ``2 * sigmoid(2x) - 1``, within 2e-7 of ``torch.tanh``
    in float32: torch's CPU ``tanh`` measured several times slower than its ``sigmoid`` (x86, AVX-512), and this
    makes an LSTM layer 10-15% faster."""
    if x.device.type != "cpu":
        return torch.tanh(x, out=out)
    return torch.mul(x, 2.0, out=out).sigmoid_().mul_(2.0).sub_(1.0)


def _recurrent_weight_grad(
    dpre: torch.Tensor, states: torch.Tensor, h0: torch.Tensor, reverse: bool
) -> torch.Tensor:
    """``sum_t dpre[:, t]^T @ h_in[t]``, the gradient of ``W_hh [K, G, H]`` from the recurrent pre-activations'
    gradients ``dpre [K, T, B, G]``, where step t's incoming state ``h_in[t]`` is ``h0`` for the first step
    processed and the previous step's state otherwise: two batched products, over all the steps at once."""
    k, steps, b, g = dpre.shape
    first = steps - 1 if reverse else 0
    rest, incoming = (
        (slice(0, steps - 1), slice(1, steps)) if reverse else (slice(1, steps), slice(0, steps - 1))
    )
    gw = torch.bmm(dpre[:, first].transpose(1, 2), h0)
    if steps > 1:
        flat = dpre[:, rest].reshape(k, (steps - 1) * b, g)
        gw.baddbmm_(flat.transpose(1, 2), states[:, incoming].reshape(k, (steps - 1) * b, -1))
    return gw


class _RNNRecurrence(torch.autograd.Function):
    """``h_t = act(gi_t + h_{t-1} @ W_hh[k]^T)``: ``gi [K, T, B, H]`` (the input projections with both biases),
    ``w_hh [K, H, H]``, ``h0 [K, B, H]`` -> the states ``[K, T, B, H]``."""

    @staticmethod
    def forward(
        ctx: Any, gi: torch.Tensor, w_hh: torch.Tensor, h0: torch.Tensor, reverse: bool, relu: bool
    ) -> torch.Tensor:
        wt = w_hh.transpose(1, 2).contiguous()  # [K, H, G]: faster in the products than a transposed view
        states = torch.empty_like(gi)
        h = h0
        for t in _steps(gi.shape[1], reverse):
            pre = torch.baddbmm(gi[:, t], h, wt)
            h = torch.clamp_min(pre, 0.0, out=states[:, t]) if relu else _tanh(pre, out=states[:, t])
        ctx.save_for_backward(states, w_hh, h0)
        ctx.reverse, ctx.relu = reverse, relu
        return states

    @staticmethod
    def backward(ctx: Any, dstates: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        states, w_hh, h0 = ctx.saved_tensors
        dpre = torch.empty_like(states)
        dh = torch.zeros_like(h0)
        for t in reversed(_steps(states.shape[1], ctx.reverse)):  # the steps in the reverse of their order
            dh += dstates[:, t]
            h = states[:, t]
            d = (
                torch.mul(dh, h > 0, out=dpre[:, t])
                if ctx.relu
                else torch.mul(dh, 1.0 - h * h, out=dpre[:, t])
            )
            dh = torch.bmm(d, w_hh)
        needs = ctx.needs_input_grad
        gw = _recurrent_weight_grad(dpre, states, h0, ctx.reverse) if needs[1] else None
        return dpre, gw, dh if needs[2] else None, None, None


class _LSTMRecurrence(torch.autograd.Function):
    """``gi [K, T, B, 4H]`` (the input projections with both biases; gates i, f, g, o), ``w_hh [K, 4H, H]``,
    ``h0``, ``c0 [K, B, H]`` -> the hidden states ``[K, T, B, H]`` and the last cell state ``[K, B, H]``."""

    @staticmethod
    def forward(
        ctx: Any, gi: torch.Tensor, w_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, reverse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hid = h0.shape[-1]
        wt = w_hh.transpose(1, 2).contiguous()
        k, steps, b, _ = gi.shape
        gates = gi.new_empty(steps, k, b, 4 * hid)  # after their activations
        cells, tanh_cells = gi.new_empty(steps, k, b, hid), gi.new_empty(steps, k, b, hid)
        states = gi.new_empty(k, steps, b, hid)
        h, c = h0, c0
        for t in _steps(steps, reverse):
            a = torch.baddbmm(gi[:, t], h, wt, out=gates[t])
            a[..., : 2 * hid].sigmoid_()
            _tanh(a[..., 2 * hid : 3 * hid], out=a[..., 2 * hid : 3 * hid])
            a[..., 3 * hid :].sigmoid_()
            i, f, g, o = a.chunk(4, -1)
            c = torch.addcmul(f * c, i, g, out=cells[t])
            h = torch.mul(o, _tanh(c, out=tanh_cells[t]), out=states[:, t])
        ctx.save_for_backward(gates, cells, tanh_cells, states, w_hh, h0, c0)
        ctx.reverse = reverse
        return states, c.clone()

    @staticmethod
    def backward(ctx: Any, dstates: torch.Tensor, dc_last: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gates, cells, tanh_cells, states, w_hh, h0, c0 = ctx.saved_tensors
        reverse = ctx.reverse
        dpre = torch.empty_like(gates.transpose(0, 1), memory_format=torch.contiguous_format)
        dh = torch.zeros_like(h0)
        dc = dc_last.clone()
        order = _steps(cells.shape[0], reverse)
        for j in range(len(order) - 1, -1, -1):
            t = order[j]
            i, f, g, o = gates[t].chunk(4, -1)
            tanh_c = tanh_cells[t]
            c_in = c0 if j == 0 else cells[order[j - 1]]
            dh += dstates[:, t]
            dc.addcmul_(dh * o, 1.0 - tanh_c * tanh_c)
            d = dpre[:, t]
            di, df, dg, do = d.chunk(4, -1)
            torch.mul(dc, g, out=di).mul_(i - i * i)
            torch.mul(dc, c_in, out=df).mul_(f - f * f)
            torch.mul(dc, i, out=dg).mul_(1.0 - g * g)
            torch.mul(dh, tanh_c, out=do).mul_(o - o * o)
            dc.mul_(f)
            dh = torch.bmm(d, w_hh)
        needs = ctx.needs_input_grad
        gw = _recurrent_weight_grad(dpre, states, h0, reverse) if needs[1] else None
        return dpre, gw, dh if needs[2] else None, dc if needs[3] else None, None


class _GRURecurrence(torch.autograd.Function):
    """``gi [K, T, B, 3H]`` (the input projections with ``b_ih``; gates r, z, n), ``w_hh [K, 3H, H]``, ``b_hh
    [K, 3H]`` or ``None``, ``h0 [K, B, H]`` -> the states ``[K, T, B, H]``."""

    @staticmethod
    def forward(
        ctx: Any,
        gi: torch.Tensor,
        w_hh: torch.Tensor,
        b_hh: torch.Tensor | None,
        h0: torch.Tensor,
        reverse: bool,
    ) -> torch.Tensor:
        hid = h0.shape[-1]
        wt = w_hh.transpose(1, 2).contiguous()
        k, steps, b, _ = gi.shape
        hidden = gi.new_empty(steps, k, b, 3 * hid)  # W_hh h + b_hh
        rz, n_all = gi.new_empty(steps, k, b, 2 * hid), gi.new_empty(steps, k, b, hid)
        states = gi.new_empty(k, steps, b, hid)
        h = h0
        for t in _steps(steps, reverse):
            gh = hidden[t]
            torch.bmm(h, wt, out=gh) if b_hh is None else torch.baddbmm(b_hh.unsqueeze(1), h, wt, out=gh)
            x = gi[:, t]
            r, z = torch.add(x[..., : 2 * hid], gh[..., : 2 * hid], out=rz[t]).sigmoid_().chunk(2, -1)
            n = torch.addcmul(x[..., 2 * hid :], r, gh[..., 2 * hid :], out=n_all[t])
            h = torch.lerp(_tanh(n, out=n), h, z, out=states[:, t])  # (1 - z) * n + z * h
        ctx.save_for_backward(rz, n_all, hidden, states, w_hh, h0)
        ctx.reverse = reverse
        return states

    @staticmethod
    def backward(ctx: Any, dstates: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rz, n_all, hidden, states, w_hh, h0 = ctx.saved_tensors
        reverse, hid = ctx.reverse, h0.shape[-1]
        k, steps, b, _ = states.shape
        dgh = states.new_empty(k, steps, b, 3 * hid)  # of W_hh h + b_hh
        dgi_n = torch.empty_like(states)  # of gi's n part (its r and z parts have dgh's)
        dh = torch.zeros_like(h0)
        order = _steps(steps, reverse)
        for j in range(len(order) - 1, -1, -1):
            t = order[j]
            r, z = rz[t].chunk(2, -1)
            n = n_all[t]
            h_in = h0 if j == 0 else states[:, order[j - 1]]
            dh += dstates[:, t]
            d_r, d_z, d_hn = dgh[:, t].chunk(3, -1)
            dn = torch.mul(dh, 1.0 - z, out=dgi_n[:, t]).mul_(1.0 - n * n)
            torch.mul(dn, hidden[t, ..., 2 * hid :], out=d_r).mul_(r - r * r)
            torch.mul(dh, h_in - n, out=d_z).mul_(z - z * z)
            torch.mul(dn, r, out=d_hn)
            dh = torch.baddbmm(dh * z, dgh[:, t], w_hh)
        needs = ctx.needs_input_grad
        gi = torch.cat([dgh[..., : 2 * hid], dgi_n], -1) if needs[0] else None
        gw = _recurrent_weight_grad(dgh, states, h0, reverse) if needs[1] else None
        gb = dgh.sum((1, 2)) if needs[2] else None
        return gi, gw, gb, dh if needs[3] else None, None


def _recurrent_check(m: nn.RNNBase) -> str | None:
    if m.proj_size > 0:
        return "with proj_size > 0 (an LSTM with projections) has no per-layer rule"
    return None


def _recurrent_draws(m: nn.RNNBase) -> bool:
    """Torch applies a recurrent layer's ``dropout`` to the outputs of all its layers but the last."""
    return m.dropout > 0 and m.num_layers > 1


def _recurrent_alone(
    m: nn.RNNBase, p: dict[str, torch.Tensor], k: int, masks: Any, input: torch.Tensor, hx: Any = None
) -> tuple[torch.Tensor, Any]:
    """The layer for one client, with its own parameters (read when called: ``functional_call`` may have swapped
    them) and the client's dropout masks between its layers: the per-client loop's forward of a recurrent layer
    with dropout, drawing the masks the stacked rule draws for that client."""
    if isinstance(input, PackedSequence) or input.dim() == 2 or _recurrent_check(m) is not None:
        return type(m).forward(
            m, input, hx
        )  # what the rule does not take: torch's own layer, and its dropout
    own = {name: getattr(m, name).unsqueeze(0) for name in m._flat_weights_names}
    return _recurrent(m, own, 1, masks, input, hx)


@register(nn.RNN, nn.LSTM, nn.GRU, check=_recurrent_check, draws=_recurrent_draws, alone=_recurrent_alone)
def _recurrent(
    m: nn.RNNBase,
    p: dict[str, torch.Tensor],
    k: int,
    masks: Any,
    input: torch.Tensor,
    hx: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, Any]:
    """``nn.RNN``/``nn.LSTM``/``nn.GRU`` on the stacked batch: ``(output, h_n)`` or ``(output, (h_n, c_n))``, as
    torch returns them for batched input."""
    what = f"nn.{type(m).__name__}"
    if isinstance(input, PackedSequence):
        raise Unsupported(f"{what} on a PackedSequence has no per-layer rule")
    reason = _recurrent_check(m)  # the layer may have been put in training mode since the plan was made
    if reason is not None:
        raise Unsupported(f"{what} {reason}")
    if input.dim() == 2:
        raise Unsupported(f"{what} on an unbatched (2-D) sequence has no per-layer rule: {_UNBATCHED}")
    lstm = isinstance(m, nn.LSTM)
    if hx is None:
        m.check_input(input, None)
    else:
        m.check_forward_args(input, hx, None)  # type: ignore[arg-type]  # torch's own shape checks
    dirs, layers, hid = 2 if m.bidirectional else 1, m.num_layers, m.hidden_size
    n, steps = (input.shape[0], input.shape[1]) if m.batch_first else (input.shape[1], input.shape[0])
    b = n // k
    # [K, T, B, features]: each client's time steps in one block, for the input projections' batched product
    x = (
        input.unflatten(0, (k, b)).transpose(1, 2)
        if m.batch_first
        else input.unflatten(1, (k, b)).transpose(0, 1)
    )
    x = x.contiguous()
    if hx is None:
        zeros = input.new_zeros(layers * dirs, k, b, hid)
        h0s = c0s = zeros.unbind(0)
    else:
        h0, c0 = hx if lstm else (hx, None)
        h0s = h0.reshape(layers * dirs, k, b, hid).unbind(0)
        c0s = None if c0 is None else c0.reshape(layers * dirs, k, b, hid).unbind(0)
    h_n, c_n = [], []
    for layer in range(layers):
        outs = []
        flat = x.reshape(k, steps * b, x.shape[-1])
        for d in range(dirs):
            sfx = f"_l{layer}_reverse" if d else f"_l{layer}"
            w_ih, w_hh = p[f"weight_ih{sfx}"], p[f"weight_hh{sfx}"]
            b_ih, b_hh = p.get(f"bias_ih{sfx}"), p.get(f"bias_hh{sfx}")
            j, reverse = layer * dirs + d, bool(d)
            if isinstance(m, nn.GRU):
                gi = stacked_linear(flat, w_ih, b_ih).view(k, steps, b, -1)
                hs = _GRURecurrence.apply(gi, w_hh, b_hh, h0s[j], reverse)
            else:
                bias = None if b_ih is None or b_hh is None else b_ih + b_hh
                gi = stacked_linear(flat, w_ih, bias).view(k, steps, b, -1)
                if lstm:
                    hs, c_last = _LSTMRecurrence.apply(gi, w_hh, h0s[j], c0s[j], reverse)
                    c_n.append(c_last)
                else:
                    hs = _RNNRecurrence.apply(gi, w_hh, h0s[j], reverse, m.nonlinearity == "relu")
            outs.append(hs)
            h_n.append(hs[:, 0] if reverse else hs[:, -1])
        x = outs[0] if dirs == 1 else torch.cat(outs, -1)
        # as torch: dropout on every layer's output but the last
        if m.training and m.dropout > 0 and layer < layers - 1:
            if masks is None:
                raise RuntimeError(f"{what} with dropout ran in training mode without per-client masks")
            # each client's mask for its examples [B, T, features], as the per-client loop draws it
            drop = masks.draw((n, steps, x.shape[-1]), k, float(m.dropout), x)
            x = x * drop.view(k, b, steps, -1).transpose(1, 2)
    out = (
        x.transpose(1, 2).reshape(n, steps, -1) if m.batch_first else x.transpose(0, 1).reshape(steps, n, -1)
    )
    h = torch.stack(h_n).view(layers * dirs, n, hid)
    return out, ((h, torch.stack(c_n).view(layers * dirs, n, hid)) if lstm else h)


# --------------------------------------------------------------------------- attention
def _additive(mask: torch.Tensor | None, name: str, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: not attended) as the float mask torch adds to the attention logits."""
    if mask is None or torch.is_floating_point(mask):
        return mask
    if mask.dtype != torch.bool:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


def _attention_check(m: nn.MultiheadAttention) -> str | None:
    if m.bias_k is not None:
        return "with add_bias_kv=True has no per-layer rule"
    if m.add_zero_attn:
        return "with add_zero_attn=True has no per-layer rule"
    return None


def _own_parameters(m: nn.Module) -> dict[str, torch.Tensor]:
    """``m``'s parameters and its descendants', as ``[1, *shape]``, read when called (``functional_call`` may have
    swapped them): one client's stacked parameters."""
    out = {}
    for name, _ in m.named_parameters():
        owner = m
        *path, last = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        out[name] = getattr(owner, last).unsqueeze(0)
    return out


def _attention_alone(
    m: nn.MultiheadAttention, p: dict[str, torch.Tensor], k: int, masks: Any, *args: Any, **kw: Any
):
    """The layer for one client with its own parameters and the client's masks on its attention weights: the
    per-client loop's forward of an attention layer with dropout, drawing the masks the stacked rule draws."""
    query = args[0] if args else kw.get("query")
    if not isinstance(query, torch.Tensor) or query.dim() != 3 or _attention_check(m) is not None:
        return type(m).forward(
            m, *args, **kw
        )  # what the rule does not take: torch's own layer, and its dropout
    return _multihead_attention(m, _own_parameters(m), 1, masks, *args, **kw)


@register(
    nn.MultiheadAttention,
    owns_children=True,
    check=_attention_check,
    draws=lambda m: m.dropout > 0,
    alone=_attention_alone,
)
def _multihead_attention(
    m: nn.MultiheadAttention,
    p: dict[str, torch.Tensor],
    k: int,
    masks: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    need_weights: bool = True,
    attn_mask: torch.Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``nn.MultiheadAttention`` on the stacked batch: ``(output, weights or None)`` as torch's forward returns
    them for batched input. A 3-D ``attn_mask`` ``[N * heads, L, S]`` holds one mask per example and head, its
    examples in the stacked batch's (client-major) order, as the model built it for that batch."""
    reason = _attention_check(m)  # the layer may have been put in training mode since the plan was made
    if reason is not None:
        raise Unsupported(f"nn.MultiheadAttention {reason}")
    if query.dim() == 2:
        raise Unsupported(
            f"nn.MultiheadAttention on unbatched (2-D) input has no per-layer rule: {_UNBATCHED}"
        )
    if query.dim() != 3:
        raise AssertionError(
            f"query should be unbatched 2D or batched 3D tensor but received {query.dim()}-D"
        )
    self_attention = query is key and key is value
    if m.batch_first:
        q_in, k_in, v_in = query, key, value
    else:
        q_in, k_in, v_in = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    n, tgt, e = q_in.shape
    src, b, heads, hd = k_in.shape[1], n // k, m.num_heads, m.head_dim

    kpm = _additive(key_padding_mask, "key_padding_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError(
            "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
            "`generate_square_subsequent_mask` to create this mask."
        )
    # as torch: the causal hint goes to scaled_dot_product_attention only with no padding mask and no weights
    causal = is_causal and kpm is None and not need_weights
    mask = None if causal else _additive(attn_mask, "attn_mask", query.dtype)
    if mask is not None:
        if mask.dim() == 2 and mask.shape == (tgt, src):
            mask = mask.view(1, 1, tgt, src)
        elif mask.dim() == 3 and mask.shape == (n * heads, tgt, src):
            mask = mask.view(n, heads, tgt, src)
        else:
            raise RuntimeError(
                f"attn_mask of shape {tuple(mask.shape)}: expected ({tgt}, {src}) or ({n * heads}, {tgt}, {src})"
            )
    if kpm is not None:
        if kpm.shape != (n, src):
            raise AssertionError(
                f"expecting key_padding_mask shape of {(n, src)}, but got {tuple(kpm.shape)}"
            )
        kpm = kpm.view(n, 1, 1, src)
        mask = kpm if mask is None else mask + kpm

    bias = p.get("in_proj_bias")
    bq, bk, bv = (None, None, None) if bias is None else bias.chunk(3, -1)
    packed = p.get("in_proj_weight")  # [K, 3E, E] when query, key and value have the same width
    if packed is not None and self_attention:  # one product for the three projections
        q, keys, values = stacked_linear(q_in.reshape(k, b * tgt, e), packed, bias).chunk(3, -1)
    else:
        wq, wk, wv = (
            packed.chunk(3, 1)
            if packed is not None
            else (p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"])
        )
        q = stacked_linear(q_in.reshape(k, b * tgt, e), wq, bq)
        keys = stacked_linear(k_in.reshape(k, b * src, -1), wk, bk)
        values = stacked_linear(v_in.reshape(k, b * src, -1), wv, bv)
    q = q.reshape(n, tgt, heads, hd).transpose(1, 2)  # [N, heads, L, head_dim]
    keys = keys.reshape(n, src, heads, hd).transpose(1, 2)
    values = values.reshape(n, src, heads, hd).transpose(1, 2)

    weights = None
    dropout = m.dropout if m.training else 0.0
    if need_weights or dropout > 0:
        logits = torch.matmul(q * hd**-0.5, keys.transpose(-2, -1))
        if causal:
            logits = logits.masked_fill(
                torch.ones(tgt, src, dtype=torch.bool, device=q.device).triu(1), float("-inf")
            )
        if mask is not None:
            logits = logits + mask
        weights = torch.softmax(logits, dim=-1)
        if dropout > 0:  # as torch, on the attention weights (those returned too): each client's masks
            if masks is None:
                raise RuntimeError(
                    "nn.MultiheadAttention with dropout ran in training mode without per-client masks"
                )
            weights = weights * masks.draw((n, heads, tgt, src), k, float(dropout), weights)
        attn = torch.matmul(weights, values)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not need_weights:
            weights = None
    else:
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal)
    attn = attn.transpose(1, 2).reshape(k, b * tgt, e)
    out = stacked_linear(attn, p["out_proj.weight"], p.get("out_proj.bias")).view(n, tgt, e)
    return (out if m.batch_first else out.transpose(0, 1).contiguous()), weights
