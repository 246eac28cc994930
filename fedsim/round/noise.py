"""Noise: where it comes from (a pluggable noise source) and how it joins the clipped sum.

The Gaussian noise on the **sum** of clipped updates has std ``noise_multiplier * clip``; the aggregate is divided
by the **expected** cohort size, never the realised count (the realised count is data-dependent and would leak).

A :class:`NoiseSource` draws every noise a round releases from its own stream per purpose
(:mod:`fedsim.round.randomness`). :class:`NoiseSource` is independent across rounds; a mechanism whose
round-``t`` noise combines earlier draws (matrix-factorisation / correlated noise) is another source that keeps
those draws in its :meth:`NoiseSource.state_dict`, so that a checkpoint can save and restore it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .partial import PartialSum
from .randomness import SeededState, make_rng, randomness_kind

NOISE_PLACEMENTS = ("central", "distributed")


@dataclass
class NoiseSource(SeededState):
    """Independent Gaussian noise per round and purpose. ``seed=None``: the operating system's entropy."""

    seed: int | None = None
    name = "gaussian"

    @property
    def randomness(self) -> str:
        return randomness_kind(self.seed)

    def rng(self, round_: int, stream: int, *extra: int) -> Any:
        return make_rng(self.seed, round_, stream, *extra)

    def normal(self, round_: int, stream: int, std: float, size: int | None = None) -> Any:
        """``N(0, std^2)`` draws (a float when ``size`` is None) for ``stream`` of round ``round_``."""
        return self.rng(round_, stream).normal(0.0, std, size=size)


def gaussian_noise(dim: int, std: float, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(0.0, std, size=dim) if std > 0 else np.zeros(dim)


def noise_share_std(noise_multiplier: float, clip: float, shares: float) -> float:
    """Distributed noise: the std each sampled client adds so that ``shares`` of them sum to
    ``N(0, (z*clip)^2)``. ``shares`` is the **expected** cohort size, a public parameter, never the realised one:
    a share computed from the realised cohort would tell every sampled client how many were sampled (under
    Poisson sampling that count is not covered by epsilon). The server tops up the shares below ``shares`` that
    did not arrive (see :func:`private_mean`), so the total never falls below the accounted noise; a realised
    cohort larger than expected adds more noise than accounted (never less)."""
    return noise_multiplier * clip / math.sqrt(shares) if shares > 0 else 0.0


def private_mean(
    partial: PartialSum,
    *,
    clip: float,
    noise_multiplier: float,
    expected_cohort: float,
    rng: np.random.Generator,
    noise_placement: str = "central",
) -> tuple[np.ndarray, float]:
    """``(sum of clipped updates + N(0, (z*clip)^2 I)) / expected_cohort``.

    Returns ``(mean, server_noise_std)``. Central: the server adds all the noise. Distributed: each sampled client
    that replied added a share of variance ``(z*clip)^2/expected_cohort`` (:func:`noise_share_std`); the server adds
    the shares missing below ``expected_cohort`` (clients that were not sampled, did not reply or were rejected),
    so the total noise variance is at least ``(z*clip)^2`` in every case.
    """
    if expected_cohort <= 0:
        raise ValueError(f"expected_cohort must be > 0, got {expected_cohort}")
    full_var = (noise_multiplier * clip) ** 2 if noise_multiplier > 0 else 0.0  # z = 0 (clip may be inf)
    if noise_placement == "central":
        server_var = full_var
    elif noise_placement == "distributed":
        server_var = full_var * max(expected_cohort - partial.noise_shares, 0.0) / expected_cohort
    else:
        raise ValueError(
            f"noise_placement must be one of {', '.join(NOISE_PLACEMENTS)}; got {noise_placement!r}"
        )
    std = math.sqrt(server_var)
    noised = partial.total + gaussian_noise(partial.dim, std, rng)
    return noised / expected_cohort, std
