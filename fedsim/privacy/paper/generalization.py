"""Generalization to unseen clients from client-level DP: Theorem 1 of He, Wang and Tao.

Losses in [0, 1]; the "examples" are clients and the population size ``N`` is the number of
clients. Statement: ``P(|Gen| > a) < b``.

UAI version (Theorem 1 with Lemma 1's explicit constants)::

    eps <= 1/5:  a = 4 eps,                  b = 2 e^{-1.7 eps} delta / eps * ln(2/eps)
    eps >  1/5:  a = 1.2 (1 - 0.9 e^{-eps}), b = 18 e^{-eps} delta / (1 - 0.9 e^{-eps}) * ln(220 / (1 - 0.9 e^{-eps}))
    precondition (Lemma 1):
      N >= max( 2/(0.077 eps^2) ln(43 / (254 e^{-1.7 eps} delta)),
                200 / ln(0.9 (1 - 0.9 e^{-eps})) * ln(9 e^{-eps} delta / 48180) )

arXiv version (Theorem 1): if ``N >= 2/eps^2 ln(16 / (e^{-eps} delta))`` then
``P(|Gen| < 9 eps) > 1 - e^{-eps} delta / eps ln(2/eps)``, i.e. ``a = 9 eps``,
``b = e^{-eps} delta / eps ln(2/eps)``.

An (eps, delta)-DP algorithm is also (eps2, delta)-DP for every eps2 >= eps, so the per-round
statement uses the admissible ``eps2 >= eps`` (precondition holds at the population size) with the
smallest ``a`` (in the UAI version ``a`` drops from 0.8 to 0.316 just above eps = 1/5, so that
point is a candidate too). Status: ``ok``; ``no-statement`` (no admissible eps2: the population is too
small, or eps is not finite); ``vacuous`` (a >= 1 or b >= 1 for every admissible eps2).
``n_min`` is the smallest population at which the statement for this (eps, delta) would be ``ok``
(None if it never is, e.g. ``eps`` so large that ``a >= 1``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.optimize import brentq

from fedsim.privacy.accountants import DEFAULT_ACCOUNTANT, compute_curve
from fedsim.privacy.errors import PrivacyInputError

__all__ = [
    "VERSIONS",
    "corollary3_curve",
    "generalization_statement",
    "min_population",
    "precondition_n",
    "statement_curve",
    "theorem1_ab",
]

VERSIONS = ("uai", "arxiv")
_EPS_MAX = 50.0


def _check_version(version: str) -> str:
    if version not in VERSIONS:
        raise PrivacyInputError("version", version, f"must be one of {', '.join(VERSIONS)}")
    return version


def theorem1_ab(eps, delta, version: str = "uai"):
    """(a, b) of Theorem 1 at (eps, delta) (vectorised)."""
    _check_version(version)
    eps = np.asarray(eps, dtype=float)
    delta = np.asarray(delta, dtype=float)
    with np.errstate(all="ignore"):
        if version == "arxiv":
            a = 9.0 * eps
            b = np.exp(-eps) * delta / eps * np.log(2.0 / eps)
            return a, b
        g = 1.0 - 0.9 * np.exp(-eps)
        small = eps <= 0.2
        a = np.where(small, 4.0 * eps, 1.2 * g)
        b = np.where(
            small,
            2.0 * np.exp(-1.7 * eps) * delta / eps * np.log(2.0 / eps),
            18.0 * np.exp(-eps) * delta / g * np.log(220.0 / g),
        )
    return a, b


def precondition_n(eps, delta, version: str = "uai"):
    """Smallest population allowed by the precondition at (eps, delta) (real-valued, vectorised)."""
    _check_version(version)
    eps = np.asarray(eps, dtype=float)
    delta = np.asarray(delta, dtype=float)
    with np.errstate(all="ignore"):
        if version == "arxiv":
            return 2.0 / eps**2 * np.log(16.0 / (np.exp(-eps) * delta))
        t1 = 2.0 / (0.077 * eps**2) * np.log(43.0 / (254.0 * np.exp(-1.7 * eps) * delta))
        t2 = 200.0 / np.log(0.9 * (1.0 - 0.9 * np.exp(-eps))) * np.log(9.0 * np.exp(-eps) * delta / 48180.0)
        return np.maximum(t1, t2)


@functools.lru_cache(maxsize=4096)
def _admissible_interval(population: float, delta: float, version: str) -> tuple[float, float] | None:
    """[lo, hi] of eps with precondition_n(eps) <= population, or None (quasi-convex in eps)."""
    N = float(population)

    def f(e):
        return float(precondition_n(e, delta, version)) - N

    if version == "arxiv":  # decreasing in eps
        if f(_EPS_MAX) > 0:
            return None
        lo_e = 1e-12
        if f(lo_e) <= 0:
            return (lo_e, _EPS_MAX)
        return (brentq(f, lo_e, _EPS_MAX, xtol=1e-14, rtol=1e-13) * (1 + 1e-12), _EPS_MAX)
    # UAI: t1 decreasing, t2 increasing: the max is smallest where they cross
    e_cross = _uai_crossing(delta)
    if f(e_cross) > 0:
        return None
    lo = brentq(f, 1e-9, e_cross, xtol=1e-15, rtol=1e-14) if f(1e-9) > 0 else 1e-9
    hi = brentq(f, e_cross, 1e4, xtol=1e-15, rtol=1e-14) if f(1e4) > 0 else 1e4
    # nudge inside (brentq tolerance) and confirm
    lo2, hi2 = lo * (1 + 1e-10), hi * (1 - 1e-10)
    if f(lo2) > 0 or f(hi2) > 0 or lo2 > hi2:
        return None
    return (lo2, hi2)


def _validate(eps, delta, population):
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise PrivacyInputError(
            "epsilon", eps, "must be a number >= 0 (inf or NaN give no statement)"
        ) from None
    if e < 0:
        raise PrivacyInputError("epsilon", eps, "must be >= 0")
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise PrivacyInputError("delta", delta, "must be in (0, 1)") from None
    if not (0 < d < 1):
        raise PrivacyInputError("delta", delta, "must be in (0, 1)")
    if isinstance(population, bool) or not isinstance(population, (int, np.integer)) or population < 1:
        raise PrivacyInputError("population", population, "must be an integer >= 1")
    return e, d, int(population)


def _n_min(eps: float, delta: float, version: str) -> int | None:
    """Smallest population at which some eps2 >= eps gives an ``ok`` (non-vacuous) statement.

    The precondition is quasi-convex in eps2 (UAI: a decreasing and an increasing term; arXiv:
    decreasing), so its minimum over the non-vacuous eps2 >= eps is found on a dense grid plus the
    exact candidates (eps itself and the crossing of the two UAI terms), then confirmed.
    """
    if not math.isfinite(eps):
        return None
    start = max(eps, 1e-9)
    if start >= _EPS_MAX:
        return None
    pts = [start, *np.geomspace(start, _EPS_MAX, 4000), *_boundary_points(delta, version)]
    grid = np.asarray([p for p in pts if p >= start])
    a, b = theorem1_ab(grid, delta, version)
    n = precondition_n(grid, delta, version)
    ok = (a < 1) & (b < 1) & (b >= 0) & np.isfinite(n)
    if not ok.any():
        return None
    n_best = max(1, int(math.ceil(float(np.min(n[ok])) * (1 + 1e-12))))
    for k in range(64):  # confirm against the statement itself (guards rounding at the boundary)
        if _statement(eps, delta, n_best + k, version)["status"] == "ok":
            return n_best + k
    return None


def _boundary_points(delta: float, version: str) -> list[float]:
    """Exact points where the statement's best eps2 can sit: the precondition's minimiser (UAI), both
    sides of eps = 1/5 (UAI), and just below the vacuity threshold of a (a < 1)."""
    if version == "arxiv":
        return [float(np.nextafter(1.0 / 9.0, 0.0))]
    pts = [0.2, float(np.nextafter(0.2, 1.0)), float(np.nextafter(math.log(5.4), 0.0))]
    try:
        pts.append(_uai_crossing(delta))
    except ValueError:
        pass
    return pts


@functools.lru_cache(maxsize=1024)
def _uai_crossing(delta: float) -> float:
    """eps where the two terms of Lemma 1's precondition are equal (the precondition's minimiser)."""

    def t_diff(e):
        t1 = 2.0 / (0.077 * e**2) * math.log(43.0 / (254.0 * math.exp(-1.7 * e) * delta))
        t2 = (
            200.0
            / math.log(0.9 * (1.0 - 0.9 * math.exp(-e)))
            * math.log(9.0 * math.exp(-e) * delta / 48180.0)
        )
        return t1 - t2

    return brentq(t_diff, 1e-6, _EPS_MAX, xtol=1e-14, rtol=1e-13)


def _statement(eps: float, delta: float, population: int, version: str) -> dict:
    base = dict(
        status="no-statement",
        a=None,
        b=None,
        eps_used=None,
        version=version,
        epsilon=eps,
        delta=delta,
        population=population,
    )
    if not math.isfinite(eps):
        return base
    iv = _admissible_interval(float(population), delta, version)
    if iv is None:
        return base
    lo, hi = iv
    s = max(eps, lo)
    if s > hi:
        return base
    cands = [s]
    if version == "uai" and s <= 0.2 < hi:
        cands.append(float(np.nextafter(0.2, 1.0)))
    # a few more admissible points in case b is vacuous at the smallest-a candidate
    cands += list(np.geomspace(s, min(hi, _EPS_MAX), 64)[1:])
    c = np.asarray(cands)
    a, b = theorem1_ab(c, delta, version)
    ok = (a < 1) & (b < 1) & (b >= 0)
    if ok.any():
        idx = np.flatnonzero(ok)
        i = idx[np.lexsort((b[idx], a[idx]))[0]]
        return dict(base, status="ok", a=float(a[i]), b=float(b[i]), eps_used=float(c[i]))
    i = int(np.argmin(a))
    return dict(base, status="vacuous", a=float(a[i]), b=float(b[i]), eps_used=float(c[i]))


def generalization_statement(epsilon, delta, population, version: str = "uai") -> dict:
    """Per-round generalization statement from the certified (epsilon, delta) at population size.

    Returns ``dict(status, a, b, eps_used, n_min, version, epsilon, delta, population)``; see the
    module docstring. ``a``, ``b``, ``eps_used`` are None when ``status == "no-statement"``.
    """
    _check_version(version)
    eps, d, n = _validate(epsilon if epsilon == epsilon else math.inf, delta, population)
    st = _statement(eps, d, n, version)
    st["n_min"] = _n_min(eps, d, version)
    return st


def statement_curve(epsilons, delta, population, version: str = "uai") -> list[dict]:
    """Statements for a whole epsilon curve (one dict per round), vectorised.

    Same rule as :func:`generalization_statement`; the candidates for eps2 are the smallest admissible
    value and (UAI) the point just above 1/5, and ``n_min`` takes the minimum of the precondition
    over the non-vacuous eps2 >= eps on a 4000-point grid plus eps itself (exact at eps and at the
    precondition's minimiser, which is on the grid).
    """
    _check_version(version)
    eps = np.asarray(epsilons, dtype=float).ravel()
    _validate(0.0, delta, population)
    d, n = float(delta), int(population)
    eps = np.where(np.isnan(eps), np.inf, eps)
    if (eps < 0).any():
        raise PrivacyInputError("epsilon", float(eps[eps < 0][0]), "must be >= 0")
    iv = _admissible_interval(float(n), d, version)
    out_status = np.full(eps.size, "no-statement", dtype=object)
    a_out = np.full(eps.size, np.nan)
    b_out = np.full(eps.size, np.nan)
    e_out = np.full(eps.size, np.nan)
    if iv is not None:
        lo, hi = iv
        s_ = np.maximum(eps, lo)
        admissible = np.isfinite(eps) & (s_ <= hi)
        a1, b1 = theorem1_ab(np.where(admissible, s_, 1.0), d, version)
        ok1 = admissible & (a1 < 1) & (b1 < 1) & (b1 >= 0)
        a_best, b_best, e_best, ok_best = a1, b1, s_, ok1
        if version == "uai":
            e2 = float(np.nextafter(0.2, 1.0))
            use2 = admissible & (s_ <= 0.2) & (hi > 0.2)
            a2, b2 = theorem1_ab(e2, d, version)
            ok2 = use2 & (a2 < 1) & (b2 < 1) & (b2 >= 0)
            better = ok2 & (~ok1 | (a2 < a1))
            a_best = np.where(better, a2, a1)
            b_best = np.where(better, b2, b1)
            e_best = np.where(better, e2, s_)
            ok_best = ok1 | ok2
        out_status = np.where(admissible, np.where(ok_best, "ok", "vacuous"), "no-statement").astype(object)
        a_out = np.where(admissible, a_best, np.nan)
        b_out = np.where(admissible, b_best, np.nan)
        e_out = np.where(admissible, e_best, np.nan)
    # n_min: suffix minimum of the precondition over non-vacuous grid points
    grid = np.unique(np.concatenate([np.geomspace(1e-9, _EPS_MAX, 4000), _boundary_points(d, version)]))
    ga, gb = theorem1_ab(grid, d, version)
    gn = precondition_n(grid, d, version)
    gn = np.where((ga < 1) & (gb < 1) & (gb >= 0) & np.isfinite(gn), gn, np.inf)
    suffix = np.minimum.accumulate(gn[::-1])[::-1]
    idx = np.searchsorted(grid, eps, side="left")
    after = np.where(idx < grid.size, suffix[np.minimum(idx, grid.size - 1)], np.inf)
    ea, eb = theorem1_ab(np.where(np.isfinite(eps), np.maximum(eps, 1e-9), 1.0), d, version)
    at = np.where(
        np.isfinite(eps) & (ea < 1) & (eb < 1) & (eb >= 0),
        precondition_n(np.maximum(eps, 1e-9), d, version),
        np.inf,
    )
    nmin = np.minimum(after, at)
    rows = []
    for i in range(eps.size):
        st = out_status[i]
        rows.append(
            dict(
                status=str(st),
                a=None if st == "no-statement" else float(a_out[i]),
                b=None if st == "no-statement" else float(b_out[i]),
                eps_used=None if st == "no-statement" else float(e_out[i]),
                n_min=None if not np.isfinite(nmin[i]) else int(math.ceil(nmin[i] * (1 + 1e-12))),
                version=version,
                epsilon=float(eps[i]),
                delta=d,
                population=n,
            )
        )
    return rows


def corollary3_curve(populations, delta=None, version: str = "uai") -> dict:
    """Corollary 3: the best statement available at population C (privacy cost eps -> 0).

    For each C, the smallest admissible eps (the precondition at N = C) and the resulting a, b, with
    ``delta = 1/C^2`` unless given (the corollary's ``delta = O~(1/C^2)``). ``a`` decays as
    O~(1/sqrt(C)) and ``b`` as O~(C^-3/2). Returns arrays ``C, delta, eps_min, a, b, status``.
    """
    _check_version(version)
    C = np.asarray(populations, dtype=int).ravel()
    if C.size == 0 or (C < 1).any():
        raise PrivacyInputError("populations", populations, "must be integers >= 1")
    out = dict(
        C=C,
        delta=np.empty(C.size),
        eps_min=np.full(C.size, np.nan),
        a=np.full(C.size, np.nan),
        b=np.full(C.size, np.nan),
        status=np.empty(C.size, dtype=object),
    )
    for i, c in enumerate(C):
        d = float(delta) if delta is not None else 1.0 / float(c) ** 2
        if not (0 < d < 1):
            d = min(max(d, 1e-300), 0.5)
        out["delta"][i] = d
        st = _statement(0.0, d, int(c), version)
        out["status"][i] = st["status"]
        if st["status"] != "no-statement":
            out["eps_min"][i] = st["eps_used"]
            out["a"][i] = st["a"]
            out["b"][i] = st["b"]
    return out


def min_population(
    mechanism,
    rounds: int,
    delta: float,
    method: str = DEFAULT_ACCOUNTANT,
    version: str = "uai",
    max_population: int = 10**9,
) -> int | None:
    """Smallest population at which the statement after ``rounds`` rounds of ``mechanism`` is ``ok``.

    The mechanism keeps its sampling rate if it was given as a rate (or is "all"), or its clients per
    round if given as a count (then a larger population also lowers epsilon through q = tau/N).
    Returns None if no population up to ``max_population`` suffices.
    """

    def mech_at(n: int):
        return mechanism.at_population(n)  # the sampling scheme keeps what was given: the rate or the cohort

    def eps_at(n: int) -> float:
        return float(compute_curve(mech_at(n), rounds, delta, method).epsilon[-1])

    def ok(n: int) -> bool:
        return generalization_statement(eps_at(n), delta, n, version)["status"] == "ok"

    lo = mechanism.scheme.min_population(mechanism)  # the smallest population that can hold the cohort
    if lo > max_population:
        return None
    if mechanism.scheme.rate_is_fixed(mechanism):
        nm = generalization_statement(eps_at(mechanism.population), delta, mechanism.population, version)[
            "n_min"
        ]
        if nm is None or nm > max_population:
            return None
        return max(nm, lo)
    if not ok(max_population):
        return None
    hi = max_population
    if ok(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
