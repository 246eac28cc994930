"""Accounting a run whose rounds are not independent releases: a participation schedule, correlated noise, or both.

With independent noise and Poisson, fixed or full participation each round is its own sampled Gaussian
(:class:`~fedsim.privacy.Mechanism`). Under a participation schedule (``cyclic``, ``min-separation``) or with noise
correlated across rounds (``tree``, ``banded-mf``, ``blt``), what is private is the whole run: the released
(noised) updates of ``T`` rounds are a post-processing of ``C x + z``, a Gaussian mechanism whose L2 sensitivity is
the largest ``||C u||`` over the participation patterns ``u`` the schedule allows (``clip`` per participation). The
released prefix of ``t`` rounds has sensitivity ``s_t`` (the mechanism's
:meth:`~fedsim.round.NoiseSource.prefix_sensitivity_squared`), non-decreasing in ``t``.

The ledger still records one release per round, :class:`ScheduledGaussian`, so that epsilon is reported after every
round and a resumed run continues its budget. Round ``t`` is the Gaussian with noise multiplier
``z / sqrt(s_t^2 - s_{t-1}^2)`` (no event where the sensitivity does not grow): Gaussians compose by adding their
``(sensitivity / std)^2``, so the first ``t`` of them compose to exactly the Gaussian of ``z / s_t``, the
certified epsilon of what has been released after round ``t`` (dp-accounting's PLD composes them with its
pessimistic discretisation, its RDP exactly).

Amplification by sampling is claimed in one case only, the one Choquette-Choo et al. (2023, "Amplified banded
matrix factorization", Theorem 4) prove: a cyclic schedule of ``b`` groups with Poisson sampling of rate ``q``
within each group, and a mechanism whose one participation touches rounds no other participation of the same client
touches (banded with at most ``b`` bands; independent noise is one band). Each participation is then a separate
Poisson-sampled Gaussian of sensitivity the column norm, and round ``t`` records one when the worst client's next
participation starts (every ``b``-th round). Everything else is accounted without amplification, as if every
allowed participation happened: an over-report where sampling would have helped, never an under-report.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .accountants import ACCOUNTANTS
from .errors import PrivacyInputError

__all__ = [
    "ScheduleAccounting",
    "ScheduledGaussian",
    "calibrate_schedule",
    "pld_impractical",
    "schedule_bounds",
    "schedule_epsilon",
    "schedule_epsilon_detail",
    "schedule_methods",
]

#: calibration aims this fraction below the target epsilon (see :func:`calibrate_schedule`)
MARGIN = 1e-3
#: the noise multipliers :func:`calibrate_schedule` searches
CALIBRATION_RANGE = (1e-2, 1e4)
#: the value discretisation of dp-accounting's ``PLDAccountant`` (its default), which the schedule's PLDs use
PLD_DISCRETIZATION = 1e-4


@dataclass(frozen=True)
class ScheduledGaussian:
    """Round ``round`` of a scheduled or correlated-noise run, as the ledger records it (see the module).

    ``increment``: this round's share of the squared sensitivity (per unit of clip), 0 where the released prefix's
    sensitivity does not grow; ``sensitivity_squared``: the released prefix's, through this round (per
    participation, under amplification); ``sampling_prob``: the Poisson rate within a cyclic group when
    amplification is claimed, else 1; ``exact``: False if the sensitivity is an upper bound."""

    kind = "scheduled-gaussian"

    round: int
    population: int
    clip: float
    noise_multiplier: float
    mechanism: str
    schedule: str
    min_separation: int
    max_participations: int | None
    increment: float
    sensitivity_squared: float
    sampling_prob: float = 1.0
    exact: bool = True

    def __post_init__(self) -> None:
        for name in ("clip", "noise_multiplier", "increment", "sensitivity_squared"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise PrivacyInputError(name, value, "must be a finite number >= 0")
        if not 0.0 < self.sampling_prob <= 1.0:
            raise PrivacyInputError("sampling_prob", self.sampling_prob, "must be in (0, 1]")

    @property
    def neighbouring(self) -> str:
        return "add-remove"

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0 and self.clip > 0

    def to_dp_event(self, relation: str | None = None) -> Any:
        """``GaussianDpEvent(z / sqrt(increment))``, Poisson-sampled at ``sampling_prob`` if below 1; a
        ``NoOpDpEvent`` for a round that adds no sensitivity; ``NonPrivateDpEvent`` without noise."""
        from dp_accounting import dp_event

        if relation not in (None, "add-remove"):
            raise PrivacyInputError(
                "relation",
                relation,
                f"a {self.schedule!r} round with {self.mechanism!r} noise is accounted under add/remove only; do "
                "not mix it with fixed-size (replace-one) rounds in one ledger",
            )
        if not self.private:
            return dp_event.NonPrivateDpEvent()
        if self.increment <= 0:
            return dp_event.NoOpDpEvent()
        gaussian = dp_event.GaussianDpEvent(self.noise_multiplier / math.sqrt(self.increment))
        if self.sampling_prob < 1.0:
            return dp_event.PoissonSampledDpEvent(self.sampling_prob, gaussian)
        return gaussian

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ScheduledGaussian:
        from .mechanism import from_fields

        return from_fields(cls, d, cls.kind)


class ScheduleAccounting:
    """The ledger entries of one run under a schedule (``min_sep``, ``k``) and a noise mechanism (``noise``, a
    :class:`~fedsim.round.NoiseSource` prepared for the schedule). ``within_rate``: a cyclic schedule's Poisson
    rate within its groups (None: the whole group), amplified where the mechanism allows (see the module)."""

    def __init__(
        self,
        noise: Any,
        schedule: str,
        min_sep: int,
        k: int | None,
        within_rate: float | None = None,
        amplifies: bool = False,
    ) -> None:
        self.noise = noise
        self.schedule = schedule
        self.min_sep = int(min_sep)
        self.k = k
        self.within_rate = within_rate
        column = noise.amplified_sensitivity_squared(self.min_sep) if amplifies else None
        #: the squared sensitivity of one participation when amplification is claimed, else None
        self.column_squared = column if (within_rate is not None and within_rate < 1.0) else None
        self._prefix = np.zeros(0)
        self._exact = True

    @classmethod
    def for_schedule(
        cls,
        noise: Any,
        scheme: Any,
        sampling_rate: float | None,
        min_separation: int | None,
        max_participations: int | None,
    ) -> ScheduleAccounting:
        """The accounting of a run sampled by ``scheme`` (a registered sampler class or object) with ``noise``: a
        participation schedule's own bounds and within-group rate, or every round (``all`` with correlated
        noise)."""
        sep, k = schedule_bounds(scheme, min_separation, max_participations)
        return cls(
            noise,
            scheme.name,
            sep,
            k,
            within_rate=sampling_rate if scheme.scheduled else None,
            amplifies=bool(getattr(scheme, "amplifies", False)),
        )

    @property
    def amplified(self) -> bool:
        return self.column_squared is not None

    def prefix(self, t: int) -> tuple[float, float, bool]:
        """``(s_{t-1}^2, s_t^2, exact)`` of the released prefixes (per unit of clip)."""
        if t > self._prefix.size:
            n = max(int(t), 2 * self._prefix.size, 16)
            self._prefix, self._exact = self.noise.prefix_sensitivity_squared(
                n, self.min_sep, self.k, cyclic=self.schedule in ("cyclic", "all")
            )
            self._prefix = np.asarray(self._prefix, dtype=np.float64)
        before = float(self._prefix[t - 2]) if t > 1 else 0.0
        return before, float(self._prefix[t - 1]), self._exact

    def release(self, t: int, mechanism: Any) -> ScheduledGaussian:
        """Round ``t``'s (from 1) ledger entry for the round's :class:`~fedsim.privacy.Mechanism` (its population,
        clip and noise multiplier)."""
        if self.amplified:
            starts = (t - 1) % self.min_sep == 0 and (self.k is None or (t - 1) // self.min_sep < self.k)
            participations = min(-(-t // self.min_sep), self.k or t)
            increment, total, exact, prob = (
                self.column_squared if starts else 0.0,
                participations * self.column_squared,
                True,
                float(self.within_rate),
            )
        else:
            before, total, exact = self.prefix(t)
            increment, prob = max(total - before, 0.0), 1.0
        return ScheduledGaussian(
            round=int(t),
            population=int(mechanism.population),
            clip=float(mechanism.clip),
            noise_multiplier=float(mechanism.noise_multiplier),
            mechanism=self.noise.name,
            schedule=self.schedule,
            min_separation=self.min_sep,
            max_participations=self.k,
            increment=float(increment),
            sensitivity_squared=float(total),
            sampling_prob=prob,
            exact=exact,
        )

    def run_event(self, t: int, noise_multiplier: float) -> Any:
        """The dp-accounting event of the first ``t`` rounds at ``noise_multiplier``, in closed form: the Gaussian of
        ``z / s_t`` (the composition of the per-round Gaussians :meth:`release` records, which add their
        ``(sensitivity / std)^2``), or, amplified, the ``ceil(t / b)``-fold Poisson-sampled Gaussian of the column
        norm. What ``fedsim privacy`` calibrates and prints; a run's ledger composes the same rounds one by one."""
        from dp_accounting import dp_event

        if not noise_multiplier > 0:
            return dp_event.NonPrivateDpEvent()
        if self.amplified:
            k = min(-(-t // self.min_sep), self.k or t)
            one = dp_event.PoissonSampledDpEvent(
                float(self.within_rate),
                dp_event.GaussianDpEvent(noise_multiplier / math.sqrt(self.column_squared)),
            )
            return dp_event.SelfComposedDpEvent(one, k)
        _, total, _ = self.prefix(t)
        return dp_event.GaussianDpEvent(noise_multiplier / math.sqrt(total))

    @property
    def exact(self) -> bool:
        """Whether the sensitivities computed so far are exact (False: some are upper bounds)."""
        return self._exact

    def describe(self) -> str:
        how = (
            f"amplified: Poisson q={self.within_rate:g} within each of {self.min_sep} groups"
            if self.amplified
            else "no amplification claimed"
        )
        cap = "" if self.k is None else f", at most {self.k} times"
        return f"{self.noise.describe()}; {self.schedule} schedule, min separation {self.min_sep}{cap}; {how}"


def schedule_bounds(
    scheme: Any, min_separation: int | None, max_participations: int | None
) -> tuple[int, int | None]:
    """``(min_sep, k)``: how often one client may take part under ``scheme``, as the accounting assumes it: a
    participation schedule's own bounds, else every round (``all``)."""
    return (int(min_separation), max_participations) if scheme.scheduled else (1, None)


def schedule_methods() -> tuple[str, ...]:
    """The accountants that can account a schedule, in registry order: those built on dp-accounting
    (:attr:`~fedsim.privacy.accountants.Accountant.dp_accountant`), which compose the schedule's closed-form event
    (:meth:`ScheduleAccounting.run_event`); the closed forms describe independent rounds only."""
    return tuple(name for name, acc in ACCOUNTANTS.items() if acc.dp_accountant is not None)


def _dp_accountant(method: str) -> Any:
    """The factory of dp-accounting's accountant for ``method`` (one of :func:`schedule_methods`)."""
    acc = ACCOUNTANTS.get(method) if isinstance(method, str) else None
    if acc is None or acc.dp_accountant is None:
        raise PrivacyInputError(
            "accountant",
            method,
            f"must be {' or '.join(schedule_methods())} to account a schedule (dp-accounting)",
        )
    return acc.dp_accountant


def pld_impractical(accounting: ScheduleAccounting, t: int, noise_multiplier: float) -> str | None:
    """Why dp-accounting's PLD of the first ``t`` rounds at ``noise_multiplier`` (:meth:`ScheduleAccounting.run_event`)
    would not fit in memory, or None: more points than the ledger allows one
    (:data:`fedsim.privacy.certified.MAX_PLD_POINTS`). A long schedule with little noise per unit of sensitivity
    gets there (tree aggregation over 20,000 cyclic rounds at z = 1 is a Gaussian of noise multiplier 4e-4: about
    5e10 points)."""
    from .certified import MAX_PLD_POINTS, gaussian_pld_points

    if not noise_multiplier > 0:
        return None
    amplified = accounting.amplified
    if amplified:
        std = noise_multiplier / math.sqrt(accounting.column_squared)
        count = min(-(-t // accounting.min_sep), accounting.k or t)
    else:
        _, total, _ = accounting.prefix(t)
        if not total > 0:
            return None
        std, count = noise_multiplier / math.sqrt(total), 1
    points = gaussian_pld_points(std, count, PLD_DISCRETIZATION)
    if points <= MAX_PLD_POINTS:
        return None
    what = f"{count} sampled Gaussians" if amplified else "one Gaussian"
    return (
        f"the first {t} rounds are {what} of noise multiplier {std:.3g}, whose PLD needs about {points:.3g} points "
        f"(at most {MAX_PLD_POINTS:.3g})"
    )


def schedule_epsilon_detail(
    accounting: ScheduleAccounting, t: int, noise_multiplier: float, delta: float, method: str
) -> tuple[float, str | None]:
    """:func:`schedule_epsilon` and why ``method`` was answered with the accountant it falls back to (``pld``
    with ``rdp``; None: it was not)."""
    from dp_accounting import dp_event

    event = accounting.run_event(t, noise_multiplier)
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return math.inf, None
    make = _dp_accountant(method)  # refuses an accountant not built on dp-accounting
    fallback = ACCOUNTANTS[method].falls_back_to  # set for a PLD, which may not fit in memory
    why = pld_impractical(accounting, t, noise_multiplier) if fallback is not None else None
    acc = _dp_accountant(fallback)() if why else make()
    acc.compose(event)
    return float(acc.get_epsilon(delta)), why


def schedule_epsilon(
    accounting: ScheduleAccounting, t: int, noise_multiplier: float, delta: float, method: str
) -> float:
    """The certified epsilon at ``delta`` of the first ``t`` rounds at ``noise_multiplier`` (dp-accounting's
    ``method`` on :meth:`ScheduleAccounting.run_event`); infinite without noise. Where ``pld`` would not fit in memory
    (:func:`pld_impractical`) it is answered with ``rdp``, a valid, looser upper bound, as the ledger does."""
    return schedule_epsilon_detail(accounting, t, noise_multiplier, delta, method)[0]


def calibrate_schedule(
    accounting: ScheduleAccounting,
    rounds: int,
    target_epsilon: float,
    delta: float,
    method: str,
    *,
    notes: list[str] | None = None,
) -> float:
    """The noise multiplier whose certified epsilon (dp-accounting's ``method``, one of :func:`schedule_methods`) after
    ``rounds`` rounds of ``accounting`` is ``target_epsilon`` at ``delta``, computed on the run's closed-form event
    and aimed 0.1% below the target: a run's ledger composes the same Gaussian round by round, and PLD's
    pessimistic discretisation then adds a little (4.00004 for a target of 4 over 100 rounds without the margin).
    RDP first, then PLD, which is tighter, just below RDP's answer (a PLD at a tiny noise multiplier would not fit in
    memory): the whole range is searched with the accountant ``method`` falls back to
    (:attr:`~fedsim.privacy.accountants.Accountant.falls_back_to`, which always answers), or with ``method`` itself
    if it has none. Where even that PLD would not fit (:func:`pld_impractical`), ``pld`` answers with RDP's noise
    multiplier, which certifies the target too, and says so in ``notes``.

    A target that no noise multiplier in :data:`CALIBRATION_RANGE` meets, or that even the least of them beats, is
    a :class:`PrivacyInputError` naming the epsilons that range reaches."""
    from dp_accounting import calibrate_dp_mechanism
    from dp_accounting.mechanism_calibration import ExplicitBracketInterval

    from fedsim.validation import target_out_of_reach

    from .certified import quiet_absl

    if not (
        isinstance(target_epsilon, (int, float))
        and not isinstance(target_epsilon, bool)
        and math.isfinite(target_epsilon)
        and target_epsilon > 0
    ):
        raise PrivacyInputError("target_epsilon", target_epsilon, "must be a positive finite number")
    _dp_accountant(method)  # refuses an accountant not built on dp-accounting
    search = ACCOUNTANTS[method].falls_back_to or method  # answers over the whole range (pld: rdp)
    aim = float(target_epsilon) * (1.0 - MARGIN)
    least, most = CALIBRATION_RANGE
    with quiet_absl():
        reach = (
            schedule_epsilon(accounting, rounds, least, delta, search),
            schedule_epsilon(accounting, rounds, most, delta, search),
        )
    if not reach[1] < aim < reach[0]:  # the root finder needs the target strictly inside
        raise target_out_of_reach(
            "target_epsilon", target_epsilon, rounds, delta, CALIBRATION_RANGE, reach, search
        )

    def calibrate(name: str, low: float, high: float) -> float:
        return float(
            calibrate_dp_mechanism(
                _dp_accountant(name),
                lambda z: accounting.run_event(rounds, z),
                aim,
                float(delta),
                ExplicitBracketInterval(low, high),
                tol=1e-4,
            )
        )

    with quiet_absl():
        z_search = calibrate(search, least, most)
        if search == method:
            return z_search
        why = pld_impractical(accounting, rounds, 0.25 * z_search)
        if why is None:
            try:
                return calibrate(method, 0.25 * z_search, 1.01 * z_search)
            except ValueError:  # PLD's epsilon does not cross the target in that bracket
                why = (
                    f"{method.upper()}'s epsilon does not cross the target near {search.upper()}'s noise "
                    "multiplier"
                )
        if notes is not None:
            notes.append(
                f"{method}: calibrated with {search} ({why}): {search.upper()}'s noise multiplier, which "
                "certifies the target too"
            )
        return z_search
