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
import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import PrivacyInputError
from .mechanism import Mechanism

__all__ = [
    "DEFAULT_PLD_DISCRETIZATION",
    "ledger_relation",
    "pld_checkpoints",
    "pld_curve",
    "rdp_curve",
    "rdp_epsilon",
    "round_pld",
]

DEFAULT_PLD_DISCRETIZATION = 1e-3


def ledger_relation(mechanisms) -> str:
    """The relation a set of rounds is accounted under: replace-one as soon as one round needs it."""
    return "replace-one" if any(m.neighbouring == "replace-one" for m in mechanisms) else "add-remove"


def _pld_params(m: Mechanism, relation: str) -> tuple:
    """(standard_deviation, sampling_prob, dp-accounting relation name) for ``m`` with sensitivity 1."""
    if relation == "add-remove":
        if m.neighbouring != "add-remove":
            raise PrivacyInputError(
                "relation", relation, "a fixed-size (replace-one) round needs replace-one"
            )
        return (m.noise_std / m.clip, m.q, "ADD_OR_REMOVE_ONE")
    if m.sampling == "fixed":
        return (m.noise_std / m.replace_sensitivity, m.q, "ADD_OR_REMOVE_ONE")
    if m.sampling == "all":
        return (m.noise_std / m.replace_sensitivity, 1.0, "ADD_OR_REMOVE_ONE")
    # Poisson round under replace-one: dp-accounting's REPLACE pair shifts by +-clip.
    return (m.noise_std / m.clip, m.q, "REPLACE_ONE")


@functools.lru_cache(maxsize=256)
def _pld_cached(std: float, q: float, relation: str, discretization: float):
    # dp-accounting is loaded on first accounting, not when fedsim is imported (Ray workers, ClientApps)
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


class PldTooLarge(Exception):
    """A PLD composition would need more memory than is reasonable (:data:`MAX_PLD_POINTS`)."""


#: the most points a composed PLD may hold before the ledger answers with RDP instead (about 40 MB a float64
#: array; an FFT composition needs several such arrays). Noise multipliers around 0.03 reach it in ~10 rounds.
MAX_PLD_POINTS = 5_000_000


def check_pld_size(
    mechanisms: Iterable[Mechanism],
    relation: str,
    discretization: float,
    size: tuple[int, float, float] = (0, 0.0, 0.0),
    whole: bool = True,
) -> tuple[int, float, float]:
    """Raise :class:`PldTooLarge` when one round's PLD, or (``whole``: ``mechanisms`` end the composition) the
    composition so far plus ``mechanisms``, would not fit; else return the composition's new ``size``
    ``(releases, sum of r^2, largest one-round points)``, which a caller that composes incrementally passes back
    with the next releases only.

    One round: :func:`estimated_pld_points`. The composition: after truncating tails of mass 1e-15, the privacy
    loss of a composition spans about 16 standard deviations of the summed losses; a Gaussian round with
    sensitivity-to-noise ratio ``r`` has a loss of standard deviation ``r`` at most (sampling only narrows it),
    so ``16 * sqrt(sum r_i^2) / discretization`` points, an over-estimate that errs toward RDP, never toward
    exhausting memory."""
    count, spread2, worst = size
    for m in mechanisms:
        points = estimated_pld_points(m, relation, discretization)
        if points > MAX_PLD_POINTS:
            raise PldTooLarge(
                f"one round of noise multiplier {m.noise_multiplier:g} needs about {points:.3g} PLD points"
            )
        count, spread2, worst = (
            count + 1,
            spread2 + (1.0 / _pld_params(m, relation)[0]) ** 2,
            max(worst, points),
        )
    composed = 16.0 * math.sqrt(spread2) / discretization + worst
    if whole and composed > MAX_PLD_POINTS:
        raise PldTooLarge(f"composing {count} releases would need about {composed:.3g} PLD points")
    return count, spread2, worst


def estimated_pld_points(
    m: Mechanism, relation: str | None = None, discretization: float = DEFAULT_PLD_DISCRETIZATION
) -> float:
    """About how many grid points one round's PLD of ``m`` holds: the Gaussian's privacy losses span about
    ``(1 + 20 std) / std^2`` (dp-accounting keeps ~10 standard deviations of tail), divided by the grid step.
    Cheap: used to refuse a PLD before building it."""
    std, _q, _rel = _pld_params(m, relation or m.neighbouring)
    return (1.0 + 20.0 * std) / (std * std) / discretization


def _relation(relation: str):
    from dp_accounting import privacy_accountant  # dp-accounting's modules, loaded on first use

    return {
        "add-remove": privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace-one": privacy_accountant.NeighboringRelation.REPLACE_ONE,
    }[relation]


@functools.lru_cache(maxsize=4096)
def _rdp_accountant_epsilon(events: tuple[tuple[Any, int], ...], relation: str, delta: float) -> float:
    """dp-accounting's ``RdpAccountant`` composing each event ``count`` times, at ``delta`` (public API only)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp  # as above

    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # dp-accounting warns when it drops an order that did not converge
    try:
        acc = rdp.RdpAccountant(neighboring_relation=_relation(relation))
        for event, count in events:
            acc.compose(event, int(count))
        return float(acc.get_epsilon(delta))
    finally:
        absl_logger.setLevel(level)


def rdp_epsilon(rounds: Iterable[Iterable[Mechanism]], relation: str, delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds`` (each an iterable of mechanisms) by dp-accounting's RDP accountant under
    ``relation``: every mechanism's event from :meth:`Mechanism.to_dp_event`, identical events composed as one
    event with a count (RDP composition is additive, so this is exact)."""
    counts: dict[Any, int] = {}
    for events in rounds:
        for m in events:
            e = m.to_dp_event(relation)
            counts[e] = counts.get(e, 0) + 1
    return _rdp_accountant_epsilon(tuple(counts.items()), relation, float(delta))


def rdp_curve(
    m: Mechanism,
    rounds: int,
    delta: float,
    checkpoint_ratio: float = 1.1,
    dense: int = 10,
    extra: Iterable[int] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Epsilon after every round and a boolean mask of the rounds computed exactly. As :func:`pld_curve`: exact at
    checkpoints, the next checkpoint's epsilon in between (an upper bound); each checkpoint is one dp-accounting
    RDP accountant composing the round's event with a count."""
    event, relation = m.to_dp_event(), m.neighbouring
    cps = pld_checkpoints(rounds, dense, checkpoint_ratio, extra)
    eps_cp = np.maximum.accumulate(
        [_rdp_accountant_epsilon(((event, int(t)),), relation, float(delta)) for t in cps]
    )
    idx = np.searchsorted(cps, np.arange(1, rounds + 1), side="left")
    exact = np.zeros(rounds, dtype=bool)
    exact[cps - 1] = True
    return eps_cp[idx], exact


def pld_checkpoints(
    rounds: int, dense: int = 50, ratio: float = 1.03, extra: Iterable[int] = ()
) -> np.ndarray:
    """Rounds at which a curve is exact: every round up to ``dense``, then geometric, the last, and ``extra``."""
    pts = list(range(1, min(rounds, dense) + 1))
    t = pts[-1] if pts else 0
    while t < rounds:
        t = min(rounds, max(t + 1, int(math.ceil(t * ratio))))
        pts.append(t)
    pts += [int(e) for e in extra if 1 <= int(e) <= rounds]
    return np.unique(np.asarray(pts, dtype=int))


def pld_curve(
    m: Mechanism,
    rounds: int,
    delta: float,
    discretization: float = DEFAULT_PLD_DISCRETIZATION,
    checkpoint_ratio: float = 1.03,
    dense: int = 50,
    exact_every_round: bool = False,
    extra: Iterable[int] = (),
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
    cps = pld_checkpoints(rounds, dense, checkpoint_ratio, extra)
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
