"""Closed-form composition bounds, vectorised over rounds.

Paper bounds (He, Wang, Tao), transcribed **as printed** and never presented as certificates:

* ``igmm``: UAI 2021 Theorem 7 (IGMM). With ``x = delta/(1+e^et)``::

      eps0   = (sqrt(2)*D*sigma/tau*sqrt(log(1/delta)) + D^2/tau^2) / (2*sigma^2)
      et     = log((N-tau)/N + (tau/N)*exp(eps0))
      eps'   = sqrt(2*T*log(1/dtil)*et^2) + T*et*(e^et-1)/(e^et+1)
      K      = ceil(N*eps'/(tau*et))
      dtil'  = e^{-(eps'+T*et)/2} ((T*et+eps')/(T*et-eps'))^{-(eps'+T*et)/(2*et)} ((1/(1+e^et)) 2*T*et/(T*et-eps'))^T
      delta' = 2 - (1-x)^T + dtil' - (1-e^et*x)^K (1-x)^(T-K)

  ``dtil'`` is undefined when ``eps' >= T*et``; where ``delta' >= 1`` there is no statement.
* ``dp-fl-thm8``: arXiv Theorem 8 (DP federated learning), with ``p = tau/N``, ``sigma`` the noise
  std on the average relative to the clip (``z/tau``)::

      et8    = (4*sigma/tau*sqrt(log(1/delta)) + 1/tau^2) / (2*sigma^2)
      eps'   = sqrt(8*log(1/dtil)*p^2*T*et8^2) + 2*T*p*et8*(e^{2p et8}-1)/(e^{2p et8}+1)
      K8     = ceil(N*eps'/(2*tau*et8))
      y      = p*delta/(1+e^{2p et8})
      delta' = 1 - (1-e^{2p et8} y)^K8 (1-y)^(T-K8) + 1 - (1-y)^T + dtil8
      dtil8  = e^{-(eps'+p*T*et8)/2} ((1/(1+e^{p et8})) 2pT et8/(pT et8-eps'))^T
               ((p et8 T+eps')/(pT et8-eps'))^{-(N eps'+tau T et8)/(2 tau et8)}

  Eq. (15) prints ``eps`` (no tilde) in eps'; it is read as ``et8``. The printed statement uses the
  symbol dtil both inside eps' and for the Chernoff term (a circular definition); as in UAI
  Theorem 7, the one inside eps' is a free parameter and the Chernoff term is ``dtil8``.

Valid closed forms (certificates):

* ``igmm-corrected``: the paper's structure with the defects removed (formula sheet section 3):
  exact Gaussian per-step eps at per-step delta, amplification ``et = log(1+q(e^eps0-1))`` with
  per-step delta ``q*delta``, and Kairouz et al. (2015) Theorem 3.4:
  ``eps' = min(T et, T et tanh(et/2) + et sqrt(2T log(e + sqrt(T et^2)/dtil)),
  T et tanh(et/2) + et sqrt(2T log(1/dtil)))``, ``delta' = 1-(1-q delta)^T (1-dtil)``.
* ``kairouz``: the optimal composition of the per-step (et, q*delta) (Kairouz, Oh, Viswanath 2015,
  Theorem 3.3), evaluated exactly (binomial CDFs) on its grid ``eps'_i = (T-2i)*et``: the best any
  bound built from per-step (eps, delta) pairs can certify (tight only on the grid).
* ``basic``: ``eps' = T*et``, ``delta' = T*q*delta_step``.

Per-step parameters for a target total delta (documented conventions, the theorems leave them free):
``dtil = delta/2`` for igmm, dp-fl-thm8 and igmm-corrected; for the printed theorems the per-step
delta is then the largest (22 bisection steps in log space: within 0.003% of the largest) whose printed ``delta'`` is at most the
target; for igmm-corrected ``1-(1-q delta_step)^T (1-dtil) = delta``; for kairouz half the target goes
to ``1-(1-q delta_step)^T`` and the rest to the optimal-composition term; for basic
``T q delta_step = delta``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "calibrate_step_delta",
    "dpfl_theorem8",
    "igmm_theorem7",
    "kairouz_theorem34",
    "optimal_composition_delta",
    "optimal_composition_epsilon",
    "paper_composition",
]

_NAN = np.nan


def _pow1m(x, n):
    """(1 - x)^n computed as exp(n*log1p(-x)), exact for tiny x."""
    return np.exp(n * np.log1p(-x))


def igmm_theorem7(N, tau, T, sigma, D, delta, dtil) -> dict:
    """UAI Theorem 7 exactly as printed; every input broadcasts (arrays of T, delta, ...).

    Returns a dict of arrays: eps0, et, eps_prime, K, dtil_prime, delta_prime, defined (dtil' is
    defined: eps' < T*et), statement (defined, finite and 0 <= delta' < 1).
    """
    N, tau, T, sigma, D, delta, dtil = (
        np.asarray(v, dtype=float) for v in (N, tau, T, sigma, D, delta, dtil)
    )
    with np.errstate(all="ignore"):
        L = np.log(1.0 / delta)
        eps0 = (np.sqrt(2.0) * D * sigma / tau * np.sqrt(L) + D**2 / tau**2) / (2.0 * sigma**2)
        et = np.log((N - tau) / N + (tau / N) * np.exp(eps0))
        # the same value where exp(eps0) overflows (eps0 > ~709): log((N-tau)/N + tau/N e^eps0) in log space
        et = np.where(np.isfinite(et), et, np.logaddexp(np.log1p(-tau / N), np.log(tau / N) + eps0))
    out = paper_composition(et, delta, T, dtil, K_scale=N / tau)
    out["eps0"] = eps0
    return out


def paper_composition(et, delta, T, dtil, K_scale=1.0) -> dict:
    """The composition step of UAI Corollary 2 / Theorem 7 as printed, for per-step (et, delta).

    ``K = ceil(K_scale * eps'/et)``: ``K_scale = 1`` is Corollary 2, ``K_scale = N/tau`` is the
    exponent printed in Theorem 7. Returns eps_prime, K, dtil_prime, delta_prime, defined, statement.
    """
    et, delta, T, dtil, K_scale = (np.asarray(v, dtype=float) for v in (et, delta, T, dtil, K_scale))
    with np.errstate(all="ignore"):
        th = np.tanh(et / 2.0)  # (e^et - 1)/(e^et + 1)
        eps_p = np.sqrt(2.0 * T * np.log(1.0 / dtil) * et**2) + T * et * th
        K = np.ceil(K_scale * eps_p / et)
        Tet = T * et
        defined = Tet > eps_p
        gap = np.where(defined, Tet - eps_p, _NAN)
        log_dtil_p = (
            -(eps_p + Tet) / 2.0
            - (eps_p + Tet) / (2.0 * et) * np.log((Tet + eps_p) / gap)
            + T * (np.log(2.0 * Tet / gap) - np.logaddexp(0.0, et))
        )
        dtil_p = np.exp(log_dtil_p)
        log_x = np.log(delta) - np.logaddexp(0.0, et)  # x = delta/(1+e^et)
        x = np.exp(log_x)
        ex = np.exp(log_x + et)  # delta*e^et/(1+e^et)
        A = -np.expm1(T * np.log1p(-x))  # 1 - (1-x)^T
        B = -np.expm1(K * np.log1p(-ex) + (T - K) * np.log1p(-x))  # 1 - (1-e^et x)^K (1-x)^(T-K)
        delta_p = A + B + dtil_p
        statement = defined & np.isfinite(delta_p) & (delta_p < 1.0) & (delta_p >= 0) & np.isfinite(eps_p)
    return dict(
        et=et,
        eps_prime=eps_p,
        K=K,
        dtil_prime=dtil_p,
        delta_prime=delta_p,
        defined=defined,
        statement=statement,
        defined_below=Tet,
    )


def dpfl_theorem8(N, tau, T, sigma, delta, dtil) -> dict:
    """arXiv Theorem 8 as printed (sigma = noise std on the average relative to the clip, i.e. z/tau)."""
    N, tau, T, sigma, delta, dtil = (np.asarray(v, dtype=float) for v in (N, tau, T, sigma, delta, dtil))
    with np.errstate(all="ignore"):
        p = tau / N
        L = np.log(1.0 / delta)
        et = (4.0 * sigma / tau * np.sqrt(L) + 1.0 / tau**2) / (2.0 * sigma**2)
        a = p * et  # the linearised amplified per-step epsilon is 2*a in eps' and delta'
        eps_p = np.sqrt(8.0 * np.log(1.0 / dtil) * (p**2 * T * et**2)) + 2.0 * T * a * np.tanh(a)
        K = np.ceil(N * eps_p / (2.0 * tau * et))
        pTet = p * T * et
        defined = pTet > eps_p
        gap = np.where(defined, pTet - eps_p, _NAN)
        log_dtil = (
            -(eps_p + pTet) / 2.0
            + T * (np.log(2.0 * pTet / gap) - np.logaddexp(0.0, a))
            - (N * eps_p + tau * T * et) / (2.0 * tau * et) * np.log((pTet + eps_p) / gap)
        )
        dtil8 = np.exp(log_dtil)
        log_y = np.log(p * delta) - np.logaddexp(0.0, 2.0 * a)
        y = np.exp(log_y)
        ey = np.exp(log_y + 2.0 * a)
        B = -np.expm1(K * np.log1p(-ey) + (T - K) * np.log1p(-y))
        A = -np.expm1(T * np.log1p(-y))
        delta_p = B + A + dtil8
        statement = defined & np.isfinite(delta_p) & (delta_p < 1.0) & (delta_p >= 0) & np.isfinite(eps_p)
    # the Chernoff factor is defined where eps' < p*T*et8 (= T*a): half of T times the linearised per-step
    # epsilon 2a that the theorem composes
    return dict(
        eps0=et,
        et=2.0 * a,
        eps_prime=eps_p,
        K=K,
        dtil_prime=dtil8,
        delta_prime=delta_p,
        defined=defined,
        statement=statement,
        defined_below=pTet,
    )


def calibrate_step_delta(fn, target, iterations: int = 22, span: float = 120.0) -> tuple[np.ndarray, dict]:
    """Largest per-step delta (per element) with printed ``delta' <= target``, by bisection in log space.

    ``fn(delta_step) -> dict`` evaluates a printed theorem. Elements where even the smallest
    per-step delta tried fails keep that smallest value and are reported by the caller from the
    returned evaluation (``delta_prime > target``).
    """
    target = float(target)
    hi0 = np.log(min(target, 0.5))
    probe = fn(np.exp(hi0))
    shape = np.shape(probe["eps_prime"])
    lo = np.full(shape, hi0 - span)
    hi = np.full(shape, hi0)
    ok_hi = probe["statement"] & (probe["delta_prime"] <= target)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        r = fn(np.exp(mid))
        ok = r["statement"] & (r["delta_prime"] <= target)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    best = np.where(ok_hi, hi0, lo)
    return np.exp(best), fn(np.exp(best))


def kairouz_theorem34(et, T, dtil):
    """Kairouz et al. (2015) Theorem 3.4: eps' of T-fold composition of (et, .)-DP, slack dtil."""
    et, T, dtil = (np.asarray(v, dtype=float) for v in (et, T, dtil))
    th = np.tanh(et / 2.0)
    base = T * et * th
    e1 = T * et
    e2 = base + et * np.sqrt(2.0 * T * np.log(np.e + np.sqrt(T * et**2) / dtil))
    e3 = base + et * np.sqrt(2.0 * T * np.log(1.0 / dtil))
    return np.minimum(e1, np.minimum(e2, e3))


def optimal_composition_delta(eps, T, eps_prime, delta=0.0):
    """Exact optimal delta' of the T-fold composition of (eps, delta)-DP at any eps' (vectorised).

    Murtagh and Vadhan (2016) / Kairouz et al. (2015) Thm 3.3:
    ``delta' = 1 - (1-delta)^T (1 - sum_l C(T,l) max(0, e^{(T-l)eps} - e^{eps'} e^{l eps}) / (1+e^eps)^T)``.
    The sum is ``P[X <= L] - e^{eps'} P[Y <= L]`` with ``X ~ Bin(T, 1/(1+e^eps))``,
    ``Y ~ Bin(T, e^eps/(1+e^eps))`` and ``L`` the largest ``l`` with ``(T-2l)*eps > eps'``.
    """
    eps, T, eps_prime, delta = (np.asarray(v, dtype=float) for v in (eps, T, eps_prime, delta))
    with np.errstate(all="ignore"):
        Lmax = np.ceil((T * eps - eps_prime) / (2.0 * eps)) - 1.0
        Lmax = np.minimum(Lmax, T)
        p_small = 1.0 / (1.0 + np.exp(eps))
        has = Lmax >= 0
        k_int = np.maximum(np.nan_to_num(Lmax, nan=0.0, posinf=0.0, neginf=0.0), 0).astype(np.int64)
        n_int = np.round(T).astype(np.int64)
        from scipy.special import (
            bdtr,  # scipy on first use: Ray workers import fedsim.privacy with every plan
        )

        px = np.where(has, bdtr(k_int, n_int, p_small), 0.0)
        py = np.where(has, bdtr(k_int, n_int, 1.0 - p_small), 0.0)
        ey = np.where(py > 0, np.exp(eps_prime + np.log(np.where(py > 0, py, 1.0))), 0.0)
        d0 = np.where(has, np.maximum(px - ey, 0.0), 0.0)
        return -np.expm1(T * np.log1p(-delta)) + np.exp(T * np.log1p(-delta)) * d0


def optimal_composition_epsilon(eps, T, delta_step, target, iterations: int = 16):
    """Smallest grid point ``(T-2i)*eps`` whose optimal delta' (Thm 3.3) is at most ``target``.

    Vectorised over T (and eps). Returns NaN where even ``T*eps`` (i = 0, delta' = 1-(1-delta)^T)
    exceeds the target.
    """
    eps, T, delta_step = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (eps, T, delta_step)))
    lo = np.zeros(T.shape)  # i = 0 always satisfies if any does (eps' = T*eps, d0 = 0)
    hi = np.floor(T / 2.0)
    ok0 = optimal_composition_delta(eps, T, T * eps, delta_step) <= target
    # find the largest i in [0, floor(T/2)] with delta'((T-2i) eps) <= target (delta' increasing in i)
    ok_hi = optimal_composition_delta(eps, T, (T - 2 * hi) * eps, delta_step) <= target
    n_iter = int(np.ceil(np.log2(max(2.0, float(np.max(hi)) + 1)))) + 1
    for _ in range(max(iterations, n_iter)):
        mid = np.floor(0.5 * (lo + hi))
        ok = optimal_composition_delta(eps, T, (T - 2 * mid) * eps, delta_step) <= target
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
        if np.all(hi - lo <= 1):
            break
    best = np.where(ok_hi, np.floor(T / 2.0), lo)
    out = (T - 2 * best) * eps
    return np.where(ok0, out, np.nan)
