"""Per-layer rules for the sequence layers (fedsim.training.sequence_layers): nn.RNN, nn.LSTM, nn.GRU and
nn.MultiheadAttention, hence nn.TransformerEncoderLayer and nn.TransformerEncoder.

Each rule must return exactly what the layer returns, client by client (outputs, final states, attention weights,
and every gradient); models built on the layers must take the per-layer path on real token ids and train each
client as the per-client loop does; what the rules do not implement is refused by name, and training falls back."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from token_models import VOCAB, token_windows
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fedsim.data import build_federated_data
from fedsim.factories import cross_entropy
from fedsim.models import build_model
from fedsim.training.layers import (
    RULES,
    DropoutMasks,
    StackedModel,
    client_dropout,
    dropout_layers,
    plan,
)
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights
from fedsim.training.vectorized import choose_path

CPU = torch.device("cpu")
_WINDOWS = token_windows(4, seed=0)
#: real examples: windows of T token ids in [0, VOCAB) (0 pads the start of some), 2 classes
EXAMPLES = (torch.from_numpy(_WINDOWS["x"]), torch.from_numpy(_WINDOWS["y"]))
T = EXAMPLES[0].shape[1]

pytestmark = pytest.mark.filterwarnings(
    "ignore:dropout option adds dropout after all but last recurrent layer",
    "ignore:enable_nested_tensor is True",
    "ignore:There is a performance drop because we have not yet implemented the batching rule",
    "ignore:Support for mismatched",  # a float causal mask with a boolean padding mask: torch accepts both
    "ignore:LSTM with projections is not supported with oneDNN",
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread: on these tiny tensors a thread pool only spins against the other processes of a shared
    machine (10x slower here; see tests/readme_blocks.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def every_position(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A per-example loss for per-token logits ``[n, T, classes]`` and labels ``[n]``: the mean over the positions
    of each position's cross-entropy against the example's label."""
    labels = targets[:, None].expand(-1, outputs.shape[1])
    return F.cross_entropy(outputs.transpose(1, 2), labels, reduction="none").mean(1)


# --------------------------------------------------------------------------- the rules against torch
class Probe(nn.Module):
    """``call(layer, x)``: a layer run on inputs packed in ``x [n, ...]``, its outputs flattened per example."""

    def __init__(self, layer: nn.Module, call) -> None:
        super().__init__()
        self.layer, self.call = layer, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(self.layer, x)


def assert_rule_matches_torch(layer: nn.Module, call, x: torch.Tensor) -> None:
    """``Probe(layer, call)`` for K clients at once with the per-layer rules (``x [K, B, ...]``, client k's
    parameters perturbed differently) equals, for every client, its parameters applied by torch to its own inputs:
    the outputs, and the gradients of a random function of them for every parameter and for the inputs."""
    model = Probe(layer, call)
    k = x.shape[0]
    gen = torch.Generator().manual_seed(1)
    params = {
        n: (p.detach() + 0.1 * torch.randn(k, *p.shape, generator=gen)).requires_grad_(True)
        for n, p in model.named_parameters()
    }
    x = x.clone().requires_grad_(True)
    out = StackedModel(model).forward(params, x, None)
    weight = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, [x, *params.values()], weight)
    for j in range(k):
        own = {n: v[j].detach().requires_grad_(True) for n, v in params.items()}
        xj = x[j].detach().requires_grad_(True)
        ref = functional_call(model, own, (xj,))
        torch.testing.assert_close(out[j], ref, rtol=1e-4, atol=1e-5, equal_nan=True)
        ref_grads = torch.autograd.grad(ref, [xj, *own.values()], weight[j])
        for name, got, want in zip(["input", *own], grads, ref_grads, strict=True):
            torch.testing.assert_close(got[j], want, rtol=1e-4, atol=1e-5, equal_nan=True, msg=name)


def run_recurrent(layer: nn.RNNBase, x: torch.Tensor, initial_state: bool) -> torch.Tensor:
    """``x [n, T, input_size + hidden_size]``: the sequence, and (``initial_state``) h0 from the first steps' last
    features; returns the output and the final states, batch first, flattened."""
    seq = x[..., : layer.input_size]
    if not layer.batch_first:
        seq = seq.transpose(0, 1)
    hx = None
    if initial_state:
        states = layer.num_layers * (2 if layer.bidirectional else 1)
        h0 = x[:, :states, layer.input_size :].transpose(0, 1)  # [layers * directions, n, hidden]
        hx = (h0, torch.tanh(h0)) if isinstance(layer, nn.LSTM) else h0
    out, final = layer(seq, hx)
    if not layer.batch_first:
        assert out.is_contiguous()  # as torch's: a model may .view() it
        out = out.transpose(0, 1)
    finals = final if isinstance(final, tuple) else (final,)
    return torch.cat([out.flatten(1), *(f.transpose(0, 1).flatten(1) for f in finals)], 1)


RECURRENT = {
    "RNN-tanh": (nn.RNN, {"nonlinearity": "tanh"}),
    "RNN-relu": (nn.RNN, {"nonlinearity": "relu"}),
    "LSTM": (nn.LSTM, {}),
    "GRU": (nn.GRU, {}),
}


@pytest.mark.parametrize("initial_state", [False, True], ids=["", "h0"])
@pytest.mark.parametrize("bias", [True, False], ids=["", "no-bias"])
@pytest.mark.parametrize("num_layers", [1, 2], ids=["1-layer", "2-layers"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["", "bidirectional"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "time-first"])
@pytest.mark.parametrize("kind", RECURRENT)
def test_recurrent_rules_return_what_torch_returns(
    kind, batch_first, bidirectional, bias, num_layers, initial_state
):
    cls, options = RECURRENT[kind]
    torch.manual_seed(0)
    layer = cls(3, 4, num_layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional, **options)
    x = torch.randn(3, 2, 5, 3 + 4)  # 3 clients, 2 examples each, 5 steps
    assert_rule_matches_torch(layer, lambda m, v: run_recurrent(m, v, initial_state), x)


ATTENTION_MASKS = [
    "none",
    "padding",
    "padding-float",
    "causal",
    "causal-bool+padding",
    "is-causal",
    "is-causal+padding",
    "per-example",
]


def run_attention(
    layer: nn.MultiheadAttention, x: torch.Tensor, inputs: str, masks: str, weights: str
) -> torch.Tensor:
    """``x [n, L, ...]``: query, key and value features (``inputs``: one tensor for the three, ``"self"``; a
    query apart, ``"cross"``; or key and value of their own widths, ``"kdim"``), then the features the masks are
    made of (``masks``: one of :data:`ATTENTION_MASKS`); returns the output and the attention weights (``weights``:
    ``"none"``, ``"mean"`` over the heads or ``"per-head"``), batch first, flattened."""
    e, length = layer.embed_dim, x.shape[1]
    q = x[..., :e]
    key = value = q if inputs == "self" else x[..., e : 2 * e]
    if inputs == "kdim":
        key, value = x[..., e : e + layer.kdim], x[..., e + layer.kdim : e + layer.kdim + layer.vdim]
    if not layer.batch_first:
        q, key, value = (t.transpose(0, 1) for t in (q, key, value))
        if inputs != "kdim":  # the same tensor for key and value (and query), as given
            key = value = q if inputs == "self" else key
    seeds = x[..., -(length + 1) :].detach()
    kw: dict = {}
    if masks.endswith("padding"):  # position 0 always attended: no query is left without a key
        kw["key_padding_mask"] = (seeds[..., 0] > 0.5) & (torch.arange(length) > 0)
    elif masks == "padding-float":
        kw["key_padding_mask"] = seeds[..., 0]
    if masks == "causal-bool+padding":
        kw["attn_mask"] = torch.ones(length, length, dtype=torch.bool).triu(1)
    elif "causal" in masks:
        kw["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(length)
        kw["is_causal"] = masks.startswith("is-causal")
    elif masks == "per-example":  # [n * heads, L, L], example-major, for the (stacked) batch it is given
        kw["attn_mask"] = seeds[..., 1:].repeat_interleave(layer.num_heads, 0)
    need_weights, average = weights != "none", weights == "mean"
    out, w = layer(q, key, value, need_weights=need_weights, average_attn_weights=average, **kw)
    if not layer.batch_first:
        assert out.is_contiguous()  # as torch's
        out = out.transpose(0, 1)
    return torch.cat([out.flatten(1), *([] if w is None else [w.flatten(1)])], 1)


@pytest.mark.parametrize("weights", ["none", "mean", "per-head"])
@pytest.mark.parametrize("masks", ATTENTION_MASKS)
@pytest.mark.parametrize("inputs", ["self", "cross", "kdim"])
@pytest.mark.parametrize("bias", [True, False], ids=["", "no-bias"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "time-first"])
def test_attention_rule_returns_what_torch_returns(batch_first, bias, inputs, masks, weights):
    torch.manual_seed(0)
    kdim = {"kdim": 3, "vdim": 5} if inputs == "kdim" else {}
    layer = nn.MultiheadAttention(8, 2, bias=bias, batch_first=batch_first, **kdim)
    length = 4
    x = torch.randn(3, 2, length, 8 + 8 + length + 1)  # 3 clients, 2 examples each
    assert_rule_matches_torch(layer, lambda m, v: run_attention(m, v, inputs, masks, weights), x)


def test_attention_owns_its_output_projection():
    model = nn.Sequential(nn.Embedding(VOCAB, 8), nn.MultiheadAttention(8, 2, batch_first=True))
    bound = plan(model)
    assert [type(b.module) for b in bound] == [nn.Embedding, nn.MultiheadAttention]  # out_proj is not visited
    assert bound[1].names == {
        "in_proj_weight": "1.in_proj_weight",
        "in_proj_bias": "1.in_proj_bias",
        "out_proj.weight": "1.out_proj.weight",
        "out_proj.bias": "1.out_proj.bias",
    }


# --------------------------------------------------------------------------- models on real token ids
class Recurrent(nn.Module):
    """Embedding -> a recurrent layer (optionally from an initial state computed from the first token) -> logits
    from the last step's output and the final states ``[n, 2]``, or from every step's output ``[n, T, 2]``."""

    def __init__(self, layer: nn.RNNBase, initial_state: bool, per_token: bool, dim: int = 6) -> None:
        super().__init__()
        self.embed, self.layer, self.per_token = nn.Embedding(VOCAB, dim), layer, per_token
        self.states = layer.num_layers * (2 if layer.bidirectional else 1)
        self.init = nn.Linear(dim, self.states * layer.hidden_size) if initial_state else None
        width = layer.hidden_size * (2 if layer.bidirectional else 1)
        finals = 2 if isinstance(layer, nn.LSTM) else 1
        self.head = nn.Linear(width if per_token else width + finals * self.states * layer.hidden_size, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        hx = None
        if self.init is not None:
            h0 = torch.tanh(self.init(e[:, 0])).view(len(x), self.states, -1).transpose(0, 1)
            hx = (h0, 0.5 * h0) if isinstance(self.layer, nn.LSTM) else h0
        out, final = self.layer(e if self.layer.batch_first else e.transpose(0, 1), hx)
        out = out if self.layer.batch_first else out.transpose(0, 1)
        if self.per_token:
            return self.head(out)
        finals = final if isinstance(final, tuple) else (final,)
        return self.head(torch.cat([out[:, -1], *(f.transpose(0, 1).flatten(1) for f in finals)], 1))


def masked_keys(x: torch.Tensor) -> torch.Tensor:
    """A key padding mask for token ids ``[n, T]``: the low ids (a third of the vocabulary, the padding id among
    them) are not attended, except at position 0, so that no query is left without a key, causal or not."""
    return (x < VOCAB // 3) & (torch.arange(x.shape[1]) > 0)


class Attention(nn.Module):
    """Embedding -> self-attention with :func:`masked_keys` (and, ``causal``, a causal mask) -> logits from the
    last position ``[n, 2]`` (with the averaged attention weights, ``need_weights``) or every position."""

    def __init__(self, batch_first: bool, need_weights: bool, causal: bool, per_token: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.need_weights, self.causal, self.per_token = need_weights, causal, per_token
        self.head = nn.Linear(8 + (T if need_weights and not per_token else 0), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        e = e if self.attn.batch_first else e.transpose(0, 1)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        out, w = self.attn(
            e, e, e, key_padding_mask=masked_keys(x), need_weights=self.need_weights, attn_mask=mask
        )
        out = out if self.attn.batch_first else out.transpose(0, 1)
        if self.per_token:
            return self.head(out)
        return self.head(torch.cat([out[:, -1], *([] if w is None else [w[:, -1]])], 1))


class Encoder(nn.Module):
    """Embedding -> ``nn.TransformerEncoderLayer``(s) with :func:`masked_keys` (and, ``causal``, a causal mask)
    -> logits from the last position, or every position."""

    def __init__(self, stack: int, norm_first: bool, activation: str, causal: bool, per_token: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, 0.0, activation, batch_first=True, norm_first=norm_first)
        self.encoder = layer if stack == 0 else nn.TransformerEncoder(layer, stack, norm=nn.LayerNorm(8))
        self.causal, self.per_token = causal, per_token
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        kw = {"is_causal": True} if self.causal else {}
        h = self.encoder(self.embed(x), mask, masked_keys(x), **kw)
        return self.head(h if self.per_token else h[:, -1])


def assert_per_layer(model: nn.Module, per_token: bool = False) -> None:
    """``auto`` takes the per-layer path: its check on the real examples found each client's loss and gradients
    equal to the model run alone on that client's examples (one client's batch padded)."""
    loss = every_position if per_token else cross_entropy
    path = choose_path(model, (T,), 2, loss, CPU, examples=EXAMPLES)
    assert path.name == "per-layer", path.fallbacks


@pytest.mark.parametrize("per_token", [False, True], ids=["last", "per-token"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["", "bidirectional"])
@pytest.mark.parametrize("kind", RECURRENT)
def test_recurrent_models_take_the_per_layer_path(kind, bidirectional, per_token):
    cls, options = RECURRENT[kind]
    torch.manual_seed(0)
    batch_first = kind in ("RNN-tanh", "LSTM")
    layer = cls(6, 4, 1 + per_token, batch_first=batch_first, bidirectional=bidirectional, **options)
    assert_per_layer(Recurrent(layer, initial_state=bidirectional, per_token=per_token), per_token)


@pytest.mark.parametrize(
    ("batch_first", "need_weights", "causal", "per_token"),
    [
        (True, False, False, False),
        (False, True, False, False),
        (True, True, True, True),
        (False, False, True, True),
    ],
)
def test_attention_models_take_the_per_layer_path(batch_first, need_weights, causal, per_token):
    torch.manual_seed(0)
    assert_per_layer(Attention(batch_first, need_weights, causal, per_token), per_token)


@pytest.mark.parametrize(
    ("stack", "norm_first", "activation", "causal", "per_token"),
    [
        (0, False, "relu", False, False),
        (0, True, "gelu", True, True),
        (2, True, "relu", False, False),
        (2, False, "gelu", True, True),
    ],
)
def test_transformer_encoders_take_the_per_layer_path(stack, norm_first, activation, causal, per_token):
    torch.manual_seed(0)
    assert_per_layer(Encoder(stack, norm_first, activation, causal, per_token), per_token)


def test_the_shipped_sequence_models_take_the_per_layer_path():
    torch.manual_seed(0)
    assert_per_layer(build_model("lstm", (T,), 2, vocab=VOCAB, embedding_dim=4, hidden=6, layers=2))
    assert_per_layer(build_model("transformer", (T,), 2, vocab=VOCAB, d_model=8, heads=2, layers=2, ff=16))


def test_dropout_inside_a_layer_is_fine_where_torch_applies_none():
    torch.manual_seed(0)
    one_layer = nn.GRU(6, 4, num_layers=1, dropout=0.3, batch_first=True)  # torch drops only between layers
    assert_per_layer(Recurrent(one_layer, initial_state=False, per_token=False))
    assert not dropout_layers(one_layer)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "time-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["", "bidirectional"])
@pytest.mark.parametrize("kind", RECURRENT)
def test_dropout_between_recurrent_layers_is_torchs_with_each_clients_masks(kind, bidirectional, batch_first):
    """A 3-layer recurrent layer with ``dropout``, for one client with its masks, is torch's single layers run one
    after the other with that client's masks (drawn from its generator, [B, T, features]) on the outputs of all but
    the last: torch's dropout, with the masks fedsim gives each client; the stacked rule draws the same masks."""
    cls, options = RECURRENT[kind]
    torch.manual_seed(0)
    layer = cls(3, 4, 3, dropout=0.4, batch_first=batch_first, bidirectional=bidirectional, **options).train()
    assert dropout_layers(layer) == [layer]

    def run(m, v):  # v [n, T, 3], batch first whatever the layer's layout
        out = m(v if m.batch_first else v.transpose(0, 1))[0]
        return out if m.batch_first else out.transpose(0, 1)

    model = Probe(layer, run)
    x = torch.randn(2, 5, 3)
    with client_dropout(model, DropoutMasks.for_clients(7, 1, [3], CPU)):
        got = model(x)
    masks = DropoutMasks.for_clients(7, 1, [3], CPU)  # the same generator, drawn again by hand
    dirs = 2 if bidirectional else 1
    h = x
    for i in range(3):
        single = cls(h.shape[-1], 4, batch_first=True, bidirectional=bidirectional, **options)
        for name in single._flat_weights_names:
            setattr(single, name, nn.Parameter(getattr(layer, name.replace("_l0", f"_l{i}"))))
        h = single(h)[0]
        if i < 2:
            h = h * masks.draw((2, 5, 4 * dirs), 1, 0.4, h)
    torch.testing.assert_close(got, h, rtol=1e-5, atol=1e-6)
    # two clients stacked, both with client 3's generator and parameters: each gets exactly the loop's output
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in model.named_parameters()}
    stacked = StackedModel(model).forward(
        params, torch.stack([x, x]), DropoutMasks.for_clients(7, 1, [3, 3], CPU)
    )
    torch.testing.assert_close(stacked[0], got, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stacked[1], got, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- training: the per-client loop's updates
class Dropped(nn.Module):
    """Per-client nn.Dropout masks around a bidirectional two-layer LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.drop = nn.Embedding(VOCAB, 6), nn.Dropout(0.3)
        self.lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(x)))
        return self.head(self.drop(out[:, -1]))


class DroppedEncoder(nn.Module):
    """Two post-LN ``nn.TransformerEncoderLayer`` with torch's default dropout (0.1, also on the attention weights)
    and a boolean causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        return self.head(self.encoder(self.embed(x), causal, masked_keys(x))[:, -1])


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "weights"])
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_dropout_on_attention_weights_is_torchs_with_each_clients_masks(need_weights, causal):
    """Attention with ``dropout`` for one client with its masks is torch's attention with that client's masks
    (drawn from its generator, [heads, L, S] per example) on the softmax weights; the stacked rule draws the same."""
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True).train()
    length = 5
    mask = nn.Transformer.generate_square_subsequent_mask(length) if causal else None

    def run(m, v):
        out, w = m(v, v, v, attn_mask=mask, is_causal=causal, need_weights=need_weights)
        return out if w is None else torch.cat([out.flatten(1), w.flatten(1)], 1)

    model = Probe(layer, run)
    x = torch.randn(3, length, 8)
    with client_dropout(model, DropoutMasks.for_clients(5, 2, [1], CPU)):
        got = model(x)
    drop = DropoutMasks.for_clients(5, 2, [1], CPU).draw((3, 2, length, length), 1, 0.3, x)
    q, k, v = F.linear(x, layer.in_proj_weight, layer.in_proj_bias).chunk(3, -1)
    q, k, v = (z.view(3, length, 2, 4).transpose(1, 2) for z in (q, k, v))
    logits = q @ k.transpose(-2, -1) / 2.0
    if causal:
        logits = logits + mask
    weights = torch.softmax(logits, -1) * drop
    out = layer.out_proj((weights @ v).transpose(1, 2).reshape(3, length, 8))
    want = out if not need_weights else torch.cat([out.flatten(1), weights.mean(1).flatten(1)], 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in model.named_parameters()}
    stacked = StackedModel(model).forward(
        params, torch.stack([x, x]), DropoutMasks.for_clients(5, 2, [1, 1], CPU)
    )
    torch.testing.assert_close(stacked[0], got, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stacked[1], got, rtol=1e-5, atol=1e-6)


TRAINED = {
    "lstm-dropout": (lambda shape, classes: Dropped(), cross_entropy),
    "gru-initial-state-per-token": (
        lambda shape, classes: Recurrent(nn.GRU(6, 4, num_layers=2), initial_state=True, per_token=True),
        every_position,
    ),
    "encoder-default-dropout": (  # nn.Dropout children and the attention weights' dropout: the loop's masks
        lambda shape, classes: DroppedEncoder(),
        cross_entropy,
    ),
    "gru-dropout-between-layers": (  # each client's masks, drawn as the loop draws them
        lambda shape, classes: Recurrent(
            nn.GRU(6, 4, num_layers=2, dropout=0.3, batch_first=True), initial_state=False, per_token=True
        ),
        every_position,
    ),
    "encoder-padding-mask": (lambda shape, classes: Encoder(2, True, "gelu", False, False), cross_entropy),
}


@pytest.fixture(scope="module")
def windows():
    return build_federated_data(token_windows, num_clients=6, heldout_fraction=0.0, options={"per_client": 8})


@pytest.mark.parametrize("name", TRAINED)
def test_ragged_clients_train_as_in_the_per_client_loop(windows, name):
    """Clients of 4 to 15 windows in batches of 4 (padded last batches), two local epochs with momentum: the
    per-layer path's clipped updates and losses are the loop's."""
    factory, loss = TRAINED[name]
    cids = [int(c) for c in windows.train_clients]
    assert len(set(windows.num_examples_array(cids).tolist())) > 1
    settings = TrainSettings(
        model=factory,
        model_kwargs={},
        local_epochs=2,
        batch_size=4,
        lr=0.3,
        optimizer="momentum",
        momentum=0.5,
        seed=1,
        vectorize="per-layer",
        loss=loss,
    )
    fast = ClientTrainer(windows, settings, device="cpu")
    slow = ClientTrainer(windows, dataclasses.replace(settings, vectorize="loop"), device="cpu")
    w = initial_weights(settings, windows.input_shape, windows.num_classes)
    (a, ma), (b, mb) = (t.train(ClientPlan(2, cids, 1.0), w) for t in (fast, slow))
    assert {m["trainer"] for m in ma} == {"per-layer"}
    assert not [m for m in ma + mb if "failed" in m]
    np.testing.assert_allclose(a.total, b.total, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([m["update_norm"] for m in ma], [m["update_norm"] for m in mb], rtol=1e-4)
    np.testing.assert_allclose([m["train_loss"] for m in ma], [m["train_loss"] for m in mb], rtol=1e-4)


# --------------------------------------------------------------------------- refusals
def _packed(layer: nn.GRU, e: torch.Tensor) -> torch.Tensor:
    lengths = torch.full((len(e),), e.shape[1])
    out, _ = layer(pack_padded_sequence(e, lengths, batch_first=True, enforce_sorted=False))
    return pad_packed_sequence(out, batch_first=True)[0][:, -1]


class Head(nn.Module):
    """Embedding -> ``call(layer, embedded)`` -> Linear."""

    def __init__(self, layer: nn.Module, call, width: int) -> None:
        super().__init__()
        self.embed, self.layer, self.call, self.head = (
            nn.Embedding(VOCAB, 8),
            layer,
            call,
            nn.Linear(width, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.call(self.layer, self.embed(x)))


def _last(layer, e):
    return layer(e)[0][:, -1]


def _attend(layer, e):
    return layer(e, e, e)[0][:, -1]


REFUSED = {
    # name: (layer, call, width, the reason, the paths auto may take instead: vmap where its check passes)
    "lstm-projections": (
        lambda: nn.LSTM(8, 4, proj_size=2, batch_first=True),
        _last,
        2,
        "LSTM at 'layer' with proj_size > 0 (an LSTM with projections) has no per-layer rule",
        ("vmap",),
    ),
    "packed-sequence": (
        lambda: nn.GRU(8, 4, batch_first=True),
        _packed,
        4,
        "nn.GRU on a PackedSequence has no per-layer rule",
        ("vmap", "loop"),  # vmap cannot batch pack_padded_sequence
    ),
    "unbatched-sequence": (  # the model runs the layer on each example's sequence alone
        lambda: nn.RNN(8, 4),
        lambda m, e: torch.stack([m(s)[0][-1] for s in e]),
        4,
        "nn.RNN on an unbatched (2-D) sequence has no per-layer rule",
        ("vmap",),
    ),
    "attention-bias-kv": (
        lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True),
        _attend,
        8,
        "MultiheadAttention at 'layer' with add_bias_kv=True has no per-layer rule",
        ("vmap",),
    ),
    "attention-zero-attn": (
        lambda: nn.MultiheadAttention(8, 2, add_zero_attn=True, batch_first=True),
        _attend,
        8,
        "MultiheadAttention at 'layer' with add_zero_attn=True has no per-layer rule",
        ("vmap",),
    ),
    "attention-unbatched": (
        lambda: nn.MultiheadAttention(8, 2),
        lambda m, e: torch.stack([m(s, s, s)[0][-1] for s in e]),
        8,
        "nn.MultiheadAttention on unbatched (2-D) input has no per-layer rule",
        ("vmap",),
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_the_rules_do_not_implement_is_refused_by_name(name):
    make, call, width, reason, fallbacks = REFUSED[name]
    torch.manual_seed(0)
    model = Head(make(), call, width)
    path = choose_path(model, (T,), 2, cross_entropy, CPU, examples=EXAMPLES)
    assert path.name in fallbacks, path.fallbacks
    assert path.fallbacks[0].startswith(f"per-layer: {reason}"), path.fallbacks[0]
    with pytest.raises(
        ValueError, match=re.escape(f"engine.vectorize='per-layer' cannot train this model: {reason}")
    ):
        choose_path(model, (T,), 2, cross_entropy, CPU, "per-layer", examples=EXAMPLES)


# --------------------------------------------------------------------------- the check can fail
def _wrong(kind: type[nn.Module], forward):
    return dataclasses.replace(RULES[kind], forward=forward)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward, gradient off by 0.1%: a backward a little wrong."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.001


def test_a_wrong_rule_is_caught_and_training_falls_back(monkeypatch):
    """The check that admits a model to the per-layer path compares each client with the model run alone: a
    recurrent rule that mixes the clients' parameters, one whose backward is 0.1% off, and an attention rule that
    ignores the padding mask are each caught, and training falls back to vmap."""
    torch.manual_seed(0)
    model = Recurrent(nn.GRU(6, 4, batch_first=True), initial_state=False, per_token=False)
    gru, attention = RULES[nn.GRU].forward, RULES[nn.MultiheadAttention].forward

    def other_clients_bias(m, p, k, masks, x, hx=None):  # each client gets the next one's recurrent bias
        return gru(m, {**p, "bias_hh_l0": p["bias_hh_l0"].roll(1, 0)}, k, masks, x, hx)

    def backward_off(m, p, k, masks, x, hx=None):
        out, h = gru(m, p, k, masks, x, hx)
        return _ScaleGrad.apply(out), h

    for wrong in (other_clients_bias, backward_off):
        monkeypatch.setitem(RULES, nn.GRU, _wrong(nn.GRU, wrong))
        path = choose_path(model, (T,), 2, cross_entropy, CPU, examples=EXAMPLES)
        assert path.name == "vmap" and "differs from the model run alone" in path.fallbacks[0], path.fallbacks
    monkeypatch.setitem(RULES, nn.GRU, _wrong(nn.GRU, gru))
    assert_per_layer(model)

    def ignores_padding(m, p, k, masks, query, key, value, key_padding_mask=None, **kw):
        return attention(m, p, k, masks, query, key, value, **kw)

    monkeypatch.setitem(RULES, nn.MultiheadAttention, _wrong(nn.MultiheadAttention, ignores_padding))
    path = choose_path(Attention(True, False, False, False), (T,), 2, cross_entropy, CPU, examples=EXAMPLES)
    assert path.name == "vmap" and "differs from the model run alone" in path.fallbacks[0], path.fallbacks


def test_the_chunk_memory_estimate_counts_what_a_recurrent_layer_keeps():
    """Chunks are sized from the activations per example: an LSTM's tuple output and the gates it keeps for every
    step count (the estimate used to see only plain-tensor outputs: about 1% of the LEAF LSTM's)."""
    from fedsim.training.vectorized import _activations_per_example

    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    got = _activations_per_example(lstm, (5, 8), torch.device("cpu"))
    output, states, gates = 5 * 16, 2 * (2 * 16), 2 * 5 * 4 * 16  # [T, H]; h and c [layers, H]; per step 4H
    assert got == output + states + gates
