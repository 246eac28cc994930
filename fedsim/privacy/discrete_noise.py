"""The distributed discrete Gaussian (``ddgauss``) and distributed Skellam (``skellam``) noise mechanisms.

Each sampled client rotates, clips, scales, rounds and noises its update in the integer domain and reduces it modulo
``2^bits`` (:mod:`fedsim.round.discrete`), so that a secure-aggregation protocol can sum the clients' vectors; the
server decodes the sum. The server adds no noise of its own: against a server that sees only the secure sum, the noise
is the shares of the clients that reported, which the server cannot top up. Every round is accounted with the fewest
shares a released round can hold, the floor ``min_shares`` times the expected cohort (public, fixed before the run),
and a round whose shares fall below it is not released (:meth:`DistributedDiscreteNoise.noise_floor_refusal`). Not the
realised number: an epsilon computed from how many sampled clients replied would publish that exact count (under
Poisson sampling a function of who is in the data, which epsilon does not cover), and Zhu and Wang's amplification
bound needs one Renyi bound that holds for every sample, which the floor's is and the realised count's is not.
Nor the planned (expected) number: a round with dropouts has less noise than that.

Accounting: :class:`fedsim.privacy.discrete.DDGaussRound` (Kairouz, Liu and Steinke 2021, Proposition 14, with the
sensitivity inflated by rounding and the tau term of summing discrete Gaussians) and
:class:`fedsim.privacy.discrete.SkellamRound` (Agarwal, Kairouz and Liu 2021), each composed with Poisson subsampling
in Renyi DP and converted to (epsilon, delta) by the ``rdp`` accountant.

Options (``[privacy.mechanism]``): ``bits`` (the modulus ``2^bits``), ``k_stddevs`` (standard deviations of the sum
kept inside the modulus: the scale heuristic), ``beta`` (conditional rounding; 0: plain randomized rounding),
``gamma`` (the grid step; None: TFF's heuristic from bits, cohort, k, clip, dimension and the local noise) and
``min_shares``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedsim.round import NoiseSource, register_noise_source
from fedsim.round import discrete as dd
from fedsim.round.partial import PartialSum
from fedsim.round.randomness import STREAM_NOISE_SHARE, STREAM_ROTATION, STREAM_ROUNDING
from fedsim.round.sampling import ADD_REMOVE

from .discrete import RDP_ORDERS, DDGaussRound, SkellamRound, epsilon_from_rdp
from .errors import PrivacyInputError

#: beta of the papers' experiments (conditional rounding; TFF's default is 0, plain randomized rounding)
DEFAULT_BETA = math.exp(-0.5)


@dataclass
class DistributedDiscreteNoise(NoiseSource):
    """Integer noise added by each sampled client to its quantised update before secure aggregation (a base class:
    :class:`DDGaussNoise`, :class:`SkellamNoise`)."""

    bits: int = 16
    k_stddevs: float = 4.0
    beta: float = DEFAULT_BETA
    gamma: float | None = None
    min_shares: float = 0.5

    name: ClassVar[str] = ""
    placements: ClassVar[tuple[str, ...]] = ("distributed",)
    accountants: ClassVar[tuple[str, ...]] = ("rdp",)
    #: Zhu and Wang's amplification bound is for Poisson subsampling under add/remove neighbours
    neighbouring: ClassVar[tuple[str, ...]] = (ADD_REMOVE,)
    paper_bounds: ClassVar[bool] = False
    single_release: ClassVar[bool] = True
    encodes: ClassVar[bool] = True
    #: the release kind the ledger records (:mod:`fedsim.privacy.discrete`)
    release_class: ClassVar[type] = DDGaussRound

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or int(self.bits) != self.bits or not 1 <= self.bits <= dd.MAX_BITS:
            raise ValueError(f"bits must be an integer in [1, {dd.MAX_BITS}], got {self.bits}")
        self.bits = int(self.bits)
        if isinstance(self.k_stddevs, bool) or not (self.k_stddevs > 0 and math.isfinite(self.k_stddevs)):
            raise ValueError(f"k_stddevs must be finite and > 0, got {self.k_stddevs}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must be in [0, 1) (0: no conditional rounding), got {self.beta}")
        if self.gamma is not None and not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(
                f"gamma (the grid step) must be > 0, or None for the heuristic; got {self.gamma}"
            )
        if not 0.0 < self.min_shares <= 1.0:
            raise ValueError(
                f"min_shares must be in (0, 1] (the fraction of the expected cohort's noise shares a released round "
                f"must hold), got {self.min_shares}"
            )
        self._size: int | None = None

    # ------------------------------------------------------------------ the model size the release is over
    def set_model_size(self, size: int) -> None:
        size = int(size)
        if self._size is not None and self._size != size:
            raise ValueError(
                f"mechanism {self.name!r} was set up for a model of {self._size} numbers, not {size}"
            )
        self._size = size

    @property
    def model_size(self) -> int:
        if self._size is None:
            raise ValueError(
                f"mechanism {self.name!r} is accounted over the model's size (its rotation pads it to a power of "
                "two): it must be told the size first (NoiseSource.set_model_size)"
            )
        return self._size

    # ------------------------------------------------------------------ the encoding
    def parameters(self, release: Any, size: int) -> dict[str, Any]:
        """The round's public encoding parameters for ``release`` (clip ``c``, total noise std ``z c`` over the
        expected cohort ``n``) and a model of ``size`` numbers: the padded dimension, the scale ``1 / gamma`` and each
        client's noise std in grid units. Refuses bits that cannot hold the sum and a scale beyond float64's exact
        integers."""
        n = float(release.expected_cohort)
        dim = dd.padded_dim(size)
        clip = float(release.clip)
        if not (math.isfinite(clip) and clip > 0):
            raise PrivacyInputError(
                "clip",
                release.clip,
                f"must be finite and > 0 with mechanism {self.name!r} (the grid covers the clip)",
            )
        local_std = float(release.noise_std) / math.sqrt(n) if release.private else 0.0
        dd.check_bits(self.bits, n, self.k_stddevs)
        if self.gamma is None:
            scale = dd.heuristic_scale(local_std, clip, self.bits, n, dim, self.k_stddevs)
        else:
            scale = 1.0 / self.gamma
        if not clip * scale <= dd.MAX_SCALED:
            raise PrivacyInputError(
                "gamma" if self.gamma is not None else "bits",
                self.gamma if self.gamma is not None else self.bits,
                f"gives scale 1/gamma = {scale:.4g}, which puts the clip at {clip * scale:.4g} grid steps, beyond what "
                f"float64 holds exactly ({dd.MAX_SCALED:.0f}): use fewer bits or a larger gamma",
            )
        return {
            "kind": self.name,
            "bits": self.bits,
            "beta": float(self.beta),
            "scale": float(scale),
            "dim": dim,
            "local_std_grid": local_std * scale,
        }

    def check_release(self, release: Any, size: int) -> None:
        """Bits that cannot hold the expected cohort, or a scale beyond float64's exact integers, are refused."""
        self.parameters(release, size)

    def encoding(self, release: Any, size: int) -> dict[str, Any]:
        return self.parameters(release, size)

    def public_randomness(self, round_: int) -> dict[str, int]:
        rng = self.rng(round_, STREAM_ROTATION)
        seed = int(rng.random() * 2.0**53)  # 53 random bits: seeded, or the operating system's entropy
        return {"rotation_seed": seed}

    def encode(
        self, round_: int, client: int, update: np.ndarray, clip: float, encoding: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        if encoding.get("kind") != self.name:
            raise ValueError(f"an encoding for {encoding.get('kind')!r} given to mechanism {self.name!r}")
        encoded, info = dd.encode(
            update,
            clip=clip,
            scale=encoding["scale"],
            bits=encoding["bits"],
            beta=encoding["beta"],
            rotation_seed=encoding["rotation_seed"],
            noise_kind=self.noise_kind,
            local_std_grid=encoding["local_std_grid"],
            rng=self.rng(round_, STREAM_ROUNDING, int(client)),
            noise_rng=self.rng(round_, STREAM_NOISE_SHARE, int(client)),
        )
        if encoded is None:
            return None, {"norm": math.nan}
        sums = {"encoded_signed": info["signed"], "rounding_error": info["rounding_error"]}
        return encoded, {"norm": info["norm"], "tries": info.get("tries", 1), "sums": sums}

    def decode(
        self, round_: int, partial: PartialSum, release: Any, encoding: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        dim, scale = int(encoding["dim"]), float(encoding["scale"])
        total = partial.extras.get("encoded")
        if total is None:  # no client's encoding arrived: the sum is zero (and the round holds no noise)
            total = np.zeros(dim)
        signed = partial.extras.get("encoded_signed")
        summed, wrapped = dd.decode(
            np.rint(total).astype(np.int64),
            bits=int(encoding["bits"]),
            scale=scale,
            rotation_seed=int(encoding["rotation_seed"]),
            dim=partial.dim,
            signed_total=None if signed is None else np.rint(signed).astype(np.int64),
        )
        stats: dict[str, Any] = {"wrapped": int(wrapped), "grid_step": 1.0 / scale}
        error = partial.extras.get("rounding_error")
        if error is not None:  # the clients' rounding errors summed (grid units; the rotation keeps norms)
            stats["quantisation_error_norm"] = float(np.linalg.norm(error)) / scale
        return summed, stats

    # ------------------------------------------------------------------ no server noise: the clients' shares only
    def share_scale(self, noise_scale: float, shares: float) -> float:
        """Each client's noise std in the update's units (as Gaussian shares: variances add)."""
        return float(noise_scale) / math.sqrt(shares) if shares > 0 else 0.0

    def server_noise(
        self, round_: int, size: int | None, release: Any, shares: float, purpose: str = "model"
    ) -> tuple:
        """Nothing: noise the server adds after secure aggregation does not protect clients from the server. The
        shares missing below the expected cohort stay missing, and the ledger accounts the shares summed."""
        return (0.0 if size is None else np.zeros(size)), 0.0

    # ------------------------------------------------------------------ what the ledger records
    def dp_release(self, round_: int, release: Any, schedule: Any | None = None) -> Any:
        """The round with the noise of the fewest shares a released round holds (:meth:`accounted_shares`), never
        more than the expected cohort's: a function of public parameters alone."""
        if schedule is not None:
            raise ValueError(
                f"mechanism {self.name!r} is accounted round by round, not over a participation schedule"
            )
        if getattr(release, "noise_kind", self.noise_kind) != self.noise_kind:
            raise ValueError(
                f"mechanism {self.name!r} records {self.noise_kind} releases; this round says {release.noise_kind!r}"
            )
        p = self.parameters(release, self.model_size)
        return self.release_class(
            round=int(round_),
            q=float(release.q),
            clip=float(release.clip),
            gamma=1.0 / p["scale"],
            local_std_grid=float(p["local_std_grid"]),
            shares=self.accounted_shares(release),
            dim=int(p["dim"]),
            beta=float(self.beta),
            bits=int(self.bits),
        )

    def accounted_shares(self, release: Any) -> float:
        """The noise shares every round is accounted with: the floor, ``min_shares`` times the expected cohort."""
        return self.min_shares * float(release.expected_cohort)

    #: calibrates its own noise multiplier to a target epsilon (:meth:`calibrate`)
    calibrates: ClassVar[bool] = True

    def epsilon_after(self, release: Any, rounds: int, delta: float) -> float:
        """The certified epsilon (Renyi DP, converted at ``delta``) of ``rounds`` released rounds of ``release``:
        what a run of them records (each accounted at the floor, whoever drops out)."""
        r = self.dp_release(1, release)
        return float(epsilon_from_rdp(RDP_ORDERS, rounds * r.rdp(RDP_ORDERS), delta)[0])

    def calibrate(self, release: Any, target_epsilon: float, delta: float, rounds: int) -> float | None:
        """The smallest noise multiplier (to 4 significant digits, rounded up: the target holds) whose ``rounds``
        released rounds of ``release`` spend at most ``target_epsilon``; None if even the most noise searched
        (``z = 1000``) does not."""

        def eps(z: float) -> float:
            return self.epsilon_after(release.replace(noise_multiplier=z), rounds, delta)

        lo, hi = 1e-3, 1e3
        if eps(hi) > target_epsilon:
            return None
        if eps(lo) <= target_epsilon:
            return lo
        while hi / lo > 1 + 1e-5:  # bisection in log z: epsilon decreases as z grows
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if eps(mid) > target_epsilon else (lo, mid)
        return float(f"{hi:.4e}") if eps(float(f"{hi:.4e}")) <= target_epsilon else hi

    def noise_floor_refusal(self, release: Any, shares: float) -> str | None:
        """Why a round whose sum holds ``shares`` noise shares is not released: fewer than the floor it is
        accounted with. The message names the floor, never the count (the count is an exact fact about clients:
        the caller labels it non-private where it reports it)."""
        floor = self.accounted_shares(release)
        if not release.private or float(shares) >= floor:
            return None
        return (
            f"fewer noise shares arrived than mechanism {self.name!r}'s floor min_shares={self.min_shares:g} of the "
            f"expected cohort ({floor:g} shares), with which every round is accounted: releasing the round would "
            "spend more than its epsilon"
        )

    def describe(self) -> str:
        gamma = "heuristic" if self.gamma is None else f"{self.gamma:g}"
        return (
            f"{self.noise_kind.replace('-', ' ')} shares on a {self.bits}-bit secure sum (k={self.k_stddevs:g}, "
            f"beta={self.beta:.3g}, gamma={gamma}, rotation: randomized Hadamard)"
        )


@register_noise_source
@dataclass
class DDGaussNoise(DistributedDiscreteNoise):
    """The distributed discrete Gaussian (Kairouz, Liu and Steinke, ICML 2021): each client adds discrete Gaussian
    noise of std ``z c / sqrt(n)`` (in grid units ``/ gamma``), sampled exactly (Canonne, Kamath and Steinke)."""

    name: ClassVar[str] = "ddgauss"
    noise_kind: ClassVar[str] = "discrete-gaussian"
    accountants: ClassVar[tuple[str, ...]] = ("rdp",)
    release_class: ClassVar[type] = DDGaussRound


@register_noise_source
@dataclass
class SkellamNoise(DistributedDiscreteNoise):
    """Distributed Skellam noise (Agarwal, Kairouz and Liu, NeurIPS 2021): each client adds the difference of two
    Poisson draws of mean ``mu / 2``, ``mu`` its noise variance in grid units; sums of Skellams are Skellam, so the
    aggregate is exactly Skellam (no tau term)."""

    name: ClassVar[str] = "skellam"
    noise_kind: ClassVar[str] = "skellam"
    accountants: ClassVar[tuple[str, ...]] = ("rdp",)
    release_class: ClassVar[type] = SkellamRound
    k_stddevs: float = 3.0
