"""Distributed discrete noise: the arithmetic that lets clipped client updates be summed by secure aggregation.

Secure aggregation sums integers modulo ``2^b``, never floats. The distributed discrete Gaussian (Kairouz, Liu and
Steinke, ICML 2021, arXiv 2102.06387) and distributed Skellam (Agarwal, Kairouz and Liu, NeurIPS 2021, arXiv
2110.04995) mechanisms therefore quantise each client's update before it leaves the client:

1. flatten, and rotate with a randomized Hadamard transform (padding to a power of two; the rotation is public,
   one per round), which spreads the update's norm over the coordinates so that few of them are large;
2. clip in L2 to ``c`` and scale by ``1 / gamma`` (the grid step ``gamma``);
3. round each coordinate randomly to a neighbouring integer (unbiased); with conditional rounding (``beta > 0``)
   re-round until the rounded vector's norm is within the inflated bound, which caps the sensitivity;
4. add the client's own integer noise (discrete Gaussian or Skellam);
5. reduce modulo ``2^b``.

The server sums the vectors modulo ``2^b``, maps the sum back to signed values in ``[-2^(b-1), 2^(b-1))``, divides by
the scale and inverts the rotation. Everything here is NumPy on float64 and int64: every integer a client sends is
exact, and the sum of up to ``2^21`` clients' ``b <= 32``-bit vectors fits in an int64 before the reduction.

The formulas for the scale and for the sensitivity after rounding are TensorFlow Federated's
(``aggregators/distributed_dp.py::_heuristic_scale_factor``, ``aggregators/discretization.py``) and the papers'
(``../shared/reference/distributed-dp-secagg.md``); the accounting is in :mod:`fedsim.privacy.discrete`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

#: the widest modulus: 32 bits, as Flower's SecAgg+ (``modulus_range = 2**32``)
MAX_BITS = 32
#: the largest value a scaled, rounded coordinate may take: integers are exact in float64 up to 2^53; keep a margin of
#: 2^3 for the noise and the rounding
MAX_SCALED = float(2**50)


def padded_dim(dim: int) -> int:
    """The dimension after padding to a power of two (the randomized Hadamard transform's length)."""
    if dim < 1:
        raise ValueError(f"dimension must be >= 1, got {dim}")
    return 1 << (int(dim) - 1).bit_length()


def heuristic_scale(
    local_std: float, clip: float, bits: int, clients: float, dim: int, k_stddevs: float, rho: float = 1.0
) -> float:
    """The scale ``1 / gamma`` that keeps ``k_stddevs`` standard deviations of the summed, noised, quantised vector of
    ``clients`` clients inside ``b`` bits (TFF's ``_heuristic_scale_factor``; Kairouz et al. Sections 4.2 and 4.4):
    solves ``2^b = 2 k sqrt(rho / d (c n)^2 + (gamma^2 / 4 + sigma^2) n) / gamma`` for gamma, i.e.

        1 / gamma = sqrt(2^(2b) - n k^2) / (2 k sqrt(rho / d * c^2 n^2 + n sigma^2))

    ``local_std``: each client's noise std in the update's own units; ``dim``: the padded dimension; ``rho``: the
    rotation's flatness (1 for the randomized Hadamard transform, Lemma 29)."""
    check_bits(bits, clients, k_stddevs)
    n = float(clients)
    numer = math.sqrt(2.0 ** (2 * bits) - n * k_stddevs**2)
    denom = 2.0 * k_stddevs * math.sqrt(rho / dim * clip**2 * n**2 + n * local_std**2)
    return numer / denom


def bits_needed(clients: float, k_stddevs: float) -> int:
    """The fewest bits ``b`` with ``2^b >= n`` and ``2^(2b) > n k^2`` (the modulus must hold the sum of ``n``
    clients' values and ``k`` standard deviations of it)."""
    n = max(float(clients), 1.0)
    b = max(math.ceil(math.log2(n)), 1)
    while b <= MAX_BITS and 2 * b * math.log(2.0) <= math.log(n) + 2 * math.log(k_stddevs):
        b += 1
    return b  # MAX_BITS + 1: no modulus fedsim allows holds it


def check_bits(bits: int, clients: float, k_stddevs: float) -> None:
    """Refuse a modulus that cannot hold ``clients`` clients' sum: ``b < log2 n`` or ``2^(2b) <= n k^2`` (a
    :class:`fedsim.validation.PrivacyInputError` on ``bits`` naming the bits needed), or more than :data:`MAX_BITS`
    bits."""
    from fedsim.validation import PrivacyInputError

    if isinstance(bits, bool) or int(bits) != bits or not 1 <= bits <= MAX_BITS:
        raise PrivacyInputError(
            "bits", bits, f"must be an integer in [1, {MAX_BITS}] (the secure sum's modulus 2^bits)"
        )
    n = float(clients)
    if 2.0**bits < n or 2 * bits * math.log(2.0) <= math.log(max(n, 1.0)) + 2 * math.log(k_stddevs):
        raise PrivacyInputError(
            "bits",
            bits,
            f"cannot hold the sum of {n:g} clients with k_stddevs={k_stddevs:g} standard deviations inside the "
            f"modulus (needs 2^bits >= n and 2^(2 bits) > n k^2): "
            + (
                f"use bits >= {need}, fewer clients per round, or a smaller k_stddevs"
                if (need := bits_needed(n, k_stddevs)) <= MAX_BITS
                else f"no modulus up to {MAX_BITS} bits does; use fewer clients per round or a smaller k_stddevs"
            ),
        )


def inflated_l2_bound(l2_scaled: float, beta: float, dim: int) -> float:
    """The L2 norm bound of a vector of norm at most ``l2_scaled`` (already in grid units) after randomized rounding
    of its ``dim`` coordinates (Kairouz et al. Theorem 1 / Proposition 22; TFF's ``inflated_l2_norm_bound``):

        min( c + sqrt(d),  sqrt( c^2 + d / 4 + sqrt(2 ln(1/beta)) (c + sqrt(d) / 2) ) )

    the second term only with conditional rounding (``beta > 0``), which re-rounds until the norm is within it."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if not l2_scaled > 0:
        raise ValueError(f"the scaled L2 bound must be > 0, got {l2_scaled}")
    bound = l2_scaled + math.sqrt(dim)
    if beta == 0:
        return bound
    squared = (
        l2_scaled**2 + 0.25 * dim + math.sqrt(2.0 * math.log(1.0 / beta)) * (l2_scaled + 0.5 * math.sqrt(dim))
    )
    return min(bound, math.sqrt(squared))


def rounded_l1_bound(l2_rounded: float, dim: int) -> float:
    """The L1 bound of an integer vector of L2 norm at most ``l2_rounded`` in ``dim`` coordinates: ``L1 <= sqrt(d) L2``,
    and for integers ``L1 <= L2^2``."""
    return l2_rounded * min(math.sqrt(dim), l2_rounded)


# ------------------------------------------------------------------------------------------------ the rotation


def _sylvester(m: int) -> np.ndarray:
    """The ``m x m`` Sylvester Hadamard matrix (entries +-1, unnormalised), ``m`` a power of two."""
    h = np.ones((1, 1))
    while h.shape[0] < m:
        h = np.block([[h, h], [h, -h]])
    return h


#: the first log2(64) = 6 butterfly levels act within contiguous blocks of 64, where they are one matrix product
_FWHT_BLOCK = 64
_FWHT_BLOCK_MATRIX = _sylvester(_FWHT_BLOCK)


def fwht(x: np.ndarray) -> np.ndarray:
    """The orthonormal fast Walsh-Hadamard transform of ``x`` along its last axis (a power-of-two length): ``H x /
    sqrt(n)`` with ``H`` the Sylvester-ordered Hadamard matrix. Orthonormal and symmetric, so it is its own inverse.

    ``H_n = H_(n/64) kron H_64``: the six levels within blocks of 64 coordinates are one matrix product with
    ``H_64`` (NumPy's butterflies on stride-1, 2, 4 views are the slow ones), the remaining ``log2(n / 64)`` levels
    are butterflies on reshaped views between two buffers. No Python loop over coordinates: 40 to 60 ms for
    ``n = 2^20`` on one shared core."""
    v = np.asarray(x, dtype=np.float64)
    n = v.shape[-1] if v.ndim else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {n}")
    lead = v.shape[:-1]
    if n >= _FWHT_BLOCK:  # a new array: x is never written
        out = (v.reshape(*lead, n // _FWHT_BLOCK, _FWHT_BLOCK) @ _FWHT_BLOCK_MATRIX).reshape(v.shape)
        h = _FWHT_BLOCK
    else:
        out = v.copy()
        h = 1
    spare = np.empty_like(out)
    while h < n:
        src = out.reshape(*lead, n // (2 * h), 2, h)
        dst = spare.reshape(*lead, n // (2 * h), 2, h)
        np.add(src[..., 0, :], src[..., 1, :], out=dst[..., 0, :])
        np.subtract(src[..., 0, :], src[..., 1, :], out=dst[..., 1, :])
        out, spare = spare, out
        h *= 2
    out /= math.sqrt(n)
    return out


@functools.lru_cache(maxsize=4)
def rotation_signs(seed: int, dim_padded: int) -> np.ndarray:
    """The randomized Hadamard transform's diagonal of +-1 (float64) for one round: a function of the public
    ``seed`` the server chooses, so that every client rotates the same way and the server can invert it. Cached
    (read-only): every client of a round on one worker rotates with the same signs."""
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    signs = 1.0 - 2.0 * rng.integers(0, 2, size=int(dim_padded)).astype(np.float64)
    signs.setflags(write=False)
    return signs


def rotate(x: np.ndarray, seed: int) -> np.ndarray:
    """``H D x / sqrt(n)``: ``x`` (length ``d``) padded with zeros to :func:`padded_dim`, multiplied by the round's
    random signs and transformed. Orthogonal, so the L2 norm is unchanged (up to float rounding) and a clip before or
    after the rotation bounds the same norm; the rotation spreads that norm over the coordinates (Kairouz et al.
    Lemma 29), which keeps the scaled coordinates small and the rounding error and wrap-around rare."""
    v = np.asarray(x, dtype=np.float64).ravel()
    padded = np.zeros(padded_dim(v.size), dtype=np.float64)
    padded[: v.size] = v
    padded *= rotation_signs(seed, padded.size)
    return fwht(padded)


def unrotate(y: np.ndarray, seed: int, dim: int) -> np.ndarray:
    """The inverse of :func:`rotate`: ``D H y / sqrt(n)`` truncated to the first ``dim`` coordinates."""
    v = np.asarray(y, dtype=np.float64).ravel()
    if v.size != padded_dim(dim):
        raise ValueError(f"a rotated vector of dimension {dim} has length {padded_dim(dim)}, got {v.size}")
    out = fwht(v)
    out *= rotation_signs(seed, v.size)
    return out[: int(dim)].copy()


# ------------------------------------------------------------------------------------------------ the rounding


def stochastic_round(x: np.ndarray, rng: Any) -> np.ndarray:
    """Round each coordinate to ``floor(x)`` or ``floor(x) + 1``, up with probability ``x - floor(x)``: unbiased,
    ``E[r] = x`` (up to float64 uniforms). ``rng`` needs only ``random(size)``: a NumPy generator or
    :class:`~fedsim.round.randomness.OsEntropyGenerator`."""
    v = np.asarray(x, dtype=np.float64)
    low = np.floor(v)
    up = _uniform(rng, v.size).reshape(v.shape) < (v - low)
    return low.astype(np.int64) + up.astype(np.int64)


def conditional_round(
    x: np.ndarray, rng: Any, bound: float, *, max_tries: int = 1000
) -> tuple[np.ndarray, int]:
    """Stochastic rounding, repeated until the rounded vector's L2 norm is at most ``bound`` (grid units; ``inf``:
    one rounding, no condition). Returns the rounded vector and the number of roundings drawn.

    This is Kairouz et al.'s conditional randomized rounding: conditioning caps the sensitivity of the sum at the
    inflated bound (:func:`inflated_l2_bound`), at a bias that is exponentially small in the margin. The norm is
    computed in float64 (squares of coordinates near :data:`MAX_SCALED` would overflow int64)."""
    if not bound > 0:
        raise ValueError(f"the rounding bound must be > 0, got {bound}")
    if int(max_tries) < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    norm = math.nan
    for tries in range(1, int(max_tries) + 1):
        rounded = stochastic_round(x, rng)
        if math.isinf(bound):
            return rounded, tries
        norm = float(np.linalg.norm(rounded.astype(np.float64)))
        if norm <= bound:
            return rounded, tries
    # the message names the public bound only: the rounded norm is a fact about the update, and a client's error text
    # reaches the server (Flower sends it in the error reply)
    raise RuntimeError(
        f"conditional rounding failed {max_tries} times: the rounded norm stays above the bound {bound:.6g} (beta too "
        "large for the dimension?)"
    )


# ------------------------------------------------------------------------------------------------ the samplers
#
# Every sampler below draws only ``rng.random(size)`` (uniforms in [0, 1)), the one method a seeded NumPy generator
# and the OS-entropy generator share, and is vectorised: it draws batches sized by the expected acceptance rate and
# loops over batches, never over samples. They are exact in distribution up to float64 arithmetic: the Bernoulli
# trials compare a 53-bit uniform with a float64 probability, and the logarithms are float64 (the samplers of
# Canonne et al. are exact in rational arithmetic; the floating-point version is what jax_privacy and TFF ship).


def _uniform(rng: Any, n: int) -> np.ndarray:
    return np.asarray(rng.random(int(n)), dtype=np.float64).reshape(int(n))


def _size(size: int) -> int:
    if int(size) != size or size < 0:
        raise ValueError(f"size must be a non-negative integer, got {size}")
    return int(size)


def _accept_batches(draw: Any, size: int, first_rate: float) -> np.ndarray:
    """Fill ``size`` samples from ``draw(n) -> accepted samples of n proposals``: the first batch sized by the
    expected acceptance rate ``first_rate``, the next ones by the rate observed so far (with a 10% margin)."""
    chunks: list[np.ndarray] = []
    have = proposed = accepted = 0
    rate = first_rate
    while have < size:
        need = size - have
        n = int(math.ceil(need / rate * 1.1)) + 32
        got = draw(n)
        chunks.append(got)
        have += got.size
        proposed += n
        accepted += got.size
        rate = max(accepted / proposed, 1e-3)
    out = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    return out[:size].astype(np.int64, copy=False)


def _discrete_laplace(rng: Any, t: int, n: int) -> np.ndarray:
    """Up to ``n`` draws of the discrete Laplace ``P(y) ∝ exp(-|y| / t)`` from ``2n`` uniforms (fewer: the
    rejected ``(-, 0)`` proposals are dropped). A geometric magnitude ``P(G >= k) = exp(-k / t)`` by inversion,
    ``G = floor(-t ln U)`` with ``U`` in ``(0, 1]``, and a random sign; the negative zero is rejected so that zero
    is not counted twice (Canonne et al., Algorithm 2)."""
    u = _uniform(rng, 2 * n)
    magnitude = np.floor(-float(t) * np.log1p(-u[:n]))  # 1 - U in (0, 1]
    negative = u[n:] < 0.5
    keep = ~(negative & (magnitude == 0))
    return np.where(negative, -magnitude, magnitude)[keep]


def discrete_gaussian(rng: Any, sigma: float, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian ``P(y) ∝ exp(-y^2 / (2 sigma^2))`` on the integers (int64).

    Canonne, Kamath and Steinke (NeurIPS 2020), Algorithm 3: propose from the discrete Laplace with ``t =
    floor(sigma) + 1`` and accept with probability ``exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2))``. About 3 in 4
    proposals are accepted for large ``sigma`` (one in 3 at ``sigma = 0.5``); batches are oversampled as in
    jax_privacy's ``experimental/discrete_gaussian.py``. ``sigma = 0``: zeros. Exact up to float64 (see above)."""
    n = _size(size)
    sigma = float(sigma)
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if sigma == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    t = math.floor(sigma) + 1
    shift = sigma**2 / t
    two_var = 2.0 * sigma**2

    def draw(m: int) -> np.ndarray:
        y = _discrete_laplace(rng, t, m)
        accept = _uniform(rng, y.size) < np.exp(-((np.abs(y) - shift) ** 2) / two_var)
        return y[accept]

    return _accept_batches(draw, n, 0.3 if sigma < 1 else 0.7)


#: log(k!) for k < _LOG_FACTORIAL_TABLE (exact to float64); Stirling's series above it
_LOG_FACTORIAL_TABLE = 32
_LOG_FACTORIALS = np.array([math.lgamma(k + 1.0) for k in range(_LOG_FACTORIAL_TABLE)])
#: below this mean, Poisson draws invert the CDF; at and above it, PTRS (valid for lam >= 10)
_POISSON_INVERSION_MAX = 10.0


def _poisson_log_pmf(k: np.ndarray, lam: float) -> np.ndarray:
    """``log P(K = k) = k ln lam - lam - ln k!`` for Poisson(``lam``), accurate for every ``lam`` up to 2^50.

    Written directly, the three terms are each about ``lam`` (1e12 for a large grid-unit variance) and cancel to
    ``O(log lam)``, losing every digit the rejection test needs. So for ``k >= 32`` it uses Stirling's series,
    ``ln k! = k ln k - k + ln(2 pi k) / 2 + 1/(12k) - 1/(360k^3) + 1/(1260k^5) - 1/(1680k^7) + 1/(1188k^9)``
    (truncation error below 1e-19 there), and rewrites the large terms as ``(k - lam) - k log1p((k - lam) / lam)``,
    whose parts are of the size of ``k - lam`` (about ``sqrt(lam)``)."""
    k = np.asarray(k, dtype=np.float64)
    out = np.empty_like(k)
    small = k < _LOG_FACTORIAL_TABLE
    ks = k[small]
    out[small] = ks * math.log(lam) - lam - _LOG_FACTORIALS[ks.astype(np.int64)]
    kl = k[~small]
    delta = kl - lam
    inv = 1.0 / kl
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 * (1 / 1680 - inv2 / 1188))))
    out[~small] = delta - kl * np.log1p(delta / lam) - 0.5 * np.log(2.0 * math.pi * kl) - series
    return out


def _poisson_inversion(rng: Any, lam: float, n: int) -> np.ndarray:
    """Poisson(``lam``) for small ``lam`` by inverting its CDF: one uniform per draw, located in the CDF table
    ``k = 0 .. lam + 20 sqrt(lam) + 40`` by binary search (the truncated tail's mass is below 1e-30; the table is
    renormalised so that its last entry is exactly 1)."""
    top = int(lam + 20.0 * math.sqrt(lam) + 40.0)
    pmf = np.exp(-lam) * np.concatenate([[1.0], np.cumprod(lam / np.arange(1, top + 1, dtype=np.float64))])
    cdf = np.cumsum(pmf)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, _uniform(rng, n), side="right").astype(np.int64)


def _poisson_ptrs(rng: Any, lam: float, n: int) -> np.ndarray:
    """Poisson(``lam``), ``lam >= 10``, by Hormann's transformed rejection with squeeze (PTRS; "The transformed
    rejection method for generating Poisson random variables", Insurance: Mathematics and Economics 12, 1993), the
    algorithm and constants of NumPy's ``random_poisson_ptrs``, vectorised: two uniforms per proposal, about 85%
    accepted (most by the squeeze, without a logarithm). Exact: the final test compares with the true log pmf."""
    slam = math.sqrt(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2.0)

    def draw(m: int) -> np.ndarray:
        uv = _uniform(rng, 2 * m)
        u = uv[:m] - 0.5
        v = uv[m:]
        us = 0.5 - np.abs(u)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.floor((2.0 * a / us + b) * u + lam + 0.43)
        squeeze = (us >= 0.07) & (v <= vr)
        rest = ~squeeze & np.isfinite(k) & (k >= 0) & ~((us < 0.013) & (v > us))
        idx = np.flatnonzero(rest)
        kr, usr = k[idx], us[idx]
        with np.errstate(divide="ignore"):
            lhs = np.log(v[idx]) + log_invalpha - np.log(a / (usr * usr) + b)
        accept = squeeze
        accept[idx[lhs <= _poisson_log_pmf(kr, lam)]] = True
        return k[accept]

    return _accept_batches(draw, n, 0.85)


def poisson(rng: Any, lam: float, size: int) -> np.ndarray:
    """``size`` Poisson(``lam``) draws (int64) from uniforms only: CDF inversion below ``lam = 10``, PTRS from there
    (no normal approximation at any ``lam``; ``lam`` up to 2^50, where integers are still exact). ``lam = 0``:
    zeros."""
    n = _size(size)
    lam = float(lam)
    if not (0 <= lam <= MAX_SCALED):
        raise ValueError(f"the Poisson mean must be in [0, 2^50], got {lam}")
    if lam == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if lam < _POISSON_INVERSION_MAX:
        return _poisson_inversion(rng, lam, n)
    return _poisson_ptrs(rng, lam, n)


def skellam(rng: Any, mu: float, size: int) -> np.ndarray:
    """``size`` draws of the symmetric Skellam distribution of variance ``mu`` (int64): the difference of two
    independent Poisson(``mu / 2``) draws (Agarwal, Kairouz and Liu, NeurIPS 2021). Sums of independent Skellams
    are Skellam, so ``n`` clients' noise sums to Skellam(``n mu``) exactly. ``mu = 0``: zeros."""
    n = _size(size)
    mu = float(mu)
    if not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"mu must be finite and >= 0, got {mu}")
    return poisson(rng, mu / 2.0, n) - poisson(rng, mu / 2.0, n)


def _skellam_of_std(rng: Any, scale: float, size: int) -> np.ndarray:
    return skellam(rng, float(scale) ** 2, size)


#: each client's integer noise by its distribution (a mechanism's ``noise_kind``), drawn as ``f(rng, std, size)``
#: with ``std`` in grid units: the discrete Gaussian with ``sigma = std`` (its std is ``sigma`` up to
#: ``O(exp(-2 pi^2 sigma^2))`` for ``sigma >= 1``), or Skellam of variance ``mu = std^2``
LOCAL_NOISES: dict[str, Any] = {"discrete-gaussian": discrete_gaussian, "skellam": _skellam_of_std}
NOISE_KINDS = tuple(LOCAL_NOISES)


def local_noise(kind: str, rng: Any, scale: float, size: int) -> np.ndarray:
    """One client's integer noise of distribution ``kind`` (:data:`LOCAL_NOISES`) and std ``scale`` grid units."""
    draw = LOCAL_NOISES.get(kind)
    if draw is None:
        raise ValueError(f"unknown local noise kind {kind!r}: use one of {', '.join(NOISE_KINDS)}")
    return draw(rng, scale, size)


# ------------------------------------------------------------------------------------------------ the modulus


def to_modular(v: np.ndarray, bits: int) -> np.ndarray:
    """Signed integers to their residues in ``[0, 2^bits)`` (int64), what a client hands to secure aggregation."""
    return np.mod(np.asarray(v, dtype=np.int64), np.int64(1) << np.int64(bits))


def from_modular(s: np.ndarray, bits: int) -> np.ndarray:
    """Residues mod ``2^bits`` (any int64, reduced first) to the signed representatives in
    ``[-2^(bits-1), 2^(bits-1))``: the server's reading of the secure sum."""
    modulus = np.int64(1) << np.int64(bits)
    r = np.mod(np.asarray(s, dtype=np.int64), modulus)
    return np.where(r >= modulus // 2, r - modulus, r)


# ------------------------------------------------------------------------------------------------ the pipeline


def encode(
    update: np.ndarray,
    *,
    clip: float,
    scale: float,
    bits: int,
    beta: float,
    rotation_seed: int,
    noise_kind: str,
    local_std_grid: float,
    rng: Any,
    noise_rng: Any = None,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """One client's update to its vector for secure aggregation: residues mod ``2^bits`` (int64) of length
    :func:`padded_dim`, and diagnostics.

    Clip in L2 to ``clip``, rotate with the round's public ``rotation_seed``, scale by ``scale = 1 / gamma``, round
    (conditionally when ``beta > 0``, to :func:`inflated_l2_bound` of ``clip * scale``), add ``local_noise`` of
    std ``local_std_grid`` (drawn from ``noise_rng`` when given, else ``rng``), reduce mod ``2^bits``.

    ``info``: ``norm`` (before clipping), ``tries`` (roundings drawn), ``rounding_error`` (``r - y``, grid units;
    its sum over clients is a NON-PRIVATE diagnostic, never released), ``signed`` (``r + noise``: a simulator sums it
    to count wrap-arounds, a deployment ignores it), ``non_finite``. A non-finite update draws nothing and returns
    ``(None, {"norm": nan, "non_finite": True})``; a scaled coordinate above :data:`MAX_SCALED` (integers no longer
    exact) is a :class:`ValueError`."""
    if not bits == int(bits) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [1, {MAX_BITS}], got {bits}")
    if not (clip > 0 and scale > 0 and math.isfinite(clip) and math.isfinite(scale)):
        raise ValueError(f"clip and scale must be finite and > 0, got clip={clip}, scale={scale}")
    if (
        clip * scale > MAX_SCALED
    ):  # |y_i| <= ||y|| <= clip * scale: a check on public values, before the update
        raise ValueError(
            f"clip * scale = {clip * scale:.6g} exceeds 2^50, beyond which integers are not exact in float64: lower "
            f"the scale ({scale:g}) or the clip ({clip:g})"
        )
    x = np.asarray(update, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        return None, {"norm": math.nan, "non_finite": True}
    norm = float(np.linalg.norm(x))
    if norm > clip:
        x = x * (clip / norm)
    y = rotate(x, rotation_seed) * float(scale)
    bound = inflated_l2_bound(clip * scale, beta, y.size) if beta > 0 else math.inf
    rounded, tries = conditional_round(y, rng, bound)
    noise = local_noise(noise_kind, noise_rng if noise_rng is not None else rng, local_std_grid, y.size)
    signed = rounded + noise
    info = {
        "norm": norm,
        "tries": tries,
        "rounding_error": rounded.astype(np.float64) - y,
        "signed": signed,
        "non_finite": False,
    }
    return to_modular(signed, bits), info


def decode(
    total: np.ndarray,
    *,
    bits: int,
    scale: float,
    rotation_seed: int,
    dim: int,
    signed_total: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """The server's side: the exact sum ``total`` of the clients' modular vectors (int64, or float64 holding
    integers; reduced or not) to the summed update (float64, length ``dim``) and the number of wrapped coordinates.

    ``total mod 2^bits`` read as signed in ``[-2^(bits-1), 2^(bits-1))``, divided by ``scale``, rotated back. A
    coordinate wraps when the true signed sum left that range: the residue cannot tell, so ``wrapped`` is counted
    only when the caller knows the signed sum (``signed_total``, the sum of the clients' ``info["signed"]`` in a
    simulation) and is ``-1`` (unknown) otherwise, as in a deployment."""
    t = np.asarray(total)
    if t.ndim != 1 or t.size != padded_dim(dim):
        raise ValueError(
            f"the secure sum of dimension {dim} has length {padded_dim(dim)}, got shape {t.shape}"
        )
    if t.dtype.kind == "f":
        if not (np.all(np.isfinite(t)) and np.all(t == np.rint(t)) and np.all(np.abs(t) <= 2.0**53)):
            raise ValueError("the secure sum must hold exact integers")
        t = t.astype(np.int64)
    elif t.dtype.kind not in "iu":
        raise ValueError(f"the secure sum must be integers, got dtype {t.dtype}")
    signed = from_modular(t.astype(np.int64), bits)
    wrapped = -1
    if signed_total is not None:
        wrapped = int(np.count_nonzero(signed != np.asarray(signed_total, dtype=np.int64)))
    return unrotate(signed.astype(np.float64) / float(scale), rotation_seed, dim), wrapped
