"""Empirical privacy: what a trained model reveals about canaries, as an epsilon (pure functions).

Two methods, each from one paper:

* **One-shot estimation** (Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot empirical privacy
  estimation for federated learning", ICLR 2024, arXiv 2302.03098). Canary clients submit fixed random unit
  directions (scaled to the clip norm). After training, the cosine between the final model delta and each
  canary's direction is computed, for the canaries that were inserted and for held-out canaries that never
  were. A Gaussian is fitted to each set of cosines and the estimate is the epsilon at ``delta`` of
  distinguishing the two Gaussians (:func:`andrew_estimate`, :func:`gaussians_epsilon`). It is an *estimate*,
  not a bound.
* **Auditing with one training run** (Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run",
  NeurIPS 2023, arXiv 2305.08846). ``m`` canaries are each included independently with probability 1/2; the
  auditor guesses "in" for the highest scores, "out" for the lowest and abstains on the rest. The number of
  correct guesses gives a p-value for the hypothesis "the training is (eps, delta)-DP" and hence an epsilon
  *lower bound* at a stated confidence (:func:`one_run_p_value`, :func:`one_run_lower_bound`,
  :func:`one_run_audit`). What it assumes is only that: the coins independent of everything else, and the
  whole run (every output the guesser sees) (eps, delta)-DP with respect to inserting or removing one canary.
  Nothing about independent rounds: a run whose rounds share correlated noise, or whose participation follows
  a schedule, is audited against its whole-run epsilon (:mod:`fedsim.privacy.canaries` says where fedsim's
  canaries meet this).

Public API::

    gaussian_hockey_stick, gaussians_delta, gaussians_epsilon  # divergence of two Gaussians
    gaussian_mechanism_mu                                       # mean gap of an exact (eps, delta) mechanism
    random_unit_directions, canary_cosines, andrew_estimate     # Andrew et al. 2024
    andrew_interval, andrew_null                                # its confidence interval, resolution and floor
    one_run_p_value, one_run_lower_bound, one_run_audit         # Steinke et al. 2023
    one_run_ceiling, one_run_canaries_needed                    # the largest bound m canaries can give
    gaussian_mechanism_scores                                   # scores of an exact Gaussian mechanism

Only numpy and scipy are used (no torch): the inputs are arrays the caller has already computed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, stats
from scipy.special import expit, log_ndtr, ndtr

from fedsim.validation import PrivacyInputError

__all__ = [
    "andrew_estimate",
    "andrew_interval",
    "andrew_null",
    "canary_cosines",
    "gaussian_hockey_stick",
    "gaussian_mechanism_mu",
    "gaussian_mechanism_scores",
    "gaussians_delta",
    "gaussians_epsilon",
    "one_run_audit",
    "one_run_canaries_needed",
    "one_run_ceiling",
    "one_run_lower_bound",
    "one_run_p_value",
    "random_unit_directions",
]

#: the largest epsilon searched for; beyond it :func:`gaussians_epsilon` reports ``math.inf``
_EPS_SEARCH_MAX = 4096.0


# --------------------------------------------------------------------------------------------- validation


def _finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrivacyInputError(name, value, "must be a finite number") from None
    if isinstance(value, bool) or not math.isfinite(v):
        raise PrivacyInputError(name, value, "must be a finite number")
    return v


def _std(name: str, value: Any) -> float:
    v = _finite(name, value)
    if v < 0:
        raise PrivacyInputError(name, value, "must be a standard deviation: a finite number >= 0")
    return v


def _delta_open(name: str, value: Any) -> float:
    v = _finite(name, value)
    if not 0.0 < v < 1.0:
        raise PrivacyInputError(name, value, "must be a number with 0 < delta < 1")
    return v


def _int(name: str, value: Any, low: int, high: int | None = None, high_name: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PrivacyInputError(name, value, "must be an integer")
    v = int(value)
    if v < low or (high is not None and v > high):
        upper = f" and <= {high_name or high}" if high is not None else ""
        raise PrivacyInputError(name, value, f"must be an integer >= {low}{upper}")
    return v


def _confidence(value: Any) -> float:
    v = _finite("confidence", value)
    if not 0.0 < v < 1.0:
        raise PrivacyInputError("confidence", value, "must be a number with 0 < confidence < 1")
    return v


# --------------------------------------------------------------------- hockey-stick divergence of Gaussians


def _log_interval(lo: float, hi: float) -> float:
    """log P(lo < Z < hi) for Z ~ N(0, 1), accurate in the tails (log space on the side the interval lies)."""
    if not lo < hi:
        return -math.inf
    if lo >= 0.0:  # upper tail: sf(lo) - sf(hi)
        a, b = float(log_ndtr(-lo)), float(log_ndtr(-hi))
    elif hi <= 0.0:  # lower tail: cdf(hi) - cdf(lo)
        a, b = float(log_ndtr(hi)), float(log_ndtr(lo))
    else:  # straddles 0: at least ~ the mass near 0, no cancellation worth avoiding
        return math.log(float(ndtr(hi) - ndtr(lo)))
    if a == -math.inf:
        return -math.inf
    return a + math.log1p(-math.exp(min(b - a, 0.0))) if b < a else -math.inf


def _log_outside(lo: float, hi: float) -> float:
    """log P(Z < lo or Z > hi) for Z ~ N(0, 1), lo <= hi."""
    return float(np.logaddexp(log_ndtr(lo), log_ndtr(-hi)))


def gaussian_hockey_stick(mu_p: float, s_p: float, mu_q: float, s_q: float, epsilon: float) -> float:
    """Hockey-stick divergence ``delta_{P||Q}(eps)`` of ``P = N(mu_p, s_p^2)`` from ``Q = N(mu_q, s_q^2)``.

    ``delta_{P||Q}(eps) = sup_S P(S) - e^eps Q(S) = integral (p(x) - e^eps q(x))_+ dx``, the privacy profile
    used by Andrew et al. (2024, Section 3 and the appendix on two Gaussians of unequal variance) and, for
    equal variances, the exact Gaussian-mechanism profile of Balle and Wang (2018, Theorem 8).

    Computed exactly: the supremum is attained at ``S = {x : log p(x) - log q(x) > eps}``. In the coordinate
    ``z = (x - mu_q) / s_q`` (the divergence is invariant under affine maps) ``Q = N(0, 1)``,
    ``P = N(m, t^2)`` with ``m = (mu_p - mu_q) / s_q`` and ``t = s_p / s_q``, and the log-likelihood ratio is
    the quadratic ``a z^2 + b z + c`` with ``a = (s_p^2 - s_q^2) / (2 s_p^2)``, ``b = m / t^2`` and
    ``c = -log t - m^2 / (2 t^2)``. So ``S`` is a half-line (``a = 0``), the complement of an interval
    (``a > 0``) or an interval (``a < 0``), and ``P(S)``, ``Q(S)`` are normal CDFs, evaluated in log space so
    that divergences far below 1e-16 keep their relative precision. The roots are found with the
    cancellation-free form of the quadratic formula, so nearly equal variances (``a`` tiny) give the
    equal-variance answer continuously (the second root then lies far out in the tails).

    A zero standard deviation is a point mass: against a point mass (or of one against a continuous
    distribution, or of two distinct point masses) the divergence is 1; two equal point masses give
    ``max(0, 1 - e^eps)``.
    """
    mu_p, mu_q = _finite("mu_p", mu_p), _finite("mu_q", mu_q)
    s_p, s_q = _std("s_p", s_p), _std("s_q", s_q)
    eps = _finite("epsilon", epsilon)
    if s_p == 0.0 or s_q == 0.0:
        if s_p == 0.0 and s_q == 0.0 and mu_p == mu_q:
            return max(0.0, -math.expm1(eps))
        return 1.0
    m = (mu_p - mu_q) / s_q
    t = s_p / s_q
    a = (s_p - s_q) * (s_p + s_q) / (2.0 * s_p * s_p)
    b = m / (t * t)
    cc = -math.log1p((s_p - s_q) / s_q) - m * m / (2.0 * t * t) - eps  # c - eps
    # S as (kind, lo, hi): "above" (lo, inf), "below" (-inf, hi), "inside" (lo, hi), "outside" R \ [lo, hi]
    if a == 0.0:
        if b == 0.0:  # identical distributions: S is R (cc > 0, i.e. eps < 0) or empty
            return max(0.0, -math.expm1(eps))
        root = -cc / b
        kind, lo, hi = ("above", root, math.inf) if b > 0 else ("below", -math.inf, root)
    else:
        disc = b * b - 4.0 * a * cc
        if disc <= 0.0:
            # the quadratic keeps one sign: S is R (a > 0) or empty (a < 0)
            return max(0.0, -math.expm1(eps)) if a > 0 else 0.0
        qq = -0.5 * (b + math.copysign(math.sqrt(disc), b))  # never 0 when disc > 0
        r1, r2 = qq / a, cc / qq
        lo, hi = min(r1, r2), max(r1, r2)
        kind = "outside" if a > 0 else "inside"

    def log_prob(loc: float, scale: float) -> float:
        zlo, zhi = (lo - loc) / scale, (hi - loc) / scale
        if kind == "above":
            return float(log_ndtr(-zlo))
        if kind == "below":
            return float(log_ndtr(zhi))
        if kind == "inside":
            return _log_interval(zlo, zhi)
        return _log_outside(zlo, zhi)

    log_p = log_prob(m, t)
    log_q = log_prob(0.0, 1.0)
    if log_p == -math.inf:
        return 0.0
    # P(S) - e^eps Q(S) = P(S) * (1 - exp(eps + log Q(S) - log P(S))), >= 0 up to rounding
    gap = eps + log_q - log_p
    if gap >= 0.0:
        return 0.0
    return float(math.exp(log_p) * -math.expm1(gap))


def gaussians_delta(mu0: float, s0: float, mu1: float, s1: float, epsilon: float) -> float:
    """``max(delta_{P1||P0}(eps), delta_{P0||P1}(eps))`` for ``P0 = N(mu0, s0^2)``, ``P1 = N(mu1, s1^2)``.

    The delta at ``eps`` of the pair of distributions in both directions (an (eps, delta)-DP guarantee must
    hold for both orders of neighbouring datasets); each term is :func:`gaussian_hockey_stick`.
    """
    return max(
        gaussian_hockey_stick(mu1, s1, mu0, s0, epsilon),
        gaussian_hockey_stick(mu0, s0, mu1, s1, epsilon),
    )


def gaussians_epsilon(
    mu0: float, s0: float, mu1: float, s1: float, delta: float, *, xtol: float = 1e-13
) -> float:
    """The smallest ``eps >= 0`` with ``max(delta_{P1||P0}(eps), delta_{P0||P1}(eps)) <= delta``.

    ``P0 = N(mu0, s0^2)``, ``P1 = N(mu1, s1^2)``; this is the epsilon of distinguishing the two fitted
    Gaussians that Andrew et al. (2024, Section 3, estimating epsilon from the canary cosines) report. For
    equal variances it is the epsilon of the Gaussian mechanism with noise multiplier ``s / |mu1 - mu0|``
    (Balle and Wang 2018, Theorem 8). The divergence (:func:`gaussians_delta`) is non-increasing in ``eps``;
    the root is bracketed by doubling and found with :func:`scipy.optimize.brentq` (tolerance ``xtol`` in eps,
    1e-13 unless a caller that needs fewer digits, such as :func:`andrew_null`'s hundreds of draws, asks).

    Returns 0.0 when ``eps = 0`` already gives at most ``delta`` (e.g. identical Gaussians) and ``math.inf``
    when no finite epsilon does (a zero standard deviation, unless both are zero with equal means).
    ``delta`` must satisfy ``0 < delta < 1``.
    """
    mu0, mu1 = _finite("mu0", mu0), _finite("mu1", mu1)
    s0, s1 = _std("s0", s0), _std("s1", s1)
    target = _delta_open("delta", delta)

    def excess(eps: float) -> float:
        return gaussians_delta(mu0, s0, mu1, s1, eps) - target

    if excess(0.0) <= 0.0:
        return 0.0
    if s0 == 0.0 or s1 == 0.0:  # the divergence is 1 for every eps
        return math.inf
    lo, hi = 0.0, 1.0
    while excess(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_SEARCH_MAX:
            return math.inf
    return float(optimize.brentq(excess, lo, hi, xtol=xtol, rtol=4 * np.finfo(float).eps, maxiter=500))


def gaussian_mechanism_mu(epsilon: float, delta: float) -> float:
    """The mean gap ``mu`` (sensitivity in noise units, i.e. ``1 / noise multiplier``) at which the Gaussian
    mechanism is exactly ``(epsilon, delta)``-DP: ``delta_{N(mu,1)||N(0,1)}(epsilon) = delta`` (Balle and Wang
    2018, Theorem 8: ``Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta``), solved with brentq.

    Used to build a mechanism of known epsilon for calibration (Steinke et al. 2023, the idealised
    Gaussian experiments). ``epsilon >= 0``, ``0 < delta < 1``.
    """
    eps = _finite("epsilon", epsilon)
    if eps < 0:
        raise PrivacyInputError("epsilon", epsilon, "must be a finite number >= 0")
    target = _delta_open("delta", delta)

    def excess(mu: float) -> float:
        return gaussian_hockey_stick(mu, 1.0, 0.0, 1.0, eps) - target

    hi = 1.0
    while excess(hi) < 0.0:  # the profile grows with mu, towards 1
        hi *= 2.0
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500))


# ------------------------------------------------------------------------------------ Andrew et al. 2024


def random_unit_directions(k: int, d: int, rng: np.random.Generator | int | None) -> np.ndarray:
    """``k`` independent directions uniform on the unit sphere of R^d, as a ``(k, d)`` array of unit rows.

    The canary updates of Andrew et al. (2024, Section 3): each canary client submits its direction scaled to
    the clip norm in every round it participates. ``rng`` is a numpy Generator or a seed.
    """
    k = _int("k", k, 1)
    d = _int("d", d, 1)
    gen = np.random.default_rng(rng)
    x = gen.standard_normal((k, d))
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / norms


def canary_cosines(delta_vector: Any, directions: Any) -> np.ndarray:
    """The cosines ``<v, u_j> / (|v| |u_j|)`` between one vector ``v`` (the final model delta, flattened) and
    each row ``u_j`` of ``directions`` (``(k, d)``, unit rows): the test statistic of Andrew et al. (2024,
    Section 3). Rows are divided by their own norm, so rows that are unit only up to rounding are fine.
    Returns a ``(k,)`` float array; all zeros when ``v`` is the zero vector.
    """
    v = np.asarray(delta_vector, dtype=float)
    u = np.asarray(directions, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise PrivacyInputError(
            "delta_vector", f"array of shape {v.shape}", "must be a non-empty 1-D array (d,)"
        )
    if u.ndim != 2 or u.shape[1] != v.shape[0]:
        raise PrivacyInputError(
            "directions", f"array of shape {u.shape}", f"must be a 2-D array (k, d) with d = {v.shape[0]}"
        )
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(u))):
        raise PrivacyInputError("delta_vector/directions", "non-finite entries", "must be finite")
    row_norms = np.linalg.norm(u, axis=1)
    if np.any(row_norms == 0.0):
        raise PrivacyInputError("directions", "a zero row", "must have non-zero (unit) rows")
    v_norm = float(np.linalg.norm(v))
    if v_norm == 0.0:
        return np.zeros(u.shape[0])
    return (u @ v) / (row_norms * v_norm)


def _sample(name: str, values: Any) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise PrivacyInputError(
            name, f"array of shape {x.shape}", "must be a 1-D array of at least 2 cosines"
        )
    if not np.all(np.isfinite(x)):
        raise PrivacyInputError(name, "non-finite entries", "must be finite")
    return x


def andrew_estimate(inserted_cosines: Any, heldout_cosines: Any, delta: float) -> dict[str, float | int]:
    """The one-shot empirical epsilon of Andrew et al. (2024, Section 3, the estimation procedure).

    Fits ``N(mu_in, sd_in^2)`` to the cosines of the inserted canaries and ``N(mu_out, sd_out^2)`` to those of
    the held-out canaries (sample mean and unbiased sample standard deviation, ``ddof=1``) and returns the
    epsilon at ``delta`` of distinguishing the two (:func:`gaussians_epsilon`, both directions). Needs at
    least 2 cosines in each set. Returns
    ``{"epsilon", "mu_in", "sd_in", "mu_out", "sd_out", "n_in", "n_out"}``.

    The fitted variances are never exactly equal, and any mismatch makes the log-likelihood ratio unbounded,
    so with few canaries the estimate is biased upwards (at delta = 1e-5 and 500 canaries per set, the median
    over 20 synthetic draws was 18% high at a true epsilon of 4.4 and 33% high at 2.0).
    """
    x_in = _sample("inserted_cosines", inserted_cosines)
    x_out = _sample("heldout_cosines", heldout_cosines)
    delta = _delta_open("delta", delta)
    mu_in, sd_in = float(np.mean(x_in)), float(np.std(x_in, ddof=1))
    mu_out, sd_out = float(np.mean(x_out)), float(np.std(x_out, ddof=1))
    return {
        "epsilon": gaussians_epsilon(mu_out, sd_out, mu_in, sd_in, delta),
        "mu_in": mu_in,
        "sd_in": sd_in,
        "mu_out": mu_out,
        "sd_out": sd_out,
        "n_in": int(x_in.size),
        "n_out": int(x_out.size),
    }


def andrew_interval(
    inserted_cosines: Any, heldout_cosines: Any, delta: float, confidence: float = 0.95
) -> dict[str, float]:
    """A confidence interval for the epsilon that :func:`andrew_estimate` estimates: the epsilon at ``delta`` of
    the two Gaussians the cosines are drawn from (Andrew et al.'s model), from the sampling distributions of the
    fitted parameters.

    For each set of ``n`` cosines the mean lies in ``mean +- t_{n-1} sd / sqrt(n)`` and the standard deviation in
    ``sd sqrt((n - 1) / chi2_{n-1})`` (Student's t and chi-square quantiles, exact for Gaussian samples), each at
    ``1 - (1 - confidence) / 4`` (Bonferroni over the four parameters), so the true four lie in the box with
    probability at least ``confidence``; the interval is the smallest and the largest epsilon over the box (the
    projection of a confidence region, so its coverage is at least ``confidence`` whatever the estimate's bias).
    The epsilon grows with the mean gap (at fixed standard deviations), so the low end takes the smallest gap in
    the box and the high end the largest; over the two standard deviations the extreme is taken on a 5 x 5 grid
    (corners included, and the equal-deviation point where the two intervals overlap) and refined by
    Nelder-Mead within the box.

    Why not a bootstrap of the estimate: a percentile interval is centred on the plug-in estimate, which is
    biased upwards (fitted variances are never equal, and at small delta a small mismatch is worth a large
    epsilon), so it would sit above the truth; this interval covers the truth, and costs the same for 100 or
    10,000 canaries (it needs only the four fitted parameters). It is as good as the Gaussian model of the
    cosines. Returns ``{"low", "high", "confidence"}``; ``high`` is ``math.inf`` where no finite epsilon bounds
    the box (a zero standard deviation, or past the search range).
    """
    x_in = _sample("inserted_cosines", inserted_cosines)
    x_out = _sample("heldout_cosines", heldout_cosines)
    delta = _delta_open("delta", delta)
    conf = _confidence(confidence)
    a = (1.0 - conf) / 4.0
    boxes, fitted = [], []
    for x in (x_in, x_out):
        n, mu, sd = x.size, float(np.mean(x)), float(np.std(x, ddof=1))
        half = float(stats.t.ppf(1.0 - a / 2.0, n - 1)) * sd / math.sqrt(n)
        sd_lo = sd * math.sqrt((n - 1) / float(stats.chi2.ppf(1.0 - a / 2.0, n - 1)))
        sd_hi = sd * math.sqrt((n - 1) / float(stats.chi2.ppf(a / 2.0, n - 1)))
        boxes.append(((mu - half, mu + half), (sd_lo, sd_hi)))
        fitted.append(sd)
    (m_in, s_in), (m_out, s_out) = boxes
    at = (fitted[1], fitted[0])  # the fitted deviations (out, in): the interval holds the estimate itself
    gap_lo, gap_hi = m_in[0] - m_out[1], m_in[1] - m_out[0]
    gap_min = 0.0 if gap_lo <= 0.0 <= gap_hi else min(abs(gap_lo), abs(gap_hi))
    gap_max = max(abs(gap_lo), abs(gap_hi))
    if min(s_in[0], s_out[0]) <= 0.0:  # a sample of equal cosines: a point mass, no finite epsilon
        low = gaussians_epsilon(0.0, s_out[1], gap_min, s_in[1], delta)
        return {"low": low, "high": math.inf, "confidence": conf}
    return {
        "low": _box_extreme(gap_min, s_out, s_in, delta, lowest=True, also=at),
        "high": _box_extreme(gap_max, s_out, s_in, delta, lowest=False, also=at),
        "confidence": conf,
    }


def _box_extreme(
    gap: float,
    s0: tuple[float, float],
    s1: tuple[float, float],
    delta: float,
    *,
    lowest: bool,
    also: tuple[float, float],
) -> float:
    """The smallest (``lowest``) or largest epsilon of ``N(0, a^2)`` against ``N(gap, b^2)`` over ``a`` in
    ``s0``, ``b`` in ``s1``: a 5 x 5 geometric grid, the point ``also`` (the fitted deviations) and, for the
    smallest, the equal point; then Nelder-Mead in log coordinates from the best of them."""
    sign = 1.0 if lowest else -1.0

    def f(p: np.ndarray) -> float:
        e = gaussians_epsilon(0.0, math.exp(p[0]), gap, math.exp(p[1]), delta, xtol=1e-6)
        return sign * (e if math.isfinite(e) else 2.0 * _EPS_SEARCH_MAX)

    bounds = [(math.log(s0[0]), math.log(s0[1])), (math.log(s1[0]), math.log(s1[1]))]
    points = [np.array([x, y]) for x in np.linspace(*bounds[0], 5) for y in np.linspace(*bounds[1], 5)]
    points.append(np.clip(np.log(np.array(also)), [b[0] for b in bounds], [b[1] for b in bounds]))
    overlap = min(s0[1], s1[1])
    if lowest and max(s0[0], s1[0]) <= overlap:  # equal deviations, as large as the box allows
        points.append(np.array([math.log(overlap), math.log(overlap)]))
    values = [f(p) for p in points]
    best = int(np.argmin(values))
    value = values[best]
    if (lowest and value > 0.0) or (not lowest and value > -2.0 * _EPS_SEARCH_MAX):
        res = optimize.minimize(
            f,
            points[best],
            method="Nelder-Mead",
            bounds=bounds,
            options={"xatol": 1e-4, "fatol": 1e-4, "maxfev": 60},
        )
        value = min(value, float(res.fun))
    eps = sign * value
    return math.inf if eps >= 2.0 * _EPS_SEARCH_MAX else float(eps)


def andrew_null(
    inserted_cosines: Any,
    heldout_cosines: Any,
    delta: float,
    confidence: float = 0.95,
    draws: int = 200,
    rng: np.random.Generator | int | None = 0,
) -> dict[str, float | int]:
    """What :func:`andrew_estimate` returns at this canary count when the canaries reveal nothing: its
    resolution and its floor.

    The inserted and held-out labels are shuffled over the pooled cosines ``draws`` times (the same scores, the
    same set sizes, labels that carry no information by construction) and the estimate recomputed. ``median``
    is the estimate's floor with honest null cosines of this count (its bias: it is never 0); ``resolution``
    its ``confidence`` quantile, the smallest estimate that a run revealing nothing gives with probability at
    most ``1 - confidence``: estimates at or below it cannot be told from no privacy loss at all with this many
    canaries. Shuffling keeps the scores' own shape (the all-rounds statistic is a maximum over rounds, not a
    Gaussian), which a Gaussian null would not. ``rng``: a Generator or a seed (fixed by default, so a row is
    reproducible). Returns ``{"median", "resolution", "draws"}``.
    """
    x_in = _sample("inserted_cosines", inserted_cosines)
    x_out = _sample("heldout_cosines", heldout_cosines)
    delta = _delta_open("delta", delta)
    conf = _confidence(confidence)
    draws = _int("draws", draws, 1)
    gen = np.random.default_rng(rng)
    pooled = np.concatenate([x_in, x_out])
    n_in = x_in.size
    eps = np.empty(draws)
    for i in range(draws):
        shuffled = gen.permutation(pooled)
        a, b = shuffled[:n_in], shuffled[n_in:]
        # 4 decimals are plenty for a quantile of a few hundred draws (and make each draw ~3x cheaper)
        eps[i] = gaussians_epsilon(
            float(b.mean()), float(b.std(ddof=1)), float(a.mean()), float(a.std(ddof=1)), delta, xtol=1e-4
        )
    return {
        "median": float(np.median(eps)),
        "resolution": float(np.quantile(eps, conf)),
        "draws": draws,
    }


# ----------------------------------------------------------------------------------- Steinke et al. 2023


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The p-value of ``v`` or more correct guesses out of ``r`` under the hypothesis "(eps, delta)-DP".

    Steinke, Nasr and Jagielski (2023), Theorem 3 (main result, general form) as computed by the paper's
    Appendix D code: with ``q = e^eps / (1 + e^eps)``, ``beta = P[Binomial(r, q) >= v]`` and, for
    ``delta > 0``,

        ``alpha = max_{i = 1..v} P[v - i <= Binomial(r, q) < v] / i``,   p = min(1, beta + 2 m delta alpha).

    (Where the maximum runs over ``i = 1..m``, terms with ``i > v`` have numerator ``1 - beta`` and a larger
    denominator than ``i = v``, so the two are equal.) The paper itself was not at hand when this was written:
    the delta term is the form specified for this module, and it agrees with the paper's Appendix D code as
    reproduced in several public repositories. ``m`` is the number of canaries (each included with
    probability 1/2), ``0 <= v <= r <= m``, ``epsilon >= 0``, ``0 <= delta <= 1``.

    The partial sums ``P[v - i <= W < v]`` are cumulative sums of the binomial pmf (not differences of
    survival functions), so they stay accurate when tiny.
    """
    m = _int("m", m, 1)
    r = _int("r", r, 0, m, "m")
    v = _int("v", v, 0, r, "r")
    eps = _finite("epsilon", epsilon)
    if eps < 0:
        raise PrivacyInputError("epsilon", epsilon, "must be a finite number >= 0")
    d = _finite("delta", delta)
    if not 0.0 <= d <= 1.0:
        raise PrivacyInputError("delta", delta, "must be a number with 0 <= delta <= 1")
    if v == 0:
        return 1.0
    q = float(expit(eps))  # e^eps / (1 + e^eps) without overflow
    beta = float(stats.binom.sf(v - 1, r, q))
    if d == 0.0:
        return min(1.0, beta)
    alpha = float(_alphas(r, v, np.array([q]))[0])
    return min(1.0, beta + alpha * 2.0 * m * d)


#: how far below the binomial's mode (in standard deviations, plus a few terms) the delta term's cumulative sum is
#: taken before the rest of it is shown not to matter (:func:`_alphas`)
_ALPHA_SDS = 12.0


def _alphas(r: int, v: int, q: np.ndarray) -> np.ndarray:
    """``alpha = max_{i = 1..v} P[v - i <= W < v] / i`` (``W ~ Binomial(r, q)``) for each ``q``, ``v >= 1``: the
    delta term of :func:`one_run_p_value`, with ``P[v - i <= W < v]`` the cumulative sum of the pmf from ``v - 1``
    down (``window[i-1]``).

    The sum is taken over the first ``L`` terms only, down to about 12 standard deviations below the mode, where
    the rest of the mass is negligible; it is then *checked* that no ``i > L`` can win: ``window[i-1] <=
    P[W < v]``, so ``window[i-1] / i < P[W < v] / (L + 1)``, and where the best of the first ``L`` ratios is at
    least that (with a margin for rounding) it is the maximum; elsewhere (rare) every term is summed. A prefix of
    a cumulative sum is computed as in the full sum, so the value is the full computation's, bit for bit, at
    ``O(L)`` instead of ``O(v)`` cost: thousands of canaries with all guesses right cost tens of terms, not
    thousands."""
    q = np.asarray(q, dtype=float)
    mode = np.floor((r + 1) * q)
    sd = np.sqrt(r * q * (1.0 - q))
    need = np.ceil((v - 1) - (mode - _ALPHA_SDS * sd - _ALPHA_SDS)) + 1
    length = int(np.clip(np.max(need, initial=1.0), 1, v))
    ks = np.arange(v - 1, v - 1 - length, -1)  # v-1, v-2, ..., v-length
    window = np.cumsum(stats.binom.pmf(ks[None, :], r, q[:, None]), axis=1)
    alpha = np.max(window / np.arange(1, length + 1), axis=1)
    if length < v:
        below_v = stats.binom.cdf(v - 1, r, q)  # P[W < v] >= every window, computed without cancellation
        unsure = np.flatnonzero(alpha < below_v * (1.0 + 1e-9) / (length + 1))
        if unsure.size:
            ks = np.arange(v - 1, -1, -1)
            full = np.cumsum(stats.binom.pmf(ks[None, :], r, q[unsure, None]), axis=1)
            alpha[unsure] = np.max(full / np.arange(1, v + 1), axis=1)
    return alpha


def one_run_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The epsilon lower bound of Steinke et al. (2023, Theorem 3 and the Appendix D procedure): the largest
    ``eps >= 0`` at which "(eps, delta)-DP" is rejected at ``confidence``, i.e.
    ``one_run_p_value(m, r, v, eps, delta) <= 1 - confidence``; 0.0 when even ``eps = 0`` is not rejected.

    Conservative reading: ``beta`` grows with eps but the delta term need not, so the p-value is not
    guaranteed monotone in eps. The bound returned is the *first* crossing,
    ``inf{eps : p(eps) > 1 - confidence}`` (every eps below it is rejected), never a later one. It is located
    on a grid of 256 points in ``[0, eps_beta]`` (``eps_beta``: where ``beta`` alone, a lower bound on p,
    crosses the level, found by brentq; no crossing can lie beyond it) and refined by brentq on the first grid
    cell where p exceeds the level; the value returned itself has ``p <= 1 - confidence``. When the p-value is
    monotone this is the paper's bisection answer (to 1e-12).
    """
    m = _int("m", m, 1)
    r = _int("r", r, 0, m, "m")
    v = _int("v", v, 0, r, "r")
    d = _finite("delta", delta)
    if not 0.0 <= d <= 1.0:
        raise PrivacyInputError("delta", delta, "must be a number with 0 <= delta <= 1")
    return _lower_bound(m, r, v, d, 1.0 - _confidence(confidence))


#: grid points of the lower bound's scan evaluated together (the scan stops at the first block with a crossing)
_GRID_BLOCK = 32


@functools.lru_cache(maxsize=4096)
def _lower_bound(m: int, r: int, v: int, d: float, level: float) -> float:
    """:func:`one_run_lower_bound` on validated arguments (cached: the rounds of a run repeat the same counts).
    The 256-point grid is scanned with :func:`_p_values` (every grid point of a block in one pmf call), which
    computes each grid point's p-value exactly as :func:`one_run_p_value` does, so the first grid cell over the
    level, and hence the answer, is the scalar scan's."""

    def excess(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, d) - level

    if excess(0.0) > 0.0:
        return 0.0

    def beta_excess(eps: float) -> float:
        return float(stats.binom.sf(v - 1, r, float(expit(eps)))) - level

    hi = 1.0
    while beta_excess(hi) <= 0.0:  # beta -> 1 as eps -> inf (v <= r), so this ends
        hi *= 2.0
    eps_beta = float(optimize.brentq(beta_excess, 0.0, hi, xtol=1e-12))
    grid = np.linspace(0.0, eps_beta, 257)
    first = _first_over(m, r, v, grid[1:], d, level)
    if first is None:
        return eps_beta  # p <= level on the whole grid, and beta (<= p) reaches the level at eps_beta
    prev, eps = float(grid[first]), float(grid[first + 1])
    root = float(optimize.brentq(excess, prev, eps, xtol=1e-12))
    # brentq may land just past the crossing: step back so that the bound itself is rejected
    while root > prev and excess(root) > 0.0:
        root = max(prev, root - 1e-12 * max(1.0, root))
    return root


def _first_over(m: int, r: int, v: int, eps: np.ndarray, d: float, level: float) -> int | None:
    """The index of the first of ``eps`` whose p-value (:func:`one_run_p_value`) exceeds ``level``, or None: the
    grid scan of :func:`one_run_lower_bound`, in blocks of points evaluated together (:func:`_p_values`).

    Most points are decided without the delta term's sum: its ``alpha`` lies between ``pmf(v - 1)`` (the
    ``i = 1`` term, which the maximum includes) and the largest ``pmf(j)``, ``j < v`` (each ratio is a mean of
    pmf terms), so a point whose lower estimate of the p-value is over the level is over, and one whose upper
    estimate is not is not; the exact p-value (the same arithmetic as :func:`one_run_p_value`) is computed only
    for the points left between (far from the crossing the exact sum would be long: near ``eps = 0`` the mass
    lies ``v / 2`` terms below ``v``)."""
    q = expit(np.asarray(eps, dtype=float))
    if d == 0.0:
        over = np.flatnonzero(np.minimum(1.0, stats.binom.sf(v - 1, r, q)) > level)
        return int(over[0]) if over.size else None
    beta = stats.binom.sf(v - 1, r, q)
    c = 2.0 * m * d
    p_low = np.minimum(1.0, beta + stats.binom.pmf(v - 1, r, q) * c)
    mode = np.floor((r + 1) * q).astype(np.int64)  # the largest pmf term below v is at min(mode, v - 1)
    top = np.max([stats.binom.pmf(np.clip(mode + s, 0, v - 1), r, q) for s in (-1, 0, 1)], axis=0)
    p_high = beta + top * (1.0 + 1e-9) * c  # +-1 and the margin: the mode and the sums as rounded
    sure = np.flatnonzero(p_low > level)
    end = int(sure[0]) if sure.size else q.size
    undecided = np.flatnonzero(p_high[:end] > level)
    for start in range(0, undecided.size, _GRID_BLOCK):
        idx = undecided[start : start + _GRID_BLOCK]
        over = np.flatnonzero(_p_values(m, r, v, eps[idx], d) > level)
        if over.size:
            return int(idx[over[0]])
    return end if sure.size else None


def _p_values(m: int, r: int, v: int, eps: np.ndarray, d: float) -> np.ndarray:
    """:func:`one_run_p_value` at every epsilon of ``eps`` (validated arguments, ``v >= 1``), the same arithmetic
    elementwise: one binomial pmf call for all of them instead of one per point."""
    q = expit(np.asarray(eps, dtype=float))
    beta = stats.binom.sf(v - 1, r, q)
    if d == 0.0:
        return np.minimum(1.0, beta)
    return np.minimum(1.0, beta + _alphas(r, v, q) * 2.0 * m * d)


def _default_guesses(m: int) -> tuple[int, ...]:
    return tuple(sorted({g for g in (m // 16, m // 8, m // 4, m // 2, m) if g >= 1}))


def one_run_audit(
    scores: Any,
    included: Any,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Audit one training run (Steinke et al. 2023, Section 3 and the experiments' guessing rule).

    ``scores[j]`` is the auditor's score of canary ``j`` (higher: more likely included), ``included[j]``
    whether it was included. For each candidate number of guesses ``r`` the auditor guesses "in" for the top
    ``ceil(r/2)`` scores and "out" for the bottom ``floor(r/2)`` (ties broken by index, stably), abstains on
    the rest, and counts the correct guesses ``v``. Choosing ``r`` after seeing the data needs a correction,
    so each candidate's bound is computed at confidence ``1 - (1 - confidence) / len(candidates)``
    (Bonferroni) and the result is the maximum over the candidates, valid at ``confidence`` overall.

    ``guesses``: the candidate ``r`` values (each 1..m; deduplicated and sorted); default
    ``(m//16, m//8, m//4, m//2, m)``, those >= 1. Returns ``{"epsilon_lower_bound", "confidence", "guesses",
    "correct", "m", "candidates"}``: ``guesses``/``correct`` of the best candidate (the first, i.e. smallest,
    on ties), ``confidence`` the overall one, ``candidates`` a list of ``{"guesses", "correct", "confidence",
    "epsilon_lower_bound"}`` with the per-candidate (Bonferroni) confidence.
    """
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise PrivacyInputError("scores", f"array of shape {s.shape}", "must be a non-empty 1-D array (m,)")
    if not np.all(np.isfinite(s)):
        raise PrivacyInputError("scores", "non-finite entries", "must be finite")
    inc_raw = np.asarray(included)
    if inc_raw.shape != s.shape:
        raise PrivacyInputError(
            "included", f"array of shape {inc_raw.shape}", f"must have the shape of scores {s.shape}"
        )
    if inc_raw.dtype != bool and not np.all(np.isin(inc_raw, (0, 1))):
        raise PrivacyInputError("included", "non-boolean entries", "must be booleans (or 0/1)")
    inc = inc_raw.astype(bool)
    m = int(s.size)
    conf = _confidence(confidence)
    d = _finite("delta", delta)
    if not 0.0 <= d <= 1.0:
        raise PrivacyInputError("delta", delta, "must be a number with 0 <= delta <= 1")
    cands = _candidates(m, guesses)
    order = np.argsort(s, kind="stable")  # ascending
    counts = []
    for r in cands:
        n_in, n_out = (r + 1) // 2, r // 2
        top = order[m - n_in :]
        bottom = order[:n_out]
        counts.append((r, int(np.count_nonzero(inc[top]) + np.count_nonzero(~inc[bottom]))))
    return _audit_result(m, counts, d, conf)


def _candidates(m: int, guesses: Sequence[int] | None) -> tuple[int, ...]:
    """The audit's candidate numbers of guesses (validated, deduplicated, sorted): ``guesses`` or the default."""
    if guesses is None:
        cands = _default_guesses(m)
    else:
        cands = tuple(sorted({_int("guesses", g, 1, m, f"m = {m}") for g in guesses}))
    if not cands:
        raise PrivacyInputError("guesses", guesses, f"must hold at least one number of guesses in 1..{m}")
    return cands


def _audit_result(m: int, counts: Sequence[tuple[int, int]], d: float, conf: float) -> dict[str, Any]:
    """The audit's answer from each candidate's ``(guesses, correct)``: every candidate's bound at the
    Bonferroni confidence, the largest of them at ``conf`` overall (shared by :func:`one_run_audit` and
    :func:`one_run_ceiling`, so the ceiling is computed exactly as the bound is)."""
    per_conf = 1.0 - (1.0 - conf) / len(counts)
    results = []
    for r, v in counts:
        eps = one_run_lower_bound(m, r, v, d, per_conf)
        results.append({"guesses": r, "correct": v, "confidence": per_conf, "epsilon_lower_bound": eps})
    best = max(results, key=lambda c: c["epsilon_lower_bound"])  # max keeps the first on ties
    return {
        "epsilon_lower_bound": best["epsilon_lower_bound"],
        "confidence": conf,
        "guesses": best["guesses"],
        "correct": best["correct"],
        "m": m,
        "candidates": results,
    }


def one_run_ceiling(
    m: int,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[int] | None = None,
    included: Any = None,
) -> dict[str, Any]:
    """The largest lower bound :func:`one_run_audit` can return with ``m`` canaries at ``confidence``: its
    answer when every guess it can get right is right (the same candidates, Bonferroni correction and delta
    term, computed by the same code).

    Without ``included``: every candidate's ``r`` guesses all right (``correct = r``), the ceiling before the
    canaries' coins are tossed. With ``included`` (the run's inserted canaries, ``m`` booleans): the audit itself
    on perfect scores (every inserted canary above every other), the ceiling of this run: where fewer than
    ``ceil(r/2)`` canaries were inserted (or fewer than ``floor(r/2)`` left out) not all ``r`` guesses can be
    right, since the guessing rule splits them evenly. No score can do better (each candidate's count of
    correct guesses is then as large as it can be, and the bound grows with it), so a certified epsilon above
    this ceiling cannot be refuted by this audit, whatever the mechanism did. Returns :func:`one_run_audit`'s
    dictionary.
    """
    m = _int("m", m, 1)
    if included is not None:
        inc = np.asarray(included)
        if inc.shape != (m,):
            raise PrivacyInputError("included", f"array of shape {inc.shape}", f"must have the shape ({m},)")
        return one_run_audit(inc.astype(float), inc, delta, confidence, guesses)
    conf = _confidence(confidence)
    d = _finite("delta", delta)
    if not 0.0 <= d <= 1.0:
        raise PrivacyInputError("delta", delta, "must be a number with 0 <= delta <= 1")
    return _audit_result(m, [(r, r) for r in _candidates(m, guesses)], d, conf)


def one_run_canaries_needed(
    epsilon: float, delta: float, confidence: float = 0.95, start: int = 16, most: int = 1 << 22
) -> dict[str, Any]:
    """How many canaries (``m`` directions: ``privacy.canaries = m / 2``) :func:`one_run_audit` needs before its
    ceiling (:func:`one_run_ceiling`, every guess right, default candidates) reaches ``epsilon``, if any number
    does.

    The delta term grows with ``m`` (``2 m delta`` in the p-value), so the ceiling does not grow without end: it
    rises like ``log m`` and then falls once ``m delta`` is no longer small (at ``delta = 1e-5`` and 95% it
    peaks near 6.6, at about 6,400 canaries). The ceiling is computed (exactly, by the audit's own code) at
    ``start`` doubled until it reaches ``epsilon``, falls, or passes ``most``; a crossing is then narrowed by
    bisection to the smallest count (to 1%). Returns ``{"canaries": m or None, "peak": the largest ceiling seen,
    "peak_canaries": where}``; ``canaries`` is None when no count up to ``most`` reaches ``epsilon``.
    """
    eps = float(epsilon)
    if math.isnan(eps) or eps < 0:
        raise PrivacyInputError("epsilon", epsilon, "must be a number >= 0")
    conf = _confidence(confidence)
    m = _int("start", start, 1)

    def ceiling(n: int) -> float:
        return float(one_run_ceiling(n, delta, conf)["epsilon_lower_bound"])

    prev_m, prev_c = None, -math.inf
    peak, peak_m = -math.inf, m
    while m <= most:
        c = ceiling(m)
        if c > peak:
            peak, peak_m = c, m
        if c >= eps:
            lo, hi = (prev_m or 1), m  # ceiling(lo) < eps <= ceiling(hi)
            while hi - lo > max(1, hi // 100):
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if ceiling(mid) >= eps else (mid, hi)
            return {"canaries": hi, "peak": peak, "peak_canaries": peak_m}
        if c < prev_c:  # past the peak: more canaries only lower it
            break
        prev_m, prev_c = m, c
        m *= 2
    return {"canaries": None, "peak": peak, "peak_canaries": peak_m}


def gaussian_mechanism_scores(
    m: int, mu: float, rng: np.random.Generator | int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of an exact Gaussian mechanism, the idealised setting of Steinke et al. (2023, experiments).

    ``included[j] ~ Bernoulli(1/2)`` independently and ``score[j] = mu * included[j] + N(0, 1)``, i.e.
    sensitivity ``mu`` in noise units (noise multiplier ``1 / mu``). Returns
    ``(scores (m,) float, included (m,) bool)``. ``rng`` is a numpy Generator or a seed.
    """
    m = _int("m", m, 1)
    mu = _finite("mu", mu)
    gen = np.random.default_rng(rng)
    included = gen.random(m) < 0.5
    scores = mu * included + gen.standard_normal(m)
    return scores, included
