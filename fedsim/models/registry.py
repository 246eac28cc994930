"""The model registry: ``build_model(name, input_dim, num_classes, **kwargs)``."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

MODELS: tuple[str, ...] = ("mlp", "logreg", "cnn1d")


class LogReg(nn.Module):
    """Multinomial logistic regression: one linear layer."""

    def __init__(self, input_dim: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Fully connected network with ReLU activations; ``hidden=(100,)`` by default."""

    def __init__(self, input_dim: int, num_classes: int, hidden: Sequence[int] = (100,)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class CNN1D(nn.Module):
    """Small 1-D CNN: [n, d] -> [n, 1, d] -> two stride-2 conv+ReLU layers -> linear.

    With ``input_dim=40`` (MNIST-1D) and the defaults (16 and 32 channels, kernel 5) it has
    about 5.9k parameters.
    """

    def __init__(
        self,
        input_dim: int,
        num_classes: int,
        channels: Sequence[int] = (16, 32),
        kernel_size: int = 5,
    ) -> None:
        super().__init__()
        self.input_dim = int(input_dim)
        if len(channels) != 2:
            raise ValueError(f"invalid channels={tuple(channels)!r}: allowed two positive integers")
        c1, c2 = channels
        pad = kernel_size // 2
        self.conv1 = nn.Conv1d(1, c1, kernel_size, stride=2, padding=pad)
        self.conv2 = nn.Conv1d(c1, c2, kernel_size, stride=2, padding=pad)
        length = input_dim
        for _ in range(2):
            length = (length + 2 * pad - kernel_size) // 2 + 1
        if length < 1:
            raise ValueError(
                f"invalid input_dim={input_dim}: too short for cnn1d with kernel_size={kernel_size}"
            )
        self.head = nn.Linear(c2 * length, num_classes)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], 1, -1)
        h = self.act(self.conv1(h))
        h = self.act(self.conv2(h))
        return self.head(h.flatten(1))


_BUILDERS: dict[str, Callable[..., nn.Module]] = {"mlp": MLP, "logreg": LogReg, "cnn1d": CNN1D}


def build_model(name: str, input_dim: int, num_classes: int, **kwargs: Any) -> nn.Module:
    """Build model ``name`` (one of ``MODELS``) for ``input_dim`` features and ``num_classes`` classes.

    kwargs: ``mlp``: ``hidden`` (sequence of widths, default ``(100,)``; ``()`` is logistic
    regression); ``cnn1d``: ``channels`` (two widths, default ``(16, 32)``), ``kernel_size`` (5);
    ``logreg``: none. Unknown names or options raise ``ValueError`` naming them.
    """
    if not isinstance(name, str) or name not in _BUILDERS:
        raise ValueError(f"invalid model={name!r}: allowed one of {', '.join(map(repr, MODELS))}")
    for option, value in (("input_dim", input_dim), ("num_classes", num_classes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"invalid {option}={value!r}: allowed a positive integer")
    builder = _BUILDERS[name]
    accepted = [p for p in inspect.signature(builder).parameters if p not in ("input_dim", "num_classes")]
    for option, value in kwargs.items():
        if option not in accepted:
            raise ValueError(
                f"invalid {option}={value!r}: model {name!r} takes "
                + (", ".join(accepted) if accepted else "no options")
            )
    if "hidden" in kwargs:
        kwargs["hidden"] = _positive_ints("hidden", kwargs["hidden"], allow_empty=True)
    if "channels" in kwargs:
        kwargs["channels"] = _positive_ints("channels", kwargs["channels"], allow_empty=False)
    if "kernel_size" in kwargs:
        k = kwargs["kernel_size"]
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"invalid kernel_size={k!r}: allowed a positive integer")
    return builder(int(input_dim), int(num_classes), **kwargs)


def num_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _positive_ints(option: str, value: Any, *, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value,)
    ok = isinstance(value, Sequence) and not isinstance(value, str) and (allow_empty or len(value) > 0)
    ok = ok and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in value)
    if not ok:
        raise ValueError(f"invalid {option}={value!r}: allowed a list of positive integers")
    return tuple(int(v) for v in value)
