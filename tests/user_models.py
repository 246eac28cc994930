"""Models and a data function as a user would write them: plain PyTorch, nothing from fedsim.

Scenarios in the tests name them ``"user_models:<function>"`` (tests/conftest.py puts this folder on ``sys.path``; the
Ray engine and Flower's Simulation Engine hand that path to their workers).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class TwoLayer(nn.Module):
    """A user's MLP: its own class, its own attribute names, activations called as functions."""

    def __init__(self, features: int, width: int, classes: int) -> None:
        super().__init__()
        self.encoder = nn.Linear(features, width)
        self.decoder = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.tanh(self.encoder(x.flatten(1))))


def mlp(input_shape, num_classes, width: int = 24):
    return TwoLayer(math.prod(input_shape), width, num_classes)


class SmallCNN(nn.Module):
    """A Conv2d CNN with GroupNorm, max and average pooling, GELU and dropout."""

    def __init__(self, channels: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1),
            nn.GroupNorm(2, 8),
            nn.GELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
            nn.GroupNorm(4, 8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(8 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.flatten(self.features(x), 1)))


def cnn(input_shape, num_classes, dropout: float = 0.0):
    return SmallCNN(input_shape[0], num_classes, dropout)


class Scale(nn.Module):
    """A custom layer with its own parameter: no per-layer rule knows it, so training falls back to vmap."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def custom(input_shape, num_classes):
    d = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(d, 16), Scale(16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, num_classes)
    )


class Centered(nn.Module):
    """Subtracts the batch mean: mixes examples, so clients must not share a batch (the probe refuses it)."""

    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc(x - x.mean(0, keepdim=True))


def centered(input_shape, num_classes):
    return Centered(math.prod(input_shape), num_classes)


class DataDependent(nn.Module):
    """A parameter of its own (no per-layer rule) and Python control flow on a tensor's value (vmap cannot
    batch it): training falls back to the per-client loop."""

    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, classes)
        self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1)) / self.temperature
        return out * 0.5 if float(out.detach().abs().max()) > 100.0 else out


def data_dependent(input_shape, num_classes):
    return DataDependent(math.prod(input_shape), num_classes)


def with_batchnorm(input_shape, num_classes):
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), 8), nn.BatchNorm1d(8), nn.Linear(8, num_classes)
    )


def smooth_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A user's loss: label-smoothed cross-entropy, one value per example."""
    return F.cross_entropy(outputs, targets, reduction="none", label_smoothing=0.1)


def stripes(num_clients: int, seed: int, size: int = 6, per_client: int = 12):
    """A user's image dataset: 1 x size x size images of horizontal or vertical stripes (2 classes) with a
    per-client brightness, and its own clients (a ragged number of examples each)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(per_client // 2, per_client * 2, size=num_clients)
    n = int(counts.sum())
    y = rng.integers(0, 2, size=n)
    base = (np.arange(size) % 2).astype(np.float32)
    img = np.where(y[:, None, None] == 0, base[None, :, None], base[None, None, :]) * np.ones((1, size, size))
    x = (img + 0.3 * rng.standard_normal((n, size, size))).astype(np.float32)[:, None]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    clients = [np.arange(offsets[i], offsets[i + 1]) for i in range(num_clients)]
    return {"x": x, "y": y, "clients": clients}


def random_labels(num_clients: int, seed: int, per_client: int = 8, features: int = 32, classes: int = 10):
    """Gaussian inputs with labels drawn at random: nothing to learn, so a model can only fit its training clients
    by memorising them (the known answer of the membership-inference test)."""
    rng = np.random.default_rng(seed)
    n = num_clients * per_client
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n)
    clients = [np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)]
    return {"x": x, "y": y, "clients": clients, "num_classes": classes}
