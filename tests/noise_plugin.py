"""A noise mechanism written OUTSIDE fedsim, as a user's package would write it: Cauchy noise, which is not Gaussian,
with its own release kind and its own accountant (tests/test_noise_seam.py). Importing this module registers them;
a scenario names it in ``plugins = ["noise_plugin"]`` so that every process that loads the scenario (a Ray worker,
a ClientApp) registers them too. Nothing here is imported by fedsim."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedsim.privacy import ACCOUNTANTS, RELEASE_KINDS, register_release_kind
from fedsim.privacy.accountants import CERTIFIED_KIND, Accountant, register_accountant
from fedsim.round import NOISE_PURPOSES, NOISE_SOURCES, NoiseSource, register_noise_source


@dataclass(frozen=True)
class CauchyRound:
    """What the ledger records for one round of :class:`CauchyNoise`: a Poisson-sampled (rate ``q``) pure
    ``epsilon``-DP release under add/remove neighbours. No dp-accounting event describes Cauchy noise, so
    :meth:`to_dp_event` says so and only the ``toy-pure-dp`` accountant accounts it."""

    kind: ClassVar[str] = "toy-cauchy-round"

    round: int
    q: float
    epsilon: float

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def neighbouring(self) -> str:
        return "add-remove"

    def to_dp_event(self, relation: str | None = None) -> Any:
        from dp_accounting import dp_event

        return dp_event.UnsupportedDpEvent()

    def amplified_epsilon(self) -> float:
        """Pure DP amplified by Poisson sampling at rate q (add/remove): ``log(1 + q (e^eps - 1))``."""
        return math.log1p(self.q * math.expm1(self.epsilon)) if self.private else math.inf

    def to_dict(self) -> dict:
        return {"round": self.round, "q": self.q, "epsilon": self.epsilon}

    @classmethod
    def from_dict(cls, d: dict) -> CauchyRound:
        return cls(**d)


def cauchy_epsilon(noise_multiplier: float, coordinates: int) -> float:
    """One round's pure epsilon for Cauchy noise of scale ``gamma = z * clip`` on each of ``d`` coordinates of a sum
    whose L2 sensitivity is ``clip`` (add/remove). One coordinate with sensitivity ``D`` has the density ratio
    ``sup_x (g^2 + (x + D)^2) / (g^2 + x^2) = 1 + (D^2 + D sqrt(D^2 + 4 g^2)) / (2 g^2)``, whose log is at most
    ``t + t^2`` with ``t = D / g``; summed over coordinates, ``||t||_1 + ||t||_2^2 <= sqrt(d) / z + 1 / z^2``."""
    if not noise_multiplier > 0:
        return math.inf
    return math.sqrt(coordinates) / noise_multiplier + noise_multiplier**-2


@dataclass
class CauchyNoise(NoiseSource):
    """Cauchy noise of scale ``noise_multiplier * clip`` on each coordinate: a mechanism that is not Gaussian, with its
    own release (:class:`CauchyRound`) and accountant (``toy-pure-dp``). Cauchy is 1-stable, so the shares of
    distributed placement split the scale linearly (k shares of scale g/k sum to scale g), not in quadrature.

    ``coordinates``: its option, the size of the model update it noises (the sensitivity in L1 grows with it); a draw
    of another size is refused rather than accounted wrongly."""

    name: ClassVar[str] = "toy-cauchy"
    noise_kind: ClassVar[str] = "cauchy"
    accountants: ClassVar[tuple[str, ...]] = ("toy-pure-dp",)
    paper_bounds: ClassVar[bool] = False
    single_release: ClassVar[bool] = True
    coordinates: int | None = None

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        if not np.any(np.asarray(std) > 0):
            return 0.0 if size is None else np.zeros(size)
        if size != self.coordinates:
            raise ValueError(f"toy-cauchy accounts {self.coordinates} coordinates; asked for {size}")
        extra = () if client is None else (int(client),)
        return self.rng(round_, NOISE_PURPOSES[purpose], *extra).standard_cauchy(size) * std

    def share_scale(self, noise_scale: float, shares: float) -> float:
        return float(noise_scale) / shares if shares > 0 else 0.0

    def server_noise(
        self, round_: int, size: int, release: Any, shares: float, purpose: str = "model"
    ) -> tuple:
        expected = release.expected_cohort
        scale = release.noise_std * max(expected - float(shares), 0.0) / expected if release.private else 0.0
        return self.noise(round_, purpose, size, scale), scale

    def dp_release(self, round_: int, release: Any, schedule: Any | None = None) -> CauchyRound:
        if schedule is not None:
            raise ValueError("toy-cauchy is accounted round by round, not over a participation schedule")
        if self.coordinates is None:
            raise ValueError("toy-cauchy needs its option coordinates (the model's size) to be accounted")
        z = release.noise_multiplier if release.private else 0.0
        return CauchyRound(round=int(round_), q=float(release.q), epsilon=cauchy_epsilon(z, self.coordinates))


def pure_dp_of_ledger(rounds: Any, relation: str, delta: float) -> float:
    """Basic composition of the rounds' amplified pure epsilons (a valid bound at any delta)."""
    return float(sum(r.amplified_epsilon() for releases in rounds for r in releases))


def register() -> None:
    """Register the Cauchy mechanism, its release kind and its accountant (idempotent; done on import)."""
    register_release_kind(CauchyRound, replace=True)
    register_accountant(
        Accountant(
            "toy-pure-dp",
            CERTIFIED_KIND,
            "basic composition of pure-DP rounds, each amplified by Poisson sampling",
            None,  # no curve for a Gaussian mechanism: it accounts toy-cauchy ledgers only
            of_ledger=pure_dp_of_ledger,
            accepts_any_event=True,
        ),
        replace=True,
    )
    register_noise_source(CauchyNoise, replace=True)


def unregister() -> None:
    """Take them out of the registries again (other tests iterate the registries)."""
    NOISE_SOURCES.pop(CauchyNoise.name, None)
    ACCOUNTANTS.pop("toy-pure-dp", None)
    RELEASE_KINDS.pop(CauchyRound.kind, None)


register()
