"""The shipped model factories. They follow the contract a user's factory follows
(:mod:`fedsim.factories`): ``factory(input_shape, num_classes, **options) -> nn.Module``.

A scenario names them by short name (``[model] name = "mlp"``) or, like any factory, by reference
(``factory = "fedsim.models.registry:mlp"``). The training code never imports this module: it receives the
reference and imports it, exactly as it does a user's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.factories import build_model as _build
from fedsim.factories import positive_ints

__all__ = [
    "MODELS",
    "MODEL_FACTORIES",
    "build_model",
    "cnn1d",
    "cnn2d",
    "logreg",
    "lstm",
    "mlp",
    "num_parameters",
    "transformer",
]


def _positive_int(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"invalid model.{option}={value!r}: allowed a positive integer")
    return int(value)


def mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] | int = (100,)) -> nn.Module:
    """Fully connected network on the flattened input, ReLU between layers; ``hidden=()`` is logistic
    regression."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in positive_ints("model.hidden", hidden, allow_empty=True):
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def logreg(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    return mlp(input_shape, num_classes, hidden=())


def _conv_out(length: int, kernel: int, stride: int, pad: int) -> int:
    return (length + 2 * pad - kernel) // stride + 1


def cnn1d(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int] = (16, 32),
    kernel_size: int = 5,
) -> nn.Module:
    """Small 1-D CNN: the input as one channel (``[n, 1, prod(input_shape)]``), two stride-2 Conv1d+ReLU
    layers, a linear head. With MNIST-1D (40 features) and the defaults it has about 5.9k parameters."""
    c = positive_ints("model.channels", channels)
    if len(c) != 2:
        raise ValueError(f"invalid model.channels={tuple(channels)!r}: allowed two positive integers")
    k = _positive_int("kernel_size", kernel_size)
    pad = k // 2
    length = math.prod(input_shape)
    for _ in range(2):
        length = _conv_out(length, k, 2, pad)
    if length < 1:
        raise ValueError(
            f"invalid input_shape={tuple(input_shape)}: too short for cnn1d with kernel_size={k}"
        )
    return nn.Sequential(
        nn.Flatten(),
        nn.Unflatten(1, (1, math.prod(input_shape))),
        nn.Conv1d(1, c[0], k, stride=2, padding=pad),
        nn.ReLU(),
        nn.Conv1d(c[0], c[1], k, stride=2, padding=pad),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c[1] * length, num_classes),
    )


def cnn2d(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int] = (16, 32),
    kernel_size: int = 3,
    groups: int = 4,
) -> nn.Module:
    """Small Conv2d CNN for images ``(C, H, W)``: two blocks of Conv2d (same padding), GroupNorm, ReLU and
    2x2 average pooling (the second pooling is skipped on images too small for it), then a linear head.
    GroupNorm, not BatchNorm: it normalises each example on its own (BatchNorm is refused, see
    :func:`fedsim.factories.check_private_trainable`). For the 1x8x8 digits: about 7.5k parameters."""
    if len(input_shape) != 3:
        raise ValueError(
            f"invalid input_shape={tuple(input_shape)}: cnn2d takes images (channels, height, width); "
            "for flat features use mlp or cnn1d"
        )
    c = positive_ints("model.channels", channels)
    k = _positive_int("kernel_size", kernel_size)
    g = _positive_int("groups", groups)
    for width in c:
        if width % g:
            raise ValueError(f"invalid model.groups={g}: every channel count {c} must be a multiple of it")
    cin, h, w = (int(v) for v in input_shape)
    layers: list[nn.Module] = []
    for width in c:
        layers += [nn.Conv2d(cin, width, k, padding=k // 2), nn.GroupNorm(g, width), nn.ReLU()]
        if h >= 2 and w >= 2:
            layers.append(nn.AvgPool2d(2))
            h, w = h // 2, w // 2
        cin = width
    layers += [nn.Flatten(), nn.Linear(cin * h * w, num_classes)]
    return nn.Sequential(*layers)


def _flag(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"invalid model.{option}={value!r}: allowed true or false")
    return value


def _sequence_length(model: str, input_shape: Sequence[int]) -> int:
    if len(input_shape) != 1 or isinstance(input_shape[0], bool) or int(input_shape[0]) < 1:
        raise ValueError(
            f"invalid input_shape={tuple(input_shape)}: {model} takes windows of token ids (seq_len,), "
            "e.g. dataset='shakespeare'"
        )
    return int(input_shape[0])


class CharLSTM(nn.Module):
    """Token ids ``[n, T]`` -> Embedding -> LSTM -> Linear on the last time step -> ``[n, num_classes]``
    (``per_token``: on every step -> ``[n, T, num_classes]``)."""

    def __init__(
        self, vocab: int, embedding_dim: int, hidden: int, layers: int, num_classes: int, per_token: bool
    ) -> None:
        super().__init__()
        self.per_token = per_token
        self.embed = nn.Embedding(vocab, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x.long()))
        return self.out(h if self.per_token else h[:, -1])


def lstm(
    input_shape: Sequence[int],
    num_classes: int,
    embedding_dim: int = 8,
    hidden: int = 256,
    layers: int = 2,
    vocab: int | None = None,
    per_token: bool = False,
) -> nn.Module:
    """LEAF's Shakespeare model (Caldas et al.): an ``embedding_dim``-dim character embedding, ``layers`` stacked
    LSTMs of ``hidden`` units and a linear layer on the last time step. Inputs are token ids ``[n, seq_len]``
    in ``[0, vocab)`` (``vocab`` defaults to ``num_classes``: next-token prediction). The defaults are LEAF's
    (8, 256, 2: about 0.8M parameters with 81 classes). ``per_token``: the linear layer on every step, logits
    ``[n, seq_len, num_classes]``, for sequence targets (``shakespeare`` with ``targets = "sequence"``)."""
    _sequence_length("lstm", input_shape)
    return CharLSTM(
        _positive_int("vocab", num_classes if vocab is None else vocab),
        _positive_int("embedding_dim", embedding_dim),
        _positive_int("hidden", hidden),
        _positive_int("layers", layers),
        num_classes,
        _flag("per_token", per_token),
    )


class CharTransformer(nn.Module):
    """Token ids ``[n, T]`` -> token + learned position embeddings -> encoder layers -> Linear on the last
    position -> ``[n, num_classes]``. No causal mask: the label (the next token) is outside the window.
    ``per_token``: a causal mask (position t sees positions <= t) and the linear layer on every position ->
    ``[n, T, num_classes]``."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        d_model: int,
        heads: int,
        layers: int,
        ff: int,
        dropout: float,
        num_classes: int,
        per_token: bool,
    ) -> None:
        super().__init__()
        self.per_token = per_token
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, ff, dropout, batch_first=True) for _ in range(layers)
        )
        self.out = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.long()
        positions = torch.arange(x.shape[1], device=x.device).expand_as(x)  # [n, T], like the ids
        h = self.embed(x) + self.position(positions)
        if not self.per_token:
            for layer in self.layers:
                h = layer(h)
            return self.out(h[:, -1])
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=h.dtype)
        for layer in self.layers:
            h = layer(h, src_mask=causal, is_causal=True)
        return self.out(h)


def transformer(
    input_shape: Sequence[int],
    num_classes: int,
    d_model: int = 64,
    heads: int = 4,
    layers: int = 2,
    ff: int = 128,
    dropout: float = 0.0,
    vocab: int | None = None,
    per_token: bool = False,
) -> nn.Module:
    """A small Transformer encoder over token ids ``[n, seq_len]``: a token embedding plus a learned position
    embedding (``d_model`` wide), ``layers`` ``nn.TransformerEncoderLayer`` (``heads`` heads, feed-forward
    ``ff``, ReLU, post-norm, ``dropout``, batch first) and a linear layer on the last position. ``vocab``
    defaults to ``num_classes`` (next-token prediction). No weights are tied (fedsim refuses parameters shared
    between layers). With the defaults and 81 classes: about 77k parameters. ``per_token``: causal attention
    and logits ``[n, seq_len, num_classes]`` at every position, for sequence targets."""
    seq_len = _sequence_length("transformer", input_shape)
    d = _positive_int("d_model", d_model)
    h = _positive_int("heads", heads)
    if d % h:
        raise ValueError(f"invalid model.heads={h}: d_model={d} must be a multiple of it")
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"invalid model.dropout={dropout!r}: allowed a number in [0, 1)")
    return CharTransformer(
        _positive_int("vocab", num_classes if vocab is None else vocab),
        seq_len,
        d,
        h,
        _positive_int("layers", layers),
        _positive_int("ff", ff),
        float(dropout),
        num_classes,
        _flag("per_token", per_token),
    )


MODEL_FACTORIES: dict[str, str] = {
    "mlp": "fedsim.models.registry:mlp",
    "logreg": "fedsim.models.registry:logreg",
    "cnn1d": "fedsim.models.registry:cnn1d",
    "cnn2d": "fedsim.models.registry:cnn2d",
    "lstm": "fedsim.models.registry:lstm",
    "transformer": "fedsim.models.registry:transformer",
}
"""Short names a scenario may give as ``[model] name``, and the factory each one stands for."""

MODELS: tuple[str, ...] = tuple(MODEL_FACTORIES)


def build_model(name: Any, input_shape: Any, num_classes: int, **options: Any) -> nn.Module:
    """Build a shipped model by short name (one of ``MODELS``), or any factory reference or callable.

    >>> build_model("mlp", (64,), 10, hidden=[32])
    """
    if isinstance(name, str) and name in MODEL_FACTORIES:
        name = MODEL_FACTORIES[name]
    elif isinstance(name, str) and ":" not in name:
        raise ValueError(
            f"invalid model={name!r}: allowed one of {', '.join(map(repr, MODELS))} or 'package.module:function'"
        )
    return _build(name, input_shape, num_classes, options)


def num_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
