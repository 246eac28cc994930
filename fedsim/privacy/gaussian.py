"""The exact Gaussian mechanism (Balle and Wang 2018) and privacy amplification by subsampling.

For L2 sensitivity ``Delta`` and noise std ``s``, with ``r = Delta / s``, the privacy loss is
``N(r^2/2, r^2)`` and the exact privacy profile is

    delta(eps) = Phi(r/2 - eps/r) - exp(eps) * Phi(-r/2 - eps/r).

Everything here is vectorised over numpy arrays and works in log space so that deltas down to
1e-300 do not round to zero.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "amplify_epsilon",
    "classical_gaussian_epsilon",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_log_delta",
]


def gaussian_log_delta(eps, r):
    """log of the exact delta(eps) of the Gaussian mechanism with sensitivity/noise ratio ``r``."""
    eps = np.asarray(eps, dtype=float)
    r = np.asarray(r, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        from scipy.special import log_ndtr  # on first use (see closed_forms)

        la = log_ndtr(r / 2.0 - eps / r)
        lb = log_ndtr(-r / 2.0 - eps / r)
        diff = eps + lb - la  # < 0 always (the profile is positive)
        diff = np.minimum(diff, -1e-300)
        out = la + np.log(-np.expm1(diff))
    return out


def gaussian_delta(eps, r):
    """Exact delta(eps) of the Gaussian mechanism with sensitivity/noise ratio ``r`` (vectorised)."""
    return np.exp(gaussian_log_delta(eps, r))


def classical_gaussian_epsilon(delta, r):
    """The classical tail bound ``eps = r^2/2 + r*sqrt(2*log(1/delta))`` (valid, not tight)."""
    delta = np.asarray(delta, dtype=float)
    r = np.asarray(r, dtype=float)
    return r * r / 2.0 + r * np.sqrt(2.0 * np.log(1.0 / delta))


def gaussian_epsilon(delta, r, iterations: int = 12):
    """Smallest eps with exact ``delta(eps) <= delta`` for the Gaussian mechanism (vectorised).

    Safeguarded Newton iteration on ``log delta(eps)`` inside a bracket ``[0, classical bound]``
    (bisection whenever a Newton step leaves the bracket). The returned value always satisfies
    ``delta(eps) <= delta`` (it is the upper end of the final bracket), so it is never below the exact
    epsilon by more than float error. Where ``delta(0) <= delta`` the answer is 0.
    """
    delta = np.asarray(delta, dtype=float)
    r = np.asarray(r, dtype=float)
    delta, r = np.broadcast_arrays(delta, r)
    log_target = np.log(delta)
    lo = np.zeros(delta.shape)
    hi = classical_gaussian_epsilon(delta, r) * (1 + 1e-12) + 1e-15
    x = hi.copy()
    with np.errstate(all="ignore"):
        for _ in range(iterations):
            from scipy.special import log_ndtr  # on first use (see closed_forms)

            la = log_ndtr(r / 2.0 - x / r)
            lb = log_ndtr(-r / 2.0 - x / r)
            ld = la + np.log(-np.expm1(np.minimum(x + lb - la, -1e-300)))
            f = ld - log_target
            feasible = f <= 0
            hi = np.where(feasible, np.minimum(hi, x), hi)
            lo = np.where(feasible, lo, np.maximum(lo, x))
            # d log(delta)/d eps = -e^eps Phi(-r/2 - eps/r) / delta(eps)
            slope = -np.exp(x + lb - ld)
            step = np.where(slope < 0, f / slope, np.nan)
            nx = x - step
            bad = ~np.isfinite(nx) | (nx <= lo) | (nx >= hi)
            nx = np.where(bad, 0.5 * (lo + hi), nx)
            if np.all(hi - lo <= 1e-13 * np.maximum(1.0, hi)) or np.all(
                np.abs(nx - x) <= 1e-15 * np.maximum(1.0, x)
            ):
                x = nx
                break
            x = nx
        # polish: the last iterate nudged up, if feasible, tightens hi
        cand = x * (1 + 1e-13) + 1e-300
        fc = gaussian_log_delta(cand, r) - log_target
        hi = np.where((fc <= 0) & (cand < hi), cand, hi)
    zero = gaussian_log_delta(0.0, r) <= log_target
    out = np.where(zero, 0.0, hi)
    return out if out.ndim else float(out)


def amplify_epsilon(eps, q):
    """Amplification by subsampling: ``log(1 + q*(exp(eps) - 1))`` (delta becomes ``q*delta``).

    Valid for Poisson sampling under add/remove and for sampling without replacement under
    replace-one (Balle, Barthe, Gaboardi 2018, Theorems 8 and 10).
    """
    eps = np.asarray(eps, dtype=float)
    q = np.asarray(q, dtype=float)
    with np.errstate(over="ignore", divide="ignore"):
        small = np.log1p(q * np.expm1(np.minimum(eps, 700.0)))
        # for large eps, log((1-q) + q e^eps) in log space: e^eps overflows past ~709
        large = np.logaddexp(np.log1p(-np.minimum(q, 1.0)), np.log(q) + eps)
    return np.where(eps < 700.0, small, large)
