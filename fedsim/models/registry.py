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

from torch import nn

from fedsim.factories import build_model as _build
from fedsim.factories import positive_ints

__all__ = ["MODELS", "MODEL_FACTORIES", "build_model", "cnn1d", "cnn2d", "logreg", "mlp", "num_parameters"]


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


MODEL_FACTORIES: dict[str, str] = {
    "mlp": "fedsim.models.registry:mlp",
    "logreg": "fedsim.models.registry:logreg",
    "cnn1d": "fedsim.models.registry:cnn1d",
    "cnn2d": "fedsim.models.registry:cnn2d",
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
