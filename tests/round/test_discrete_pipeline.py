"""The client and server pipeline of distributed discrete noise (fedsim/round/discrete.py).

The transform is checked against the Hadamard matrix itself; the samplers against their exact pmfs (the discrete
Gaussian's computed on +-20 sigma, Skellam's and Poisson's from SciPy) by chi-square goodness of fit with fixed
seeds, and by their moments; the pipeline end to end against the clipped sum it should recover, with its error
predicted from the rounding and noise variances.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from fedsim.round.discrete import (
    _poisson_log_pmf,
    conditional_round,
    decode,
    discrete_gaussian,
    encode,
    from_modular,
    fwht,
    inflated_l2_bound,
    local_noise,
    padded_dim,
    poisson,
    rotate,
    rotation_signs,
    skellam,
    stochastic_round,
    to_modular,
    unrotate,
)
from fedsim.round.randomness import OsEntropyGenerator

SAMPLES = 200_000
BETA = math.exp(-0.5)  # the research runs' conditional rounding
P_MIN = 1e-3


def _chisquare_p(samples: np.ndarray, lo: int, pmf: np.ndarray, min_expected: float = 20.0) -> float:
    """Chi-square goodness of fit of integer ``samples`` to ``pmf`` on ``lo, lo + 1, ...``: adjacent values merged
    left to right until each bin expects ``min_expected`` samples (a short last bin joins its neighbour); samples
    beyond the support count in the end bins. The support must hold all but a negligible mass."""
    pmf = np.asarray(pmf, dtype=np.float64)
    assert abs(pmf.sum() - 1.0) < 1e-9, pmf.sum()
    counts = np.bincount(np.clip(samples - lo, 0, pmf.size - 1).astype(np.int64), minlength=pmf.size)
    expected = pmf / pmf.sum() * samples.size
    edges, acc = [0], 0.0
    for i, e in enumerate(expected):
        acc += e
        if acc >= min_expected:
            edges.append(i + 1)
            acc = 0.0
    if edges[-1] != pmf.size:
        edges[-1] = pmf.size  # the short tail joins the last full bin
    obs = np.add.reduceat(counts, edges[:-1])
    exp = np.add.reduceat(expected, edges[:-1])
    assert obs.size >= 3, "too few bins for a meaningful test"
    return float(scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def _discrete_gaussian_pmf(sigma: float) -> tuple[int, np.ndarray]:
    half = int(math.ceil(20 * sigma)) + 2
    k = np.arange(-half, half + 1, dtype=np.float64)
    w = np.exp(-(k**2) / (2 * sigma**2))
    return -half, w / w.sum()


def _moments(lo: int, pmf: np.ndarray) -> tuple[float, float, float]:
    k = np.arange(lo, lo + pmf.size, dtype=np.float64)
    mean = float(np.sum(k * pmf))
    var = float(np.sum((k - mean) ** 2 * pmf))
    m4 = float(np.sum((k - mean) ** 4 * pmf))
    return mean, var, m4


def _check_moments(samples: np.ndarray, mean: float, var: float, m4: float) -> None:
    """Sample mean and variance within 5 standard errors of the exact ones."""
    n = samples.size
    assert abs(samples.mean() - mean) < 5 * math.sqrt(var / n), (samples.mean(), mean)
    assert abs(samples.var() - var) < 5 * math.sqrt((m4 - var**2) / n), (samples.var(), var)


# ------------------------------------------------------------------------------------------------ rotation


@pytest.mark.parametrize("n", [1, 2, 8, 32, 64, 128, 1024])
def test_fwht_is_the_normalized_hadamard_matrix(n):
    # both code paths: butterflies only (n < 64) and the block matrix product followed by butterflies
    expected = scipy.linalg.hadamard(n) / math.sqrt(n)
    assert np.allclose(fwht(np.eye(n)), expected, atol=1e-15, rtol=0)


def test_fwht_is_orthonormal_self_inverse_and_leaves_its_input_alone():
    x = np.random.default_rng(0).normal(size=(3, 4096))
    before = x.copy()
    y = fwht(x)
    assert np.array_equal(x, before)
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13, atol=0)
    assert np.allclose(fwht(y), x, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(np.ones(12))


def test_rotation_round_trip_preserves_the_norm_and_depends_on_the_seed():
    x = np.random.default_rng(1).normal(size=1000)
    signs = rotation_signs(7, 1024)
    assert signs.dtype == np.float64 and set(np.unique(signs)) == {-1.0, 1.0}
    assert np.array_equal(signs, rotation_signs(7, 1024))
    y = rotate(x, 7)
    assert y.shape == (padded_dim(1000),) == (1024,)
    assert math.isclose(np.linalg.norm(y), np.linalg.norm(x), rel_tol=1e-13)
    assert np.allclose(unrotate(y, 7, 1000), x, rtol=0, atol=1e-13)
    assert not np.allclose(rotate(x, 8), y)
    # the rotation spreads a spike over every coordinate (what keeps the scaled coordinates small)
    spike = np.zeros(1000)
    spike[3] = 1.0
    assert np.allclose(np.abs(rotate(spike, 7)), 1 / math.sqrt(1024))
    with pytest.raises(ValueError, match="length 1024"):
        unrotate(np.ones(512), 7, 1000)


# ------------------------------------------------------------------------------------------------ rounding


@pytest.mark.parametrize(
    "rng", [np.random.default_rng(2), OsEntropyGenerator()], ids=["seeded", "os-entropy"]
)
def test_stochastic_round_is_unbiased(rng):
    x = np.array([-2.75, -0.5, -0.1, 0.0, 0.3, 1.0, 3.9, 1e6 + 0.25])
    draws = np.stack([stochastic_round(x, rng) for _ in range(20_000)])
    assert draws.dtype == np.int64
    assert np.all((draws == np.floor(x)) | (draws == np.floor(x) + 1))
    frac = x - np.floor(x)
    se = np.sqrt(frac * (1 - frac) / draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 5 * se + 1e-12)


def test_conditional_round_respects_the_bound_and_names_it_when_it_cannot():
    x = np.full(
        100, 0.5
    )  # rounded norm^2 ~ Binomial(100, 1/2): a bound of 6.5 (<= 42 ones) holds ~7% of the time
    rng = np.random.default_rng(3)
    tries = []
    for _ in range(50):
        r, t = conditional_round(x, rng, 6.5)
        assert np.linalg.norm(r) <= 6.5
        tries.append(t)
    assert max(tries) > 1
    r, t = conditional_round(x, rng, math.inf)
    assert t == 1 and r.shape == x.shape
    with pytest.raises(RuntimeError, match=r"rounded norm stays above the bound 1 "):
        conditional_round(x, rng, 1.0, max_tries=5)


# ------------------------------------------------------------------------------------------------ samplers


@pytest.mark.parametrize("sigma", [0.5, 1.3, 4.0, 25.0])
def test_discrete_gaussian_matches_its_exact_pmf(sigma):
    samples = discrete_gaussian(np.random.default_rng(4), sigma, SAMPLES)
    assert samples.dtype == np.int64 and samples.shape == (SAMPLES,)
    lo, pmf = _discrete_gaussian_pmf(sigma)
    mean, var, m4 = _moments(lo, pmf)
    if sigma >= 1:
        assert math.isclose(var, sigma**2, rel_tol=1e-6)  # the discrete Gaussian's variance is sigma^2 there
    _check_moments(samples, mean, var, m4)
    assert _chisquare_p(samples, lo, pmf) > P_MIN


def test_discrete_gaussian_from_os_entropy_and_edge_cases():
    samples = discrete_gaussian(OsEntropyGenerator(), 4.0, 50_000)
    lo, pmf = _discrete_gaussian_pmf(4.0)
    _check_moments(samples, *_moments(lo, pmf))
    assert np.array_equal(discrete_gaussian(np.random.default_rng(0), 0.0, 5), np.zeros(5, dtype=np.int64))
    assert discrete_gaussian(np.random.default_rng(0), 3.0, 0).shape == (0,)
    a = discrete_gaussian(np.random.default_rng(9), 3.0, 1000)
    assert np.array_equal(a, discrete_gaussian(np.random.default_rng(9), 3.0, 1000))
    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(np.random.default_rng(0), -1.0, 5)


@pytest.mark.parametrize("mu", [0.3, 5.0, 80.0, 1e4])
def test_skellam_matches_its_exact_pmf(mu):
    samples = skellam(np.random.default_rng(5), mu, SAMPLES)
    assert samples.dtype == np.int64
    half = int(10 * math.sqrt(mu)) + 20
    support = np.arange(-half, half + 1)
    pmf = scipy.stats.skellam(mu / 2, mu / 2).pmf(support)
    _, var, m4 = _moments(-half, pmf)
    assert math.isclose(var, mu, rel_tol=1e-9)
    _check_moments(samples, 0.0, var, m4)
    assert _chisquare_p(samples, -half, pmf) > P_MIN


@pytest.mark.parametrize("lam", [0.15, 2.5, 9.99, 10.0, 50.0, 1e3, 1e6])
def test_poisson_matches_its_exact_pmf_on_both_paths(lam):
    # below 10: CDF inversion; from 10: PTRS transformed rejection
    samples = poisson(np.random.default_rng(6), lam, SAMPLES)
    lo = max(0, int(lam - 10 * math.sqrt(lam)) - 20)
    hi = int(lam + 10 * math.sqrt(lam)) + 20
    pmf = scipy.stats.poisson(lam).pmf(np.arange(lo, hi + 1))
    _check_moments(samples, *_moments(lo, pmf))
    assert _chisquare_p(samples, lo, pmf) > P_MIN


def test_poisson_log_pmf_is_accurate_where_its_terms_cancel():
    # at lam = 1e12 the terms of k ln lam - lam - ln k! are ~1e13 each: a direct float64 evaluation loses the
    # rejection test's digits. Reference: 40-digit mpmath.
    mpmath.mp.dps = 40
    for lam in (37.5, 1e3, 1e12, 2.0**50):
        ks = np.array([0, 5, 31, 32, 33, lam - 3 * math.sqrt(lam), lam, lam + 7 * math.sqrt(lam)])
        ks = np.floor(ks[ks >= 0])
        ours = _poisson_log_pmf(ks, lam)
        for k, got in zip(ks, ours, strict=True):
            ref = mpmath.mpf(k) * mpmath.log(lam) - lam - mpmath.loggamma(mpmath.mpf(k) + 1)
            assert abs(got - float(ref)) <= 1e-9 * max(1.0, abs(float(ref))), (lam, k, got, ref)


def test_large_mean_poisson_and_skellam_moments():
    # grid-unit variances of 1e12 are realistic (sigma_grid ~ 1e6): still exact, still fast
    rng = np.random.default_rng(7)
    lam = 1e12
    samples = poisson(rng, lam, 50_000)
    assert abs(samples.mean() - lam) < 5 * math.sqrt(lam / samples.size)
    assert abs(samples.var() / lam - 1) < 5 * math.sqrt(2 / samples.size)
    s = skellam(OsEntropyGenerator(), 1e6, 50_000)
    assert abs(s.mean()) < 5 * math.sqrt(1e6 / s.size)
    assert abs(s.var() / 1e6 - 1) < 5 * math.sqrt(2 / s.size)
    assert np.array_equal(skellam(rng, 0.0, 4), np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="Poisson mean"):
        poisson(rng, 2.0**60, 3)


def test_local_noise_kinds():
    rng = np.random.default_rng(8)
    g = local_noise("discrete-gaussian", rng, 3.0, 100_000)
    s = local_noise("skellam", rng, 3.0, 100_000)
    for x in (g, s):  # std 3 either way (the discrete Gaussian's variance is sigma^2 up to 1e-77 here)
        assert x.dtype == np.int64
        assert abs(x.var() / 9.0 - 1) < 5 * math.sqrt(2 / x.size)
    with pytest.raises(ValueError, match="discrete-gaussian, skellam"):
        local_noise("laplace", rng, 3.0, 10)


# ------------------------------------------------------------------------------------------------ modulus


def test_modular_round_trip_and_sums():
    bits = 12
    rng = np.random.default_rng(10)
    v = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), size=5000)
    m = to_modular(v, bits)
    assert m.dtype == np.int64 and m.min() >= 0 and m.max() < 2**bits
    assert np.array_equal(from_modular(m, bits), v)
    assert from_modular(np.array([2 ** (bits - 1)]), bits)[0] == -(2 ** (bits - 1))
    # n clients: the reduced sum of residues is the residue of the signed sum, which reads back while in range
    clients = rng.integers(-40, 40, size=(30, 5000))
    signed_sum = clients.sum(axis=0)
    residue_sum = sum(to_modular(c, bits) for c in clients)
    assert np.array_equal(np.mod(residue_sum, 2**bits), to_modular(signed_sum, bits))
    assert np.array_equal(from_modular(residue_sum, bits), signed_sum)
    # out of range: the sum wraps, and the read-back differs exactly where it left [-2^(b-1), 2^(b-1))
    big = clients * 100
    read = from_modular(sum(to_modular(c, bits) for c in big), bits)
    outside = np.abs(big.sum(axis=0) + 0.5) > 2 ** (bits - 1)
    assert outside.any()
    assert np.array_equal(read != big.sum(axis=0), outside)


# ------------------------------------------------------------------------------------------------ pipeline


def _clients(n: int, d: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=d) * rng.uniform(0.2, 2.0) / math.sqrt(d) for _ in range(n)]


def _run(updates, *, bits, scale, std, kind="discrete-gaussian", beta=BETA, seed=11, clip=1.0):
    d = updates[0].size
    encoded = [
        encode(
            u,
            clip=clip,
            scale=scale,
            bits=bits,
            beta=beta,
            rotation_seed=seed,
            noise_kind=kind,
            local_std_grid=std,
            rng=np.random.default_rng([seed, i]),
        )
        for i, u in enumerate(updates)
    ]
    total = sum(v for v, _ in encoded)
    signed_total = sum(info["signed"] for _, info in encoded)
    summed, wrapped = decode(
        total, bits=bits, scale=scale, rotation_seed=seed, dim=d, signed_total=signed_total
    )
    return encoded, total, summed, wrapped


@pytest.mark.parametrize("kind", ["discrete-gaussian", "skellam"])
def test_encode_decode_recovers_the_clipped_sum(kind):
    n, d, bits, clip, scale, std = 20, 1000, 20, 1.0, 1000.0, 2.0
    updates = _clients(n, d, 12)
    encoded, total, summed, wrapped = _run(updates, bits=bits, scale=scale, std=std, kind=kind)
    clipped = [u * min(1.0, clip / np.linalg.norm(u)) for u in updates]
    assert any(np.linalg.norm(u) > clip for u in updates) and any(np.linalg.norm(u) < clip for u in updates)
    assert wrapped == 0
    bound = inflated_l2_bound(clip * scale, BETA, padded_dim(d))
    for (vec, info), u, c in zip(encoded, updates, clipped, strict=True):
        assert vec.dtype == np.int64 and vec.shape == (padded_dim(d),)
        assert vec.min() >= 0 and vec.max() < 2**bits
        assert info["norm"] == pytest.approx(np.linalg.norm(u)) and not info["non_finite"]
        assert info["tries"] >= 1
        rounded = rotate(c, 11) * scale + info["rounding_error"]
        assert np.allclose(rounded, np.rint(rounded), atol=1e-6)
        assert np.linalg.norm(rounded) <= bound
    # the sum's error per coordinate: rounding (variance <= 1/4) and noise (std^2) of n clients, in grid steps
    err = summed - np.sum(clipped, axis=0)
    sd = math.sqrt(n * (0.25 + std**2)) / scale
    assert np.max(np.abs(err)) < 6 * sd
    assert np.linalg.norm(err) < 1.2 * sd * math.sqrt(d)
    # the same error, exactly: the clients' rounding errors and noises, rotated back
    noise = sum(
        info["signed"] - np.rint(rotate(c, 11) * scale + info["rounding_error"]).astype(np.int64)
        for (_, info), c in zip(encoded, clipped, strict=True)
    )
    rounding = sum(info["rounding_error"] for _, info in encoded)
    assert np.allclose(err, unrotate((rounding + noise) / scale, 11, d), rtol=0, atol=1e-9)
    # float64 holding the same integers decodes the same; without the signed sum, wraps are unknown
    again, unknown = decode(total.astype(np.float64), bits=bits, scale=scale, rotation_seed=11, dim=d)
    assert np.array_equal(again, summed) and unknown == -1


def test_encode_is_reproducible_and_a_narrow_modulus_wraps():
    updates = _clients(20, 1000, 13)
    first = _run(updates, bits=20, scale=1000.0, std=2.0)
    second = _run(updates, bits=20, scale=1000.0, std=2.0)
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(first[0], second[0], strict=True))
    assert np.array_equal(first[2], second[2])
    other = _run(updates, bits=20, scale=1000.0, std=2.0, seed=14)
    assert not np.array_equal(first[1], other[1])
    # 8 bits hold +-128 grid steps; 20 clients' coordinates reach several hundred
    _, _, summed, wrapped = _run(updates, bits=8, scale=1000.0, std=2.0)
    assert wrapped > 0
    clipped_sum = np.sum([u * min(1.0, 1.0 / np.linalg.norm(u)) for u in updates], axis=0)
    # each wrapped coordinate is off by 2^8 grid steps, which the rotation back spreads over every coordinate
    assert np.linalg.norm(summed - clipped_sum) > 10 * np.linalg.norm(first[2] - clipped_sum)


def test_encode_edge_cases():
    u = np.ones(10)
    kwargs = dict(clip=1.0, bits=16, beta=0.0, rotation_seed=1, noise_kind="skellam", local_std_grid=3.0)
    vec, info = encode(np.array([1.0, np.nan]), scale=10.0, rng=None, **kwargs)
    assert vec is None and info["non_finite"] and math.isnan(info["norm"])
    with pytest.raises(ValueError, match="2\\^50"):
        encode(u, scale=1e17, rng=np.random.default_rng(0), **kwargs)
    # the noise from a separate stream (the OS's): rounding stays seeded, the noise does not
    a, ia = encode(u, scale=10.0, rng=np.random.default_rng(0), noise_rng=OsEntropyGenerator(), **kwargs)
    b, ib = encode(u, scale=10.0, rng=np.random.default_rng(0), noise_rng=OsEntropyGenerator(), **kwargs)
    assert np.array_equal(ia["rounding_error"], ib["rounding_error"]) and ia["tries"] == ib["tries"] == 1
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="length 16"):
        decode(np.zeros(8, dtype=np.int64), bits=16, scale=10.0, rotation_seed=1, dim=10)
    with pytest.raises(ValueError, match="exact integers"):
        decode(np.full(16, 0.5), bits=16, scale=10.0, rotation_seed=1, dim=10)
