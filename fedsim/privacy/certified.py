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
* **Any other DP release** (a whole-run event such as a matrix-factorization mechanism, a bound on each client's
  participations) is accounted through its own dp-accounting event: RDP by ``RdpAccountant.compose(event)``, PLD
  by ``PLDAccountant.compose(event)`` whose PLD is composed with the rounds' PLDs (:func:`event_pld`). An event an
  accountant does not support is a one-line :class:`PrivacyInputError` naming what it supports.
* The ``pld`` accountant's state for a ledger (its composition cache, its fallback to RDP when a PLD would not fit
  in memory) is :class:`PldLedgerAccountant`.

PLD curves over many rounds are computed exactly at checkpoint rounds and every round in between
reports the value at the next checkpoint (epsilon is non-decreasing in rounds, so this is an upper
bound, tight at the checkpoints, which are every round up to 50 and then 3% apart); the default PLD
discretisation is 1e-3 (pessimistic rounding: an upper bound that is slightly above dp-accounting's
default 1e-4 grid, which is 10-20x slower). Both are parameters.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import PrivacyInputError
from .mechanism import Mechanism

__all__ = [
    "DEFAULT_PLD_DISCRETIZATION",
    "PldLedgerAccountant",
    "PldTooLarge",
    "event_pld",
    "has_gaussian_pld",
    "ledger_relation",
    "pld_checkpoints",
    "pld_curve",
    "rdp_curve",
    "rdp_epsilon",
    "release_pld",
    "round_pld",
    "unsupported_event",
]

DEFAULT_PLD_DISCRETIZATION = 1e-3


def ledger_relation(releases) -> str:
    """The relation a set of releases (mechanisms or any other DP release with a ``neighbouring`` relation) is
    accounted under: replace-one as soon as one release needs it."""
    return "replace-one" if any(r.neighbouring == "replace-one" for r in releases) else "add-remove"


def has_gaussian_pld(release) -> bool:
    """Whether ``release`` describes itself as one (sampled) Gaussian of sensitivity 1 (``pld_parameters``, as a
    :class:`Mechanism` does): its PLD is then :func:`round_pld`, cached, and its size is checked before it is
    built. Any other release is accounted through its dp-accounting event (:func:`event_pld`)."""
    return callable(getattr(release, "pld_parameters", None))


#: what dp-accounting's accountants compose (dp_accounting 0.4-0.6), for the message that refuses an event
SUPPORTED_EVENTS = {
    "pld": "dp-accounting's PLDAccountant composes Gaussian, Laplace, discrete Laplace, randomized-response, "
    "mixture-of-Gaussians and Poisson-sampled Gaussian/Laplace events and their compositions",
    "rdp": "dp-accounting's RdpAccountant composes Gaussian, zCDP, Laplace, Poisson-sampled (add/remove) and "
    "sampled-without-replacement (replace-one) Gaussian, tree-aggregation, repeat-and-select events and their "
    "compositions",
}


def unsupported_event(method: str, event, relation: str, exc: Exception | None = None) -> PrivacyInputError:
    """The one-line :class:`PrivacyInputError` for an event dp-accounting's ``method`` accountant cannot compose
    (its ``UnsupportedEventError``, or not a ``DpEvent`` at all)."""
    why = ""
    if exc is not None:
        found = re.search(r"Error: \[(.*?)\] caused by subevent (\w+)", " ".join(str(exc).split()))
        why = f" ({found.group(2)}: {found.group(1)})" if found else ""
    alternative = {"pld": "rdp", "rdp": "pld"}.get(method)
    return PrivacyInputError(
        "method",
        method,
        f"cannot account {type(event).__name__} under {relation}{why}; {SUPPORTED_EVENTS.get(method, '')}"
        + (f"; try method={alternative!r}" if alternative else ""),
    )


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
    std, q, rel = m.pld_parameters(relation or m.neighbouring)
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
            spread2 + (1.0 / m.pld_parameters(relation)[0]) ** 2,
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
    std, _q, _rel = m.pld_parameters(relation or m.neighbouring)
    return gaussian_pld_points(std, 1, discretization)


def gaussian_pld_points(
    std: float, count: int = 1, discretization: float = DEFAULT_PLD_DISCRETIZATION
) -> float:
    """About how many grid points the PLD of ``count`` compositions of a Gaussian of sensitivity 1 and noise ``std``
    (Poisson-sampled or not: sampling only narrows it) holds: one's, :func:`estimated_pld_points`, plus the
    composition's spread, ``16 sqrt(count) / std`` (as :func:`check_pld_size`). Compare with
    :data:`MAX_PLD_POINTS` before building one."""
    one = (1.0 + 20.0 * std) / (std * std) / discretization
    return one if count <= 1 else one + 16.0 * math.sqrt(count) / std / discretization


def _relation(relation: str):
    from dp_accounting import privacy_accountant  # dp-accounting's modules, loaded on first use

    return {
        "add-remove": privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace-one": privacy_accountant.NeighboringRelation.REPLACE_ONE,
    }[relation]


def _rdp_compose(events: tuple[tuple[Any, int], ...], relation: str, delta: float) -> float:
    """dp-accounting's ``RdpAccountant`` composing each event ``count`` times, at ``delta`` (public API only); an
    event it does not support is a :class:`PrivacyInputError`."""
    with quiet_absl():
        return float(_rdp_accountant(events, relation).get_epsilon(delta))


def _rdp_accountant(
    events: tuple[tuple[Any, int], ...], relation: str, orders: tuple[int, ...] | None = None
) -> Any:
    """A dp-accounting ``RdpAccountant`` (at ``orders``, default its own) that composed each event ``count`` times;
    an event it does not support is a :class:`PrivacyInputError`."""
    from dp_accounting import dp_event, privacy_accountant  # loaded on first accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    at = {} if orders is None else {"orders": list(orders)}
    acc = rdp.RdpAccountant(neighboring_relation=_relation(relation), **at)
    for event, count in events:
        if not isinstance(event, dp_event.DpEvent):
            raise unsupported_event("rdp", event, relation)
        try:
            acc.compose(event, int(count))
        except privacy_accountant.UnsupportedEventError as exc:
            raise unsupported_event("rdp", event, relation, exc) from None
    return acc


@contextlib.contextmanager
def quiet_absl():
    """dp-accounting's RDP warns (through absl) each time it drops an order that did not converge, which it
    handles itself: silence that while it computes."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


@functools.lru_cache(maxsize=4096)
def _rdp_accountant_epsilon(events: tuple[tuple[Any, int], ...], relation: str, delta: float) -> float:
    """:func:`_rdp_compose`, cached (the events are hashable)."""
    return _rdp_compose(events, relation, delta)


def has_rdp_curve(release) -> bool:
    """Whether ``release`` states its own Renyi-DP curve: ``rdp(orders) -> array`` and the integer orders it is
    stated at, ``rdp_orders`` (the distributed discrete mechanisms of :mod:`fedsim.privacy.discrete`, for which
    dp-accounting has no event)."""
    return callable(getattr(release, "rdp", None)) and getattr(release, "rdp_orders", None) is not None


def _event_counts(releases: Any, relation: str) -> tuple[dict[Any, int], list[tuple[Any, int]]]:
    """The releases' dp-accounting events, counted (equal events compose as one event ``count`` times), and those
    that cannot be counted because they are unhashable (e.g. a ComposedDpEvent, which holds a list), once each."""
    counts: dict[Any, int] = {}
    unhashable: list[tuple[Any, int]] = []
    for r in releases:
        e = r.to_dp_event(relation)
        try:
            counts[e] = counts.get(e, 0) + 1
        except TypeError:
            unhashable.append((e, 1))
    return counts, unhashable


def rdp_epsilon(rounds: Iterable[Iterable[Any]], relation: str, delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds`` (each an iterable of releases: mechanisms or any release with
    ``to_dp_event(relation)``) by dp-accounting's RDP accountant under ``relation``: identical events composed as
    one event with a count (RDP composition is additive, so this is exact).

    A ledger holding a release with its own RDP curve (:func:`has_rdp_curve`) is composed at that release's orders
    instead (:func:`_rdp_curves_epsilon`)."""
    rounds = [tuple(events) for events in rounds]
    if any(has_rdp_curve(r) for events in rounds for r in events):
        return _rdp_curves_epsilon(rounds, relation, float(delta))
    counts, unhashable = _event_counts((r for events in rounds for r in events), relation)
    if unhashable:
        return _rdp_compose((*counts.items(), *unhashable), relation, float(delta))
    return _rdp_accountant_epsilon(tuple(counts.items()), relation, float(delta))


def _rdp_curves_epsilon(rounds: list[tuple[Any, ...]], relation: str, delta: float) -> float:
    """RDP composition of a ledger with releases that state their own curve, at the orders the first of them states
    (``rdp_orders``: :data:`fedsim.privacy.discrete.RDP_ORDERS`, integers, where the discrete mechanisms'
    subsampling bound holds): their ``rdp(orders)`` summed, plus the other releases' dp-accounting events composed
    by ``RdpAccountant(orders)`` (its public ``rdp``), converted by dp-accounting's ``compute_epsilon`` (as
    :func:`fedsim.privacy.discrete.epsilon_from_rdp`; this module does not import that one, which imports the
    ledger). A ledger of Gaussian Mechanisms alone keeps dp-accounting's default orders and its numbers.

    Those curves are add/remove RDP; a ledger that needs replace-one is refused (a :class:`PrivacyInputError`)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp  # loaded on first accounting

    curves = [r for events in rounds for r in events if has_rdp_curve(r)]
    if relation != "add-remove":
        kinds = ", ".join(sorted({type(r).__name__ for r in curves}))
        raise PrivacyInputError(
            "method",
            "rdp",
            f"cannot account {kinds} under {relation}: their RDP curves are add/remove, and another release of "
            "this ledger needs replace-one (fixed-size sampling); use Poisson sampling throughout",
        )
    orders = tuple(int(a) for a in curves[0].rdp_orders)
    total = np.zeros(len(orders))
    releases = [r for events in rounds for r in events]
    for r in releases:
        if has_rdp_curve(r):
            total += np.asarray(r.rdp(orders), dtype=float)
    counts, unhashable = _event_counts((r for r in releases if not has_rdp_curve(r)), relation)
    if unhashable:
        total += _rdp_at_orders((*counts.items(), *unhashable), relation, orders)
    elif counts:
        total += _rdp_at_orders_cached(tuple(counts.items()), relation, orders)
    with quiet_absl():
        return float(rdp.compute_epsilon(np.asarray(orders, dtype=float), total, delta)[0])


def _rdp_at_orders(events: tuple[tuple[Any, int], ...], relation: str, orders: tuple[int, ...]) -> np.ndarray:
    """The RDP curve at ``orders`` of dp-accounting's ``RdpAccountant(orders)`` composing each event ``count`` times
    (its public ``rdp`` property); an event it does not support is a :class:`PrivacyInputError`."""
    with quiet_absl():
        return np.asarray(_rdp_accountant(events, relation, orders).rdp, dtype=float)


@functools.lru_cache(maxsize=1024)
def _rdp_at_orders_cached(
    events: tuple[tuple[Any, int], ...], relation: str, orders: tuple[int, ...]
) -> np.ndarray:
    """:func:`_rdp_at_orders`, cached (read-only: callers add it to their own array)."""
    out = _rdp_at_orders(events, relation, orders)
    out.setflags(write=False)
    return out


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


# ---------------------------------------------------------------------------------------------- any DP event
@functools.lru_cache(maxsize=256)
def _event_pld_cached(event, relation: str, discretization: float):
    return _event_pld(event, relation, discretization)


def _event_pld(event, relation: str, discretization: float):
    from dp_accounting import dp_event, privacy_accountant  # loaded on first accounting
    from dp_accounting.pld import pld_privacy_accountant

    if not isinstance(event, dp_event.DpEvent):
        raise unsupported_event("pld", event, relation)
    acc = pld_privacy_accountant.PLDAccountant(
        _relation(relation), value_discretization_interval=discretization
    )
    try:
        acc.compose(event)
    except privacy_accountant.UnsupportedEventError as exc:
        raise unsupported_event("pld", event, relation, exc) from None
    # dp-accounting's PLDAccountant composes the event into a PrivacyLossDistribution that it keeps in ``_pld``
    # (no public getter); the ledger composes that PLD with its rounds' PLDs (PrivacyLossDistribution.compose)
    pld, non_private = getattr(acc, "_pld", None), getattr(acc, "_contains_non_dp_event", False)
    if pld is None or not callable(getattr(pld, "compose", None)):
        raise RuntimeError(
            "this dp-accounting version keeps no PLDAccountant._pld: a ledger mixing mechanisms with other DP "
            "events cannot be accounted with pld here; use method='rdp'"
        )
    return None if non_private else pld


def event_pld(event, relation: str, discretization: float = DEFAULT_PLD_DISCRETIZATION):
    """The dp-accounting ``PrivacyLossDistribution`` of any ``DpEvent`` (a whole-run event, a participation bound),
    composed by dp-accounting's ``PLDAccountant(relation, discretization).compose(event)``; cached for hashable
    events. None if the event contains a non-private event (epsilon is then infinite). An event the PLD accountant
    does not support is a :class:`PrivacyInputError` naming what is."""
    try:
        hash(event)
    except TypeError:  # e.g. a ComposedDpEvent (it holds a list): not cached
        return _event_pld(event, relation, float(discretization))
    return _event_pld_cached(event, relation, float(discretization))


def release_pld(release, relation: str, discretization: float = DEFAULT_PLD_DISCRETIZATION):
    """One release's PLD: :func:`round_pld` for a Gaussian one (:func:`has_gaussian_pld`: the numbers ``fedsim
    privacy`` composes), else :func:`event_pld` of ``release.to_dp_event(relation)``."""
    if has_gaussian_pld(release):
        return round_pld(release, relation, discretization)
    return event_pld(release.to_dp_event(relation), relation, discretization)


class _NotPrivate(Exception):
    """An event composed for the PLD held a dp-accounting ``NonPrivateDpEvent``."""


class PldLedgerAccountant:
    """The ``pld`` accountant's state for one ledger at one PLD discretisation: the composed PLD cache and the
    memory fallback. A ledger holds one (:meth:`fedsim.privacy.accountants.Accountant.for_ledger`) and hands it its
    rounds, each a tuple of releases composed on one cohort; it answers a number.

    Cached: the composition of every round but the last, and the whole composition with the last round's releases;
    a query after one more round reuses the latter as its prefix, so it costs one composition (dp-accounting's
    ``PrivacyLossDistribution.compose``, the PLDs ``fedsim privacy`` composes too).

    Instead of building a PLD that would not fit in memory (:class:`PldTooLarge`, :data:`MAX_PLD_POINTS`), the
    query is answered with dp-accounting's RDP accountant, also a valid (usually looser) upper bound, so a run
    over-reports rather than under-reports: one ``RuntimeWarning`` per accountant, and :attr:`fallback` says why
    (None when the last query was answered with PLD).
    """

    name = "pld"

    def __init__(self, discretization: float = DEFAULT_PLD_DISCRETIZATION):
        self.discretization = float(discretization)
        self._prefix: tuple | None = None  # (relation, n_rounds, last round's events, pld, size)
        self._total: tuple | None = None  # the same for the last query's whole composition
        self.fallback: str | None = None  # why the last query was answered with rdp (None: it was not)
        self._warned = False

    def epsilon(self, rounds, relation: str, delta: float, cache: bool = True) -> float:
        try:
            eps = self.pld_epsilon(rounds, relation, delta, cache)
        except PldTooLarge as exc:
            if not self._warned:
                warnings.warn(
                    f"PLD accounting is impractical here ({exc}); epsilon is reported with RDP "
                    "(a valid, looser upper bound)",
                    RuntimeWarning,
                    stacklevel=4,  # the caller of Ledger.epsilon
                )
                self._warned = True
            self.fallback = str(exc)
            return float(rdp_epsilon(rounds, relation, delta))
        except _NotPrivate:
            eps = math.inf
        self.fallback = None  # describes the last query only
        return eps

    def pld_epsilon(self, rounds, relation: str, delta: float, cache: bool = True) -> float:
        """Compose the rounds' PLDs with dp-accounting (its public ``compose`` and ``get_epsilon_for_delta``) and
        read epsilon off the result. Raises :class:`PldTooLarge` instead of building a PLD that would not fit."""
        vdi = self.discretization
        complete, last = rounds[:-1], rounds[-1]
        acc, size = None, (0, 0.0, 0.0)
        n0 = 0
        for cached in (self._total, self._prefix):
            # (relation, rounds covered, events of its last covered round, pld, its size estimate)
            if cached is None or cached[0] != relation or cached[1] > len(complete) or cached[1] == 0:
                continue
            if cached[2] != rounds[cached[1] - 1]:
                continue
            n0, acc, size = cached[1], cached[3], cached[4]
            break
        # only the releases not yet composed are checked (the cache carries the size of the rest), so this check
        # does not grow with the run; the composition is checked once, whole. Releases without a Gaussian PLD
        # (other DP events) are built by dp-accounting's PLDAccountant and not estimated beforehand.
        prefix_size = check_pld_size(
            (m for events in complete[n0:] for m in events if has_gaussian_pld(m)),
            relation,
            vdi,
            size,
            whole=False,
        )
        total_size = check_pld_size((m for m in last if has_gaussian_pld(m)), relation, vdi, prefix_size)

        def compose(acc, release):
            p = release_pld(release, relation, vdi)
            if p is None:
                raise _NotPrivate
            return p if acc is None else acc.compose(p)

        for i in range(n0, len(complete)):
            for m in complete[i]:
                acc = compose(acc, m)
        if cache and complete:
            self._prefix = (relation, len(complete), complete[-1], acc, prefix_size)
        total = acc
        for m in last:
            total = compose(total, m)
        if cache:
            self._total = (relation, len(rounds), last, total, total_size)
        return float(total.get_epsilon_for_delta(delta))
