"""Certified accountants (``pld``, ``rdp``), built on Google's dp-accounting.

* **Poisson sampling, add/remove**: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``; the PLD is
  dp-accounting's subsampled-Gaussian PLD, the RDP its Poisson subsampled-Gaussian RDP.
* **Fixed-size sampling without replacement, replace-one**: RDP through dp-accounting's
  ``SampledWithoutReplacementDpEvent`` with ``RdpAccountant(REPLACE_ONE)`` (Wang, Balle,
  Kasiviswanathan 2019, Thm 27). dp-accounting's ``PLDAccountant`` has no event for it, so the PLD is
  built with ``privacy_loss_distribution.from_gaussian_mechanism`` from the dominating pair of
  sampling without replacement under replace-one, ``((1-g) N(0,s^2) + g N(D,s^2), N(0,s^2))`` with
  ``g = tau/N`` and ``D`` the replace-one sensitivity (Zhu, Dong, Wang 2022; its privacy profile is
  Balle et al. 2018 Thm 10). Both orderings are included (dp-accounting takes the worse of its ADD
  and REMOVE PLDs), so this is an upper bound. With ``tau = N`` both are the exact Gaussian mechanism
  with sensitivity ``D = 2*clip`` (tested against the closed form).
* **Everyone, every round**: ``GaussianDpEvent(z)``.
* A ledger that mixes add/remove rounds (Poisson, all) with replace-one rounds (fixed) is accounted
  under replace-one for every round (a Poisson round then uses dp-accounting's replace-one subsampled
  Gaussian PLD with the contribution bound ``clip``). RDP cannot do that mix and says so.

PLD curves over many rounds are computed exactly at checkpoint rounds and every round in between
reports the value at the next checkpoint (epsilon is non-decreasing in rounds, so this is an upper
bound, tight at the checkpoints, which are every round up to 50 and then 3% apart); the default PLD
discretisation is 1e-3 (pessimistic rounding: an upper bound that is slightly above dp-accounting's
default 1e-4 grid, which is 10-20x slower). Both are parameters.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .errors import PrivacyInputError
from .mechanism import Mechanism

__all__ = [
    "DEFAULT_PLD_DISCRETIZATION",
    "round_pld",
    "round_rdp",
    "rdp_orders",
    "rdp_epsilon",
    "pld_checkpoints",
    "pld_curve",
    "rdp_curve",
    "ledger_relation",
]

DEFAULT_PLD_DISCRETIZATION = 1e-3


def rdp_orders() -> np.ndarray:
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    return np.asarray(rdp.DEFAULT_RDP_ORDERS, dtype=float)


def ledger_relation(mechanisms) -> str:
    """The relation a set of rounds is accounted under: replace-one as soon as one round needs it."""
    return "replace-one" if any(m.neighbouring == "replace-one" for m in mechanisms) else "add-remove"


def _pld_params(m: Mechanism, relation: str) -> tuple:
    """(standard_deviation, sampling_prob, dp-accounting relation name) for ``m`` with sensitivity 1."""
    if relation == "add-remove":
        if m.neighbouring != "add-remove":
            raise PrivacyInputError("relation", relation, "a fixed-size (replace-one) round needs replace-one")
        return (m.noise_std / m.clip, m.q, "ADD_OR_REMOVE_ONE")
    if m.sampling == "fixed":
        return (m.noise_std / m.replace_sensitivity, m.q, "ADD_OR_REMOVE_ONE")
    if m.sampling == "all":
        return (m.noise_std / m.replace_sensitivity, 1.0, "ADD_OR_REMOVE_ONE")
    # Poisson round under replace-one: dp-accounting's REPLACE pair shifts by +-clip.
    return (m.noise_std / m.clip, m.q, "REPLACE_ONE")


@functools.lru_cache(maxsize=256)
def _pld_cached(std: float, q: float, relation: str, discretization: float):
    from dp_accounting import privacy_accountant
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    rel = getattr(privacy_accountant.NeighboringRelation, relation)
    return pldlib.from_gaussian_mechanism(
        standard_deviation=std,
        sensitivity=1.0,
        sampling_prob=q,
        value_discretization_interval=discretization,
        neighboring_relation=rel,
    )


def round_pld(m: Mechanism, relation: str | None = None, discretization: float = DEFAULT_PLD_DISCRETIZATION):
    """dp-accounting PrivacyLossDistribution of ONE round of ``m`` (cached)."""
    relation = relation or m.neighbouring
    std, q, rel = _pld_params(m, relation)
    return _pld_cached(float(std), float(q), rel, float(discretization))


#: the most points a composed PLD may hold before the ledger answers with RDP instead (about 40 MB a float64
#: array; an FFT composition needs several such arrays). Noise multipliers around 0.03 reach it in ~10 rounds.
MAX_PLD_POINTS = 5_000_000


def estimated_pld_points(m: Mechanism, relation: str | None = None,
                         discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """About how many grid points one round's PLD of ``m`` holds: the Gaussian's privacy losses span about
    ``(1 + 20 std) / std^2`` (dp-accounting keeps ~10 standard deviations of tail), divided by the grid step.
    Cheap: used to refuse a PLD before building it."""
    std, _q, _rel = _pld_params(m, relation or m.neighbouring)
    return (1.0 + 20.0 * std) / (std * std) / discretization


def round_fast_pld(m: Mechanism, relation: str | None = None, discretization: float = DEFAULT_PLD_DISCRETIZATION):
    """:func:`round_pld` as a :class:`fedsim.privacy.fast_pld.FastPld` (cached): for per-round composition."""
    relation = relation or m.neighbouring
    std, q, rel = _pld_params(m, relation)
    return _fast_pld_cached(float(std), float(q), rel, float(discretization))


@functools.lru_cache(maxsize=256)
def _fast_pld_cached(std: float, q: float, relation: str, discretization: float):
    from .fast_pld import FastPld

    return FastPld.from_dp_accounting(_pld_cached(std, q, relation, discretization))


@functools.lru_cache(maxsize=256)
def _rdp_cached(kind: str, std: float, q: float, population: int, tau: int) -> np.ndarray:
    from dp_accounting import dp_event, privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    import logging

    g = dp_event.GaussianDpEvent(std)
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # dp-accounting warns when it drops an order that did not converge
    try:
        return _rdp_compute(kind, g, q, population, tau, dp_event, privacy_accountant, rdp)
    finally:
        absl_logger.setLevel(level)


def _rdp_compute(kind, g, q, population, tau, dp_event, privacy_accountant, rdp) -> np.ndarray:
    if kind == "poisson":
        acc = rdp.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acc.compose(dp_event.PoissonSampledDpEvent(q, g))
    elif kind == "fixed":
        acc = rdp.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_event.SampledWithoutReplacementDpEvent(population, tau, g))
    else:
        acc = rdp.RdpAccountant()
        acc.compose(g)
    out = np.array(acc._rdp, dtype=float)  # the accountant's RDP vector over DEFAULT_RDP_ORDERS
    out.setflags(write=False)
    return out


def round_rdp(m: Mechanism, relation: str | None = None) -> np.ndarray:
    """RDP of ONE round of ``m`` at :func:`rdp_orders` (dp-accounting, cached)."""
    relation = relation or m.neighbouring
    if relation != m.neighbouring and m.sampling == "poisson":
        raise PrivacyInputError(
            "method",
            "rdp",
            "dp-accounting's RDP cannot account a Poisson round under replace-one (a ledger mixing fixed-size "
            "and Poisson rounds); use method='pld'",
        )
    if m.sampling == "all" and relation == "replace-one":
        return _rdp_cached("all", m.noise_std / m.replace_sensitivity, 1.0, m.population, m.population)
    if m.sampling == "fixed":
        return _rdp_cached("fixed", m.normalized_noise, m.q, m.population, int(m.tau))
    if m.sampling == "all":
        return _rdp_cached("all", m.normalized_noise, 1.0, m.population, m.population)
    return _rdp_cached("poisson", m.normalized_noise, m.q, m.population, 0)


def rdp_epsilon(rdp_values: np.ndarray, delta: float) -> np.ndarray:
    """dp-accounting's ``compute_epsilon`` vectorised over rows of ``rdp_values`` (shape (..., orders)).

    Same bound (Proposition 12 of arXiv:2004.00010 with the KL shortcut), same orders, same branches.
    """
    orders = rdp_orders()
    r = np.asarray(rdp_values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        eps = r + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
        eps = np.where(orders > 1.01, eps, np.inf)
        eps = np.where(delta ** 2 + np.expm1(-r) > 0, 0.0, eps)
        eps = np.where(r < 0, 0.0, eps)
        eps = np.where(np.isnan(r), np.inf, eps)
    return np.maximum(0.0, eps.min(axis=-1))


def rdp_curve(m: Mechanism, rounds: int, delta: float) -> np.ndarray:
    """Epsilon after every round t = 1..rounds (exact RDP conversion at every round)."""
    per = round_rdp(m)
    t = np.arange(1, rounds + 1, dtype=float)[:, None]
    return rdp_epsilon(t * per[None, :], delta)


def pld_checkpoints(rounds: int, dense: int = 50, ratio: float = 1.03) -> np.ndarray:
    """Rounds at which the PLD curve is exact: every round up to ``dense``, then geometric, and the last."""
    pts = list(range(1, min(rounds, dense) + 1))
    t = pts[-1] if pts else 0
    while t < rounds:
        t = min(rounds, max(t + 1, int(math.ceil(t * ratio))))
        pts.append(t)
    return np.asarray(pts, dtype=int)


def pld_curve(
    m: Mechanism,
    rounds: int,
    delta: float,
    discretization: float = DEFAULT_PLD_DISCRETIZATION,
    checkpoint_ratio: float = 1.03,
    dense: int = 50,
    exact_every_round: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Epsilon after every round and a boolean mask of the rounds computed exactly.

    Rounds ``1..dense`` are exact (incremental composition, one convolution per round); after that
    the PLD is computed exactly at checkpoints ``t_{k+1} = ceil(t_k * checkpoint_ratio)`` (one
    ``self_compose`` each) and the rounds in between report the next checkpoint's epsilon: an upper
    bound, since epsilon is non-decreasing in rounds, at most one checkpoint step loose.
    """
    single = round_pld(m, discretization=discretization)
    if exact_every_round:
        dense = rounds
    cps = pld_checkpoints(rounds, dense, checkpoint_ratio)
    eps_cp = np.empty(len(cps))
    acc = None
    for i, t in enumerate(cps):
        if t <= dense:
            acc = single if acc is None else acc.compose(single)
            pld_t = acc
        else:
            pld_t = single.self_compose(int(t))
        eps_cp[i] = pld_t.get_epsilon_for_delta(delta)
    # a later checkpoint can only be larger; guard float noise by a running maximum (upper bound)
    eps_cp = np.maximum.accumulate(eps_cp)
    idx = np.searchsorted(cps, np.arange(1, rounds + 1), side="left")
    curve = eps_cp[idx]
    exact = np.zeros(rounds, dtype=bool)
    exact[cps - 1] = True
    return curve, exact
