"""Mechanisms written OUTSIDE fedsim, as a user's package would, for the seam tests (tests/test_seams.py).

Each plugs in through a public registry only: a sampling scheme, a noise source that keeps state, a per-layer rule
for a layer type fedsim does not know, and a model built from it. Nothing here is imported by fedsim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedsim.round import NoiseSource, Sampler, register_noise_source, register_sampler
from fedsim.training import layers


class ReversedPoisson(Sampler):
    """Poisson sampling drawn another way (the uniforms assigned to the ids in reverse order): the same privacy
    meaning as ``poisson`` (its q, add/remove, PoissonSampledDpEvent, PLD parameters are the defaults), other
    cohorts."""

    name = "toy-reversed-poisson"
    label = "each client independently with probability q (uniforms in reverse id order)"

    def draw(self, ids: np.ndarray, rng: Any, m: Any) -> np.ndarray:
        return np.sort(ids[::-1][rng.random(ids.size) < self.q(m)])


@dataclass
class RecordingNoise(NoiseSource):
    """Independent Gaussian noise, the same draws as fedsim's own source, that records every request it serves and
    keeps the last model-noise vector as state (as a correlated mechanism keeps its past draws)."""

    name: ClassVar[str] = "toy-recording"
    # it draws its own noise (it overrides noise), so it must say what it releases: the same Gaussian draws and
    # the same per-round event as fedsim's independent noise (a class that did not say would be refused)
    noise_kind: ClassVar[str] = "gaussian"
    dp_release = NoiseSource.dp_release
    served: list[tuple[int, str, Any, float]] = field(default_factory=list)
    last_model_draw: np.ndarray | None = None

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        out = super().noise(round_, purpose, size, std, client=client)
        self.served.append((round_, purpose, size, float(np.max(std))))
        if purpose == "model":
            self.last_model_draw = np.array(out, dtype=np.float64)
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"last_model_draw": self.last_model_draw}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.last_model_draw = state.get("last_model_draw")


class Scale(nn.Module):
    """A layer fedsim has no rule for: ``x * weight`` with one weight per feature."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def scale_rule(m: Scale, p: dict[str, torch.Tensor], k: int, masks: Any, x: torch.Tensor) -> torch.Tensor:
    """The per-client rule for :class:`Scale`: client ``k``'s weight on its rows of the stacked batch."""
    w = p["weight"]  # [K, features]
    return (x.reshape(k, -1, x.shape[-1]) * w.unsqueeze(1)).reshape(x.shape)


def scaled_mlp(input_shape: Any, num_classes: int, hidden: int = 16) -> nn.Module:
    """A model factory (the user's contract): Flatten, Scale, Linear, ReLU, Linear."""
    features = int(np.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), Scale(features), nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def register_all() -> None:
    """Register the toy sampler, noise source and layer rule (idempotent)."""
    register_sampler(ReversedPoisson, replace=True)
    register_noise_source(RecordingNoise, replace=True)
    layers.register(Scale)(scale_rule)
