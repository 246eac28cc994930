"""The matrix-factorization building blocks (issue 24, first part): strategy matrices and their sensitivity under a
participation schedule, checked against a brute-force maximum over every allowed pattern and against published
vectors. The vectors are jax_privacy's tests (google-deepmind/jax_privacy @ 8967688c,
tests/matrix_factorization/sensitivity_test.py and toeplitz_test.py) and values computed by an independent port of
its Toeplitz formula cross-checked against its generic bound; fedsim's code is its own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.round.matrix_factorization import (
    BLT,
    BLTNoise,
    ToeplitzNoise,
    brute_force_sensitivity,
    max_participation_sum,
    max_participations,
    prefix_sum_sqrt_coefficients,
    sensitivity,
    toeplitz,
    toeplitz_sensitivity,
)


def test_max_participations_as_jax_privacy_counts_them():
    got = [max_participations(5, b) for b in (1, 2, 3, 4, 5, 6)]
    assert got == [5, 3, 2, 2, 1, 1]
    assert [max_participations(5, 1, 2), max_participations(5, 2, 2), max_participations(5, 2, 4)] == [
        2,
        2,
        3,
    ]
    assert [max_participations(4, b) for b in (1, 2, 3, 4)] == [4, 2, 2, 1]


@pytest.mark.parametrize(
    ("x", "min_sep", "k", "want"),
    [
        ([1.0, 0.5, 0.5, 0.5, 0.1], 1, None, 2.6),
        ([1, 1, 0, 1, 0, 1], 1, None, 4.0),
        ([1, 1, 1, 1], 2, 2, 2.0),
        ([1, 1, 1, 1], 1, 0, 0.0),
        ([0, 1, 0], 2, 2, 1.0),
        ([-1.0, -2.0, -0.5], 1, None, 0.0),
    ],
)
def test_the_best_pattern_sum(x, min_sep, k, want):
    assert max_participation_sum(np.array(x, dtype=float), min_sep, k) == pytest.approx(want)


def test_published_sensitivities():
    c = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, -6]], dtype=float)
    for b in (2, 3):  # columns b or more apart are orthogonal: exact
        found = sensitivity(c, b)
        assert found.exact and found.value == pytest.approx(math.sqrt(5 + 36))
    assert sensitivity(c, 2, 1).value == pytest.approx(6.0)
    diag = np.diag([0.0, 3.0, 0.0, 1.0, 2.0])
    assert sensitivity(diag, 2).value == pytest.approx(math.sqrt(9 + 4))
    assert sensitivity(diag, 2, 1).value == pytest.approx(3.0)
    # jax_privacy refuses its exact routine for the prefix-sum matrix at b = 2; here it is an upper bound, said so
    tri = np.tril(np.ones((3, 3)))
    found = sensitivity(tri, 2)
    assert not found.exact and found.value >= brute_force_sensitivity(tri, 2) - 1e-12


def test_exact_sensitivity_equals_the_brute_force_maximum_and_the_bound_is_never_below_it():
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(1, 8))
        min_sep = int(rng.integers(1, n + 1))
        k = None if trial % 3 else int(rng.integers(1, n + 1))
        bands = int(rng.integers(1, min_sep + 1))  # at most min_sep bands: columns b apart are orthogonal
        lags = np.subtract.outer(np.arange(n), np.arange(n))
        banded = np.where((lags >= 0) & (lags < bands), rng.uniform(0.1, 1.0, (n, n)), 0.0)
        found = sensitivity(banded, min_sep, k)
        assert found.exact
        assert found.value == pytest.approx(brute_force_sensitivity(banded, min_sep, k), rel=1e-12)
        dense = np.tril(rng.uniform(0.0, 1.0, (n, n)))  # non-negative: the brute force is the true maximum
        bound = sensitivity(dense, min_sep, k)
        assert bound.value >= brute_force_sensitivity(dense, min_sep, k) - 1e-12


def test_the_prefix_sum_square_root():
    want = [1, 0.5, 0.375, 0.3125, 0.2734375, 0.24609375, 0.2255859375, 0.20947265625]
    np.testing.assert_allclose(prefix_sum_sqrt_coefficients(8), want, rtol=0, atol=1e-15)
    for n in (1, 2, 10, 100):
        c = toeplitz(prefix_sum_sqrt_coefficients(n), n)
        np.testing.assert_allclose(c @ c, np.tril(np.ones((n, n))), atol=1e-6)
    # its inverse is the noising matrix of the same strategy: the coefficients of (1 - x)^(1/2)
    inverse = np.linalg.inv(toeplitz(prefix_sum_sqrt_coefficients(5), 5))[:, 0]
    np.testing.assert_allclose(inverse, [1, -1 / 2, -1 / 8, -1 / 16, -5 / 128], atol=1e-12)


@pytest.mark.parametrize(
    ("coefficients", "min_sep", "n", "k", "want"),
    [
        (prefix_sum_sqrt_coefficients(10), 10, 100, 10, 17.9134394159),  # banded: k * ||c||^2
        (prefix_sum_sqrt_coefficients(16), 4, 64, None, 78.5456957928),
        (prefix_sum_sqrt_coefficients(64), 8, 64, None, 50.1558514340),
        (prefix_sum_sqrt_coefficients(64), 8, 64, 3, 12.9369533100),
        (np.linspace(1, 0.1, 16), 5, 32, None, 86.3744),
        ([1.0], 1, 7, 3, 3.0),  # independent noise: k participations, each of norm 1
    ],
)
def test_toeplitz_sensitivity_published_values_and_the_brute_force(coefficients, min_sep, n, k, want):
    found = toeplitz_sensitivity(coefficients, n, min_sep, k)
    assert found.exact and found.value**2 == pytest.approx(want, rel=1e-9)
    if n <= 12:
        assert found.value == pytest.approx(brute_force_sensitivity(toeplitz(coefficients, n), min_sep, k))


def test_toeplitz_sensitivity_equals_the_brute_force_on_small_schedules():
    for n in range(1, 10):
        for min_sep in range(1, n + 1):
            for bands in (1, 2, n):
                coef = prefix_sum_sqrt_coefficients(bands)
                found = toeplitz_sensitivity(coef, n, min_sep)
                assert found.value == pytest.approx(brute_force_sensitivity(toeplitz(coef, n), min_sep))


def test_coefficients_that_rise_are_raised_to_their_majorant_and_called_a_bound():
    """jax_privacy's regression: [1, 0.5, 0.8] becomes [1, 0.8, 0.8] (the majorant), not a running minimum."""
    rising = toeplitz_sensitivity([1.0, 0.5, 0.8], 10, 2)
    assert not rising.exact
    assert rising.value == pytest.approx(toeplitz_sensitivity([1.0, 0.8, 0.8], 10, 2).value)
    assert rising.value >= brute_force_sensitivity(toeplitz([1.0, 0.5, 0.8], 10), 2) - 1e-12


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: max_participations(0, 1), "invalid n=0"),
        (lambda: max_participations(5, 0), "invalid min_sep=0"),
        (lambda: max_participations(5, 1, -1), "invalid max_participations=-1"),
        (lambda: sensitivity(np.ones((2, 3))), r"square.*\(2, 3\)"),
        (lambda: brute_force_sensitivity(np.array([[1.0, 0.0], [-1.0, 1.0]])), "non-negative Gram"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_streaming_noise_is_the_inverse_strategy_applied_to_the_draws():
    rng = np.random.default_rng(1)
    n, size = 24, 6
    draws = rng.standard_normal((n, size))
    strategies = {
        "banded": (prefix_sum_sqrt_coefficients(4), lambda c: ToeplitzNoise(c, size)),
        "full": (prefix_sum_sqrt_coefficients(n), lambda c: ToeplitzNoise(c, size)),
    }
    blt = BLT((0.9, 0.5), (0.3, 0.1))
    for coef, make in strategies.values():
        noise = make(coef)
        out = np.stack([noise.step(z) for z in draws])
        np.testing.assert_allclose(out, np.linalg.solve(toeplitz(coef, n), draws), atol=1e-12)
    noise = BLTNoise(blt, size)
    out = np.stack([noise.step(z) for z in draws])
    np.testing.assert_allclose(
        out, np.linalg.solve(toeplitz(blt.toeplitz_coefficients(n), n), draws), atol=1e-12
    )
    # one band is independent noise
    one = ToeplitzNoise([1.0], size)
    np.testing.assert_array_equal(np.stack([one.step(z) for z in draws]), draws)


def test_the_released_noise_has_the_mechanisms_covariance():
    """Over many coordinates (independent samples), the rounds' noise has covariance C^-1 C^-T."""
    rng = np.random.default_rng(2)
    n, size = 12, 40_000
    coef = prefix_sum_sqrt_coefficients(3)
    noise = ToeplitzNoise(coef, size)
    out = np.stack([noise.step(rng.standard_normal(size)) for _ in range(n)])
    inverse = np.linalg.inv(toeplitz(coef, n))
    np.testing.assert_allclose(out @ out.T / size, inverse @ inverse.T, atol=0.05)


def test_blt_sensitivity_closed_form_equals_the_toeplitz_sum():
    """jax_privacy's golden 2-buffer BLT for n = 100,000 (tests/matrix_factorization/buffered_toeplitz_test.py):
    the closed form (Lemma 5.3 of arXiv:2404.16706) and the O(n) column sum agree."""
    blt = BLT((0.99995289, 0.98570687), (0.01228532, 0.18783937))
    n = 100_000
    column = toeplitz_sensitivity(blt.toeplitz_coefficients(n), n, n)
    assert column.exact
    assert blt.sensitivity_squared(n) == pytest.approx(column.value**2, rel=1e-10)
    with pytest.raises(ValueError, match="each decay in"):
        BLT((1.0,), (0.5,))
