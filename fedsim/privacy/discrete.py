"""Renyi-DP accounting of the distributed discrete Gaussian and distributed Skellam mechanisms.

dp-accounting has no event for either mechanism, so their rounds are accounted here, in Renyi DP at integer orders
(:data:`RDP_ORDERS`), and the ledger's ``rdp`` accountant (:func:`fedsim.privacy.certified.rdp_epsilon`) sums the
rounds' curves (each release's ``rdp(orders)`` at its ``rdp_orders``) with the RDP of any other release's
dp-accounting event at the same orders, and converts the sum to (epsilon, delta) with dp-accounting's conversion
(:func:`epsilon_from_rdp`). The ``pld`` accountant cannot account them (their events are ``UnsupportedDpEvent``).

The functions port the accounting of the papers' own code, google-research/federated
``distributed_dp/accounting_utils.py`` at commit ``5e27a86323a35c2018fb97fbbe755c7ade9370ab`` (Apache-2.0):

* :func:`subsampled_rdp`: Poisson subsampling by Zhu and Wang (ICML 2019) Theorem 5, the general upper bound
  (``_compute_rdp_subsampled(upper_bound=True)``); callers take its minimum with the unamplified RDP, as the
  research code does. It holds for any mechanism but needs integer orders, hence :data:`RDP_ORDERS`.
* :func:`ddgauss_tau`, :func:`ddgauss_rdp`, :func:`ddgauss_epsilon`: the distributed discrete Gaussian (Kairouz,
  Liu and Steinke, ICML 2021, arXiv 2102.06387: Theorem 1 for tau, Proposition 14 for the RDP).
* :func:`skellam_rdp`, :func:`skellam_epsilon`: distributed Skellam (Agarwal, Kairouz and Liu, NeurIPS 2021, arXiv
  2110.04995), the research code's ``_skellam_rdp`` and ``skellam_epsilon``.

The sensitivity after randomized rounding is :func:`fedsim.round.discrete.inflated_l2_bound` and
:func:`~fedsim.round.discrete.rounded_l1_bound` (the research code's ``rounded_l2_norm_bound`` and
``rounded_l1_norm_bound``). The tests reproduce the research code's epsilons to a relative 1e-9
(``tests/privacy/test_discrete_accounting.py``).

What the ledger records for a round of either mechanism is :class:`DDGaussRound` or :class:`SkellamRound`; both
are registered release kinds (``"ddgauss-round"``, ``"skellam-round"``) so that a saved ledger loads them back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np
from scipy import special

from fedsim.round.discrete import MAX_BITS, inflated_l2_bound, rounded_l1_bound

from .ledger import register_release_kind

__all__ = [
    "RDP_ORDERS",
    "DDGaussRound",
    "SkellamRound",
    "ddgauss_epsilon",
    "ddgauss_rdp",
    "ddgauss_tau",
    "epsilon_from_rdp",
    "skellam_epsilon",
    "skellam_rdp",
    "subsampled_rdp",
]

#: the research code's orders: integers (Zhu and Wang's bound is stated for integer orders) 2..128, and 256
RDP_ORDERS: tuple[int, ...] = (*range(2, 129), 256)

#: the number of terms of tau summed at once (bounds the memory of :func:`ddgauss_tau` for millions of clients)
_TAU_CHUNK = 1 << 20


def _integer_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """``orders`` as an int64 array, refusing orders that are not integers >= 2. (The research code truncates a
    fractional order with ``int()`` and then converts at the untruncated one; refusing is the honest reading.)"""
    arr = np.asarray(orders, dtype=float).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)) or np.any(arr < 2):
        raise ValueError(
            f"RDP orders must be integers >= 2 (Zhu and Wang's subsampling bound), got {orders!r}"
        )
    return arr.astype(np.int64)


def _check_q(q: float) -> float:
    if not 0.0 < q <= 1.0:
        raise ValueError(f"the sampling rate q must be in (0, 1], got {q}")
    return float(q)


# ---------------------------------------------------------------------------------------------- shared
def subsampled_rdp(order: int, q: float, eps_fn: Callable[[np.ndarray], np.ndarray]) -> float:
    """RDP at integer ``order`` of a mechanism with RDP curve ``eps_fn`` applied to a Poisson sample at rate ``q``.

    Zhu and Wang, *Poisson subsampling of Renyi differential privacy*, ICML 2019, Theorem 5 (the general upper
    bound; the research code's ``_compute_rdp_subsampled(alpha, gamma, eps, upper_bound=True)``)::

        eps'(a) <= 1/(a-1) log( (1-q)^(a-1) (a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^{eps(2)}
                                + 3 sum_{l=3}^{a} C(a,l) (1-q)^(a-l) q^l e^{(l-1) eps(l)} )

    ``eps_fn`` maps an int array of orders ``2..order`` to their RDP (vectorised: one call). The bound can exceed
    the unamplified ``eps(order)`` (the factor 3), so callers take the minimum with it, as the research code does.
    At ``q = 1`` there is nothing to amplify and ``eps(order)`` is returned (the research code never calls it there:
    its formula is undefined at ``q = 1``). ``log(1 - q)`` is computed as ``log1p(-q)``."""
    alpha = int(_integer_orders([order])[0])
    q = _check_q(q)
    if q == 1.0:
        return float(np.asarray(eps_fn(np.array([alpha])), dtype=float)[0])
    ls = np.arange(2, alpha + 1)
    eps = np.asarray(eps_fn(ls), dtype=float)
    log_q, log_1mq = math.log(q), math.log1p(-q)
    a = np.empty(alpha, dtype=float)
    b = np.empty(alpha, dtype=float)
    a[0], b[0] = 0.0, (1.0 - q) ** (alpha - 1) * (alpha * q - q + 1.0)
    a[1], b[1] = eps[0], special.comb(alpha, 2) * q**2 * (1.0 - q) ** (alpha - 2)
    higher = ls[1:].astype(float)  # l = 3..alpha
    log_comb = special.gammaln(alpha + 1) - special.gammaln(higher + 1) - special.gammaln(alpha - higher + 1)
    a[2:] = (higher - 1.0) * eps[1:] + log_comb + (alpha - higher) * log_1mq + higher * log_q
    b[2:] = 3.0
    return float(special.logsumexp(a, b=b) / (alpha - 1))


def _amplified(orders: Sequence[float], q: float, eps_fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The per-step RDP at ``orders`` of ``eps_fn`` under Poisson sampling at ``q``: ``min(subsampled_rdp(a),
    eps(a))`` for ``q < 1`` and ``eps(a)`` at ``q = 1`` (the research code's ``compute_rdp_dgaussian`` and
    ``skellam_epsilon``). ``eps_fn`` is evaluated once, on every order up to the largest."""
    ords = _integer_orders(orders)
    q = _check_q(q)
    table = np.asarray(eps_fn(np.arange(2, int(ords.max()) + 1)), dtype=float)
    unamplified = table[ords - 2]
    if q == 1.0:
        return unamplified.copy()

    def lookup(ls: np.ndarray) -> np.ndarray:
        return table[np.asarray(ls) - 2]

    amplified = np.array([subsampled_rdp(int(a), q, lookup) for a in ords])
    return np.minimum(amplified, unamplified)


def epsilon_from_rdp(
    orders: Sequence[float], rdp: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, int]:
    """``(epsilon, order)`` at ``delta`` from an RDP curve: dp-accounting's
    ``rdp_privacy_accountant.compute_epsilon``, the conversion of Canonne, Kamath and Steinke (arXiv 2004.00010,
    Proposition 12) and Asoodeh et al. (arXiv 2001.05990): ``eps = rdp + log1p(-1/a) - log(delta a) / (a - 1)``,
    minimised over the orders (with the KL bound ``delta >= sqrt(1 - e^{-rdp})`` giving 0). It is what
    ``tensorflow_privacy``'s ``get_privacy_spent`` computes in its recent versions (its ``_compute_eps``; that code
    moved to dp-accounting), the conversion the research code calls, and the tightest dp-accounting offers for RDP.
    """
    from dp_accounting.rdp import rdp_privacy_accountant  # loaded on first accounting, as certified.py

    ords = np.asarray(orders, dtype=float).reshape(-1)
    values = np.asarray(rdp, dtype=float).reshape(-1)
    if ords.shape != values.shape:
        raise ValueError(f"{ords.size} orders but {values.size} RDP values")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    eps, order = rdp_privacy_accountant.compute_epsilon(ords, values, float(delta))
    return float(eps), int(order)


# ---------------------------------------------------------------------------------------------- DDGauss
def ddgauss_tau(sigma_grid: float, n: float) -> float:
    """Theorem 1 of Kairouz et al.: the sum of ``n`` independent discrete Gaussians of scale ``sigma_grid`` (grid
    units) is close to one discrete Gaussian of variance ``n sigma^2`` up to

        tau = 10 * sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))

    (the research code's loop in ``ddgauss_epsilon``). A non-integer ``n`` (an expected cohort capping the count of
    shares) sums ``ceil(n) - 1`` terms: tau grows with the count, so this is tau for the ``ceil(n)`` summands that were
    at least present. The terms decrease in ``k`` (from ``exp(-pi^2 sigma^2)`` to ``exp(-2 pi^2 sigma^2)``) and none is
    negligible against the others, so all are summed, with NumPy, in chunks (a million clients take milliseconds).
    Tau vanishes once ``sigma`` is a few grid steps (``sigma = 2`` gives about ``7e-17`` per client)."""
    if not sigma_grid >= 0:
        raise ValueError(f"the noise scale in grid units must be >= 0, got {sigma_grid}")
    if not n >= 0 or not math.isfinite(n):
        raise ValueError(f"the number of noise shares must be a finite number >= 0, got {n}")
    terms = max(math.ceil(n) - 1, 0)
    a = 2.0 * (math.pi * sigma_grid) ** 2
    if terms == 0 or math.exp(-0.5 * a) == 0.0:  # the largest term underflows: every term is 0.0
        return 0.0
    total = 0.0
    for start in range(1, terms + 1, _TAU_CHUNK):
        k = np.arange(start, min(start + _TAU_CHUNK, terms + 1), dtype=float)
        total += float(np.exp(-a * (k / (k + 1.0))).sum())
    return 10.0 * total


def _ddgauss_eps_fn(
    l2_scale: float, l1_scale: float, tau: float, dim: int
) -> Callable[[np.ndarray], np.ndarray]:
    """Proposition 14 of Kairouz et al. (Eq. 17), the research code's ``compute_rdp_dgaussian.eps``."""
    root_d = math.sqrt(dim)

    def eps(orders: np.ndarray) -> np.ndarray:
        half = np.asarray(orders, dtype=float) / 2.0
        term_1 = half * l2_scale**2 + tau * dim
        term_2 = half * (l2_scale**2 + 2 * l1_scale * tau + tau**2 * dim)
        term_3 = half * (l2_scale + root_d * tau) ** 2
        return np.minimum(np.minimum(term_1, term_2), term_3)

    return eps


def ddgauss_rdp(
    orders: Sequence[float], q: float, l2_scale: float, l1_scale: float, tau: float, dim: int
) -> np.ndarray:
    """Per-step RDP at ``orders`` of the distributed discrete Gaussian on a Poisson sample at rate ``q``
    (the research code's ``compute_rdp_dgaussian`` for one step): Proposition 14 of Kairouz et al.,

        eps(a) = min( a/2 l2^2 + tau d,  a/2 (l2^2 + 2 l1 tau + tau^2 d),  a/2 (l2 + sqrt(d) tau)^2 )

    with ``l2 = Delta_2 / sigma_central`` and ``l1 = Delta_1 / sigma_central`` (sensitivities over the summed noise's
    std, ``sigma_central = sqrt(n) sigma``), amplified by :func:`subsampled_rdp` and capped by ``eps(a)``."""
    for name, value in (("l2_scale", l2_scale), ("l1_scale", l1_scale), ("tau", tau)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return _amplified(orders, q, _ddgauss_eps_fn(float(l2_scale), float(l1_scale), float(tau), int(dim)))


def _rounded_sensitivities(
    l2_sens: float, l1_sens: float | None, scale: float, beta: float, dim: int, rounding: bool
) -> tuple[float, float]:
    """The research code's sensitivities in original units: L1 defaults to ``sqrt(d) L2``; with ``rounding`` both
    are the bounds after randomized rounding at ``scale`` (:func:`~fedsim.round.discrete.inflated_l2_bound`, then
    :func:`~fedsim.round.discrete.rounded_l1_bound` of the inflated L2), mapped back to original units."""
    if l1_sens is None:
        l1_sens = l2_sens * math.sqrt(dim)
    if rounding:
        l2_sens = inflated_l2_bound(l2_sens * scale, beta, dim) / scale
        l1_sens = rounded_l1_bound(l2_sens * scale, dim) / scale
    return float(l2_sens), float(l1_sens)


def ddgauss_epsilon(
    gamma: float,
    local_stddev: float,
    num_clients: int,
    l2_sens: float,
    beta: float,
    dim: int,
    q: float,
    steps: int,
    delta: float,
    l1_sens: float | None = None,
    rounding: bool = True,
    orders: Sequence[float] = RDP_ORDERS,
) -> tuple[float, int]:
    """``(epsilon, order)`` of ``steps`` rounds of the distributed discrete Gaussian (the research code's
    ``ddgauss_epsilon``, same arguments and meaning): grid step ``gamma``; ``local_stddev``, each of the
    ``num_clients`` clients' noise std in ORIGINAL units (``local_stddev / gamma`` grid steps); ``l2_sens`` (and
    ``l1_sens``, default ``sqrt(d) l2_sens``) the sensitivity in original units before rounding, inflated by
    rounding unless ``rounding=False``; ``dim`` the padded dimension; Poisson rate ``q``; ``delta``. (The research
    code divides by ``gamma + 1e-22``; here ``gamma`` must be > 0.)"""
    if not gamma > 0:
        raise ValueError(f"the grid step gamma must be > 0, got {gamma}")
    if not local_stddev > 0:
        raise ValueError(f"the local noise std must be > 0, got {local_stddev}")
    scale = 1.0 / gamma
    l2, l1 = _rounded_sensitivities(l2_sens, l1_sens, scale, beta, dim, rounding)
    tau = ddgauss_tau(local_stddev * scale, num_clients)
    central = math.sqrt(num_clients) * local_stddev
    rdp = ddgauss_rdp(orders, q, l2 / central, l1 / central, tau, dim) * steps
    return epsilon_from_rdp(orders, rdp, delta)


# ---------------------------------------------------------------------------------------------- Skellam
def _skellam_eps_fn(l1_sens: float, l2_sens: float, central_var: float, scale: float):
    """The research code's ``_skellam_rdp`` (Agarwal, Kairouz and Liu 2021), in original units::

        a / (2 mu) l2^2 + min( ((2a - 1) s l2^2 + 6 l1) / (4 s^3 mu^2),  3 l1 / (2 s mu) )

    ``mu`` the summed noise's variance and ``s`` the scale ``1 / gamma``. In grid units (``s l2``, ``s l1``,
    ``s^2 mu``) it is the same expression with ``s = 1``."""
    a_coef = l2_sens**2 / (2.0 * central_var)
    s, mu = scale, central_var

    def eps(orders: np.ndarray) -> np.ndarray:
        a = np.asarray(orders, dtype=float)
        second = np.minimum(
            ((2 * a - 1) * s * l2_sens**2 + 6 * l1_sens) / (4 * s**3 * mu**2), 3 * l1_sens / (2 * s * mu)
        )
        return a * a_coef + second

    return eps


def skellam_rdp(
    orders: Sequence[float], q: float, l2_sens: float, l1_sens: float, central_var: float, scale: float
) -> np.ndarray:
    """Per-step RDP at ``orders`` of distributed Skellam noise of summed variance ``central_var`` (original units)
    on a Poisson sample at rate ``q``, sensitivities ``l2_sens``, ``l1_sens`` (original units, after rounding) and
    scale ``1 / gamma``: the research code's ``_skellam_rdp`` amplified by :func:`subsampled_rdp` and capped by the
    unamplified RDP, as its ``skellam_epsilon`` does.

    The reference summary (``distributed-dp-secagg.md``) writes ``alpha Delta_2^2 / (2 mu) + min(...)`` with the
    same terms; it agrees with the code (``l2`` squared in the first term, ``6 Delta_1`` and ``4 s^3 mu^2`` in the
    second), the code being the authority. Its ``Delta_1 = ceil(...)`` has no ceiling in the code."""
    if not central_var > 0 or not scale > 0:
        raise ValueError(f"the summed variance and the scale must be > 0, got {central_var} and {scale}")
    return _amplified(
        orders, q, _skellam_eps_fn(float(l1_sens), float(l2_sens), float(central_var), float(scale))
    )


def skellam_epsilon(
    scale: float,
    central_stddev: float,
    l2_sens: float,
    beta: float,
    dim: int,
    q: float,
    steps: int,
    delta: float,
    l1_sens: float | None = None,
    rounding: bool = True,
    orders: Sequence[float] = RDP_ORDERS,
) -> tuple[float, int]:
    """``(epsilon, order)`` of ``steps`` rounds of distributed Skellam (the research code's ``skellam_epsilon``, same
    arguments and meaning): ``scale`` is ``1 / gamma``; ``central_stddev`` the summed noise's std in ORIGINAL units
    (``sqrt(n)`` times the local std); sensitivities in original units before rounding."""
    if not central_stddev > 0:
        raise ValueError(f"the summed noise std must be > 0, got {central_stddev}")
    l2, l1 = _rounded_sensitivities(l2_sens, l1_sens, scale, beta, dim, rounding)
    rdp = skellam_rdp(orders, q, l2, l1, central_stddev**2, scale) * steps
    return epsilon_from_rdp(orders, rdp, delta)


# ---------------------------------------------------------------------------------------------- release kinds
@dataclass(frozen=True)
class _DiscreteRound:
    """One round of a distributed discrete mechanism as the ledger records it, everything in grid units.

    ``q``: Poisson sampling rate; ``clip``: L2 clip in the update's units; ``gamma``: grid step; ``local_std_grid``:
    each client's noise std in grid units (``sigma`` of a discrete Gaussian, ``sqrt(mu)`` of a Skellam);
    ``shares``: noise shares in the secure sum (a float: an expected cohort may cap the realised count); ``dim``:
    the padded dimension; ``beta``: conditional rounding (0: none); ``bits``: the modulus ``2^bits`` (recorded; the
    accounting assumes no wrap-around, which the scale heuristic keeps improbable).

    A non-integer ``shares`` is taken as is for the summed variance and rounded up for tau: that bounds the
    ``ceil(shares)`` summands at least present with less variance than they hold, an upper bound (any further
    shares are independent noise added after, post-processing)."""

    kind: ClassVar[str] = ""
    #: the orders the ``rdp`` accountant composes this release's :meth:`rdp` at
    #: (:func:`fedsim.privacy.certified.has_rdp_curve`)
    rdp_orders: ClassVar[tuple[int, ...]] = RDP_ORDERS

    round: int
    q: float
    clip: float
    gamma: float
    local_std_grid: float
    shares: float
    dim: int
    beta: float
    bits: int

    def __post_init__(self) -> None:
        for name, kind in (("round", int), ("dim", int), ("bits", int)):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value:
                raise ValueError(f"{type(self).__name__}.{name} must be an integer, got {value!r}")
            object.__setattr__(self, name, kind(value))
        for name in ("q", "clip", "gamma", "local_std_grid", "shares", "beta"):
            object.__setattr__(self, name, float(getattr(self, name)))
        checks = (
            ("round", self.round >= 1, ">= 1"),
            ("q", 0.0 < self.q <= 1.0, "in (0, 1]"),
            ("clip", self.clip > 0, "> 0 (math.inf: unclipped)"),
            ("gamma", 0.0 < self.gamma < math.inf, "finite and > 0"),
            ("local_std_grid", 0.0 <= self.local_std_grid < math.inf, "finite and >= 0"),
            ("shares", 0.0 <= self.shares < math.inf, "finite and >= 0"),
            ("dim", self.dim >= 1, ">= 1"),
            ("beta", 0.0 <= self.beta < 1.0, "in [0, 1)"),
            ("bits", 1 <= self.bits <= MAX_BITS, f"in [1, {MAX_BITS}]"),
        )
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"{type(self).__name__}.{name} must be {what}, got {getattr(self, name)!r}")

    @property
    def private(self) -> bool:
        return self.local_std_grid > 0 and self.shares > 0 and math.isfinite(self.clip)

    @property
    def neighbouring(self) -> str:
        return "add-remove"

    @property
    def l2_sensitivity(self) -> float:
        """The L2 sensitivity in grid units after randomized rounding (conditional when ``beta > 0``)."""
        return inflated_l2_bound(self.clip / self.gamma, self.beta, self.dim)

    @property
    def l1_sensitivity(self) -> float:
        """The L1 sensitivity in grid units of the rounded integer vector."""
        return rounded_l1_bound(self.l2_sensitivity, self.dim)

    @property
    def central_std_grid(self) -> float:
        """The summed noise's std in grid units, ``sqrt(shares) * local_std_grid``."""
        return math.sqrt(self.shares) * self.local_std_grid

    def to_dp_event(self, relation: str | None = None) -> Any:
        """dp-accounting has no event for this mechanism: the ``rdp`` accountant composes :meth:`rdp` instead."""
        from dp_accounting import dp_event

        return dp_event.UnsupportedDpEvent()

    def rdp(self, orders: Sequence[float] = RDP_ORDERS) -> np.ndarray:
        """This round's RDP at ``orders`` (integers >= 2): Poisson-subsampled at ``q`` (the minimum of Zhu and
        Wang's bound and the unamplified RDP); infinite when not :attr:`private`. Cached by the round's parameters
        (every round of a run usually has the same), so composing a long ledger costs a sum."""
        if not self.private:
            return np.full(len(_integer_orders(orders)), math.inf)
        params = tuple(getattr(self, f.name) for f in fields(self) if f.name not in ("round", "bits"))
        return _round_rdp(type(self), params, tuple(int(a) for a in _integer_orders(orders))).copy()

    def epsilon(self, delta: float) -> float:
        """Epsilon at ``delta`` of this round alone."""
        return epsilon_from_rdp(RDP_ORDERS, self.rdp(RDP_ORDERS), delta)[0]

    def _per_step_rdp(self, orders: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> _DiscreteRound:
        return cls(**d)


@functools.lru_cache(maxsize=4096)
def _round_rdp(cls: type, params: tuple, orders: tuple[int, ...]) -> np.ndarray:
    """A round's RDP curve by its class and parameters (without its round number), computed once."""
    (q, clip, gamma, local_std_grid, shares, dim, beta) = params
    out = cls(1, q, clip, gamma, local_std_grid, shares, dim, beta, 1)._per_step_rdp(orders)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class DDGaussRound(_DiscreteRound):
    """One round of the distributed discrete Gaussian (Kairouz, Liu and Steinke 2021): ``shares`` clients each add
    discrete Gaussian noise of scale ``local_std_grid`` grid steps. RDP: Proposition 14 with :attr:`tau`
    (Theorem 1), :func:`ddgauss_rdp`."""

    kind: ClassVar[str] = "ddgauss-round"

    @property
    def tau(self) -> float:
        """Theorem 1's distance of the sum of shares from one discrete Gaussian (:func:`ddgauss_tau`)."""
        return ddgauss_tau(self.local_std_grid, self.shares)

    def _per_step_rdp(self, orders: tuple[int, ...]) -> np.ndarray:
        central = self.central_std_grid
        return ddgauss_rdp(
            orders, self.q, self.l2_sensitivity / central, self.l1_sensitivity / central, self.tau, self.dim
        )


@dataclass(frozen=True)
class SkellamRound(_DiscreteRound):
    """One round of distributed Skellam (Agarwal, Kairouz and Liu 2021): ``shares`` clients each add Skellam noise
    of variance ``local_std_grid^2`` grid steps squared; their sum is exactly Skellam of variance ``shares`` times
    that (no tau). RDP: :func:`skellam_rdp` in grid units (scale 1)."""

    kind: ClassVar[str] = "skellam-round"

    def _per_step_rdp(self, orders: tuple[int, ...]) -> np.ndarray:
        return skellam_rdp(
            orders, self.q, self.l2_sensitivity, self.l1_sensitivity, self.central_std_grid**2, scale=1.0
        )


register_release_kind(DDGaussRound)
register_release_kind(SkellamRound)
