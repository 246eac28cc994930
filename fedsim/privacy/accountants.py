"""Accountants selected by name; each returns epsilon after every round (and the delta it used).

==================  ===============  =====================================================================
method              kind             what it is
==================  ===============  =====================================================================
``pld``             certified        dp-accounting privacy loss distributions (tightest)
``rdp``             certified        dp-accounting Renyi DP (looser, exact at every round)
``igmm-corrected``  valid bound      the paper's structure with valid pieces (formula sheet, s. 3)
``kairouz``         valid bound      optimal composition (Kairouz et al. Thm 3.3) of per-step (eps, delta)
``basic``           valid bound      basic composition of per-step (eps, delta)
``igmm``            **paper bound**  UAI Theorem 7 exactly as printed (not a valid certificate)
``dp-fl-thm8``      **paper bound**  arXiv Theorem 8 as printed (not a valid certificate)
==================  ===============  =====================================================================

*Certified* means computed by dp-accounting's accountants, which fedsim reports as the run's epsilon. A *valid
bound* is a closed form written here that is a correct upper bound on epsilon (never below the certified
value, looser in practice), shown for comparison. A *paper bound* is reproduced as printed and audited.

The per-step (eps, delta) of ``kairouz`` and ``basic`` is the exact Gaussian profile of one round
under the mechanism's own neighbouring relation, amplified by the sampling probability (Balle et
al. 2018: Poisson/add-remove and without-replacement/replace-one).

An accountant is added from outside with :func:`register_accountant` (an :class:`Accountant`: a curve for one
mechanism, and how it composes a ledger's rounds); :data:`CERTIFIED`, :data:`VALID_BOUNDS` and
:data:`PAPER_BOUNDS` are live views of the registry by kind, and :func:`certified_methods` lists the certified
ones (what a run may report as its epsilon).

Code outside this module never compares accountant names (``tests/test_registry_names.py`` checks it): what a
caller needs to know about an accountant is an attribute of its entry (:attr:`Accountant.falls_back_to`,
:attr:`Accountant.dp_accountant`, :attr:`Accountant.cheap_per_round`, :attr:`Accountant.rank`), and the choices
made across entries are functions here (:data:`DEFAULT_ACCOUNTANT`, :func:`counterpart`, :func:`tightest`), so a
registered accountant is treated by what it declares, not by what it is called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fedsim.validation import open_unit

from . import certified, closed_forms
from .errors import PrivacyInputError
from .gaussian import amplify_epsilon, gaussian_epsilon
from .mechanism import Mechanism

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "CERTIFIED_KIND",
    "DEFAULT_ACCOUNTANT",
    "KINDS",
    "PAPER_BOUNDS",
    "PAPER_BOUND_KIND",
    "VALID_BOUNDS",
    "VALID_BOUND_KIND",
    "Accountant",
    "CurveQuery",
    "CurveResult",
    "EpsilonCurve",
    "LedgerAccountant",
    "accountant_names",
    "certified_methods",
    "compute_curve",
    "counterpart",
    "curve_methods",
    "epsilon_at",
    "epsilon_curve",
    "method_kind",
    "per_step_epsilon",
    "register_accountant",
    "tightest",
    "validate_delta",
    "validate_method",
    "validate_rounds",
]

#: the kinds of accountant: what a run reports as its epsilon (dp-accounting), a correct closed-form upper bound
#: shown for comparison, and a bound reproduced as printed in a paper (audited, not a certificate)
CERTIFIED_KIND = "certified"
VALID_BOUND_KIND = "valid closed-form bound"
PAPER_BOUND_KIND = "paper bound, not a certificate"
KINDS = (CERTIFIED_KIND, VALID_BOUND_KIND, PAPER_BOUND_KIND)

#: the accountant a run, the ledger and the library functions use when none is named: the tightest certified one
DEFAULT_ACCOUNTANT = "pld"


def validate_delta(delta, field_name: str = "delta") -> float:
    return open_unit(field_name, delta)


def validate_rounds(rounds, field_name: str = "rounds") -> int:
    if isinstance(rounds, float) and rounds.is_integer():
        rounds = int(rounds)
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise PrivacyInputError(field_name, rounds, "must be an integer >= 1")
    return int(rounds)


def validate_method(method, field_name: str = "method", *, kind: str | None = None) -> str:
    """``method`` if it names a registered accountant (of ``kind``, e.g. :data:`CERTIFIED_KIND`, if given), else a
    one-line :class:`PrivacyInputError` (a ``ValueError``) listing the registered choices."""
    choices = accountant_names(kind)
    if not isinstance(method, str) or method not in choices:
        raise PrivacyInputError(field_name, method, f"must be one of {', '.join(choices)}")
    return method


def accountant_names(kind: str | None = None) -> tuple[str, ...]:
    """The names in the registry now (of ``kind`` if given), in registration order."""
    if kind is not None and kind not in KINDS:
        raise PrivacyInputError("kind", kind, f"must be one of {', '.join(KINDS)}")
    return tuple(n for n, a in ACCOUNTANTS.items() if kind is None or a.kind == kind)


def curve_methods() -> list[str]:
    """The accountants with a curve for one mechanism (what ``fedsim privacy`` computes), in registration order; an
    accountant registered for a noise mechanism's own releases may compose ledgers only (``curve=None``)."""
    return [n for n, a in ACCOUNTANTS.items() if a.curve is not None]


def certified_methods() -> tuple[str, ...]:
    """The certified accountants registered now, sorted: what a run may report as its epsilon (the scenario's
    ``privacy.accountant``). With :func:`validate_method` ``(name, field, kind=CERTIFIED_KIND)`` to check one."""
    return tuple(sorted(accountant_names(CERTIFIED_KIND)))


@dataclass
class EpsilonCurve:
    """Epsilon after every round t = 1..rounds for one method, with the delta it used.

    ``epsilon[t-1]`` is NaN where a paper bound makes no statement; ``status[t-1]`` then says why
    (``"ok"`` otherwise). ``exact[t-1]`` is False where a certified value is a bound taken from a
    later checkpoint (PLD curves).
    """

    method: str
    epsilon: np.ndarray
    delta: np.ndarray
    status: np.ndarray
    certified: bool
    exact: np.ndarray
    notes: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.epsilon)

    def reason(self, t: int) -> str:
        return str(self.status[t - 1])

    def to_dict(self) -> dict:
        def clean(a):
            return [
                None if (isinstance(v, float) and not math.isfinite(v)) else v for v in np.asarray(a).tolist()
            ]

        return dict(
            method=self.method,
            certified=self.certified,
            kind=method_kind(self.method),
            epsilon=clean(self.epsilon),
            delta=clean(self.delta),
            status=[str(s) for s in self.status],
            exact=[bool(b) for b in self.exact],
            notes=list(self.notes),
        )


def per_step_epsilon(m: Mechanism, step_delta) -> np.ndarray:
    """Amplified per-round epsilon of ``m`` at amplified per-round delta ``step_delta`` (vectorised).

    Exact Gaussian profile at the base delta ``step_delta/q`` (sensitivity/noise = 1/normalized_noise)
    then ``log(1 + q (e^eps - 1))``.
    """
    q = m.q
    r = 1.0 / m.normalized_noise
    base_delta = np.minimum(np.asarray(step_delta, dtype=float) / q, 1.0 - 1e-16)
    return amplify_epsilon(gaussian_epsilon(base_delta, r), q)


def _status_array(n: int, value: str = "ok") -> np.ndarray:
    return np.full(n, value, dtype=object)


@dataclass
class CurveQuery:
    """One curve request: the mechanism, the rounds asked for (``T``), delta and the method's options. An
    accountant's ``curve`` may append to ``notes`` and fill ``details``."""

    m: Mechanism
    T: np.ndarray
    rounds: int
    delta: float
    only_last: bool
    step_delta: float | None
    dtil: float | None
    pld_discretization: float
    pld_checkpoint_ratio: float
    pld_exact_every_round: bool
    exact_at: tuple[int, ...]
    notes: list[str]
    details: dict


@dataclass
class CurveResult:
    """What an accountant's ``curve`` returns: epsilon (and the delta it holds at) at each of ``query.T``."""

    epsilon: np.ndarray
    delta: np.ndarray
    status: np.ndarray | None = None  # None: "ok", or "no finite epsilon" where epsilon is not finite
    exact: np.ndarray | None = None  # None: exact at every round


_Query, _Result = CurveQuery, CurveResult  # the names the built-in curves were written with

#: a ledger's rounds as an accountant receives them: each round a tuple of releases (a Mechanism per cohort, the
#: round's releases on one cohort composed first, or any other DP release with ``to_dp_event(relation)``)
LedgerRounds = Sequence[tuple[Any, ...]]


@runtime_checkable
class LedgerAccountant(Protocol):
    """What a ledger holds for one accountant (per PLD discretisation): it gets the ledger's rounds and the
    neighbouring relation they are accounted under, and answers epsilon at ``delta``. ``cache``: the rounds extend
    the previous query's (a state may keep compositions); False for a what-if query. ``fallback``: why the last
    query was answered by another accountant (None if it was not)."""

    fallback: str | None

    def epsilon(self, rounds: LedgerRounds, relation: str, delta: float, cache: bool = True) -> float: ...


class _FunctionLedgerAccountant:
    """A stateless ``of_ledger(rounds, relation, delta)`` as a :class:`LedgerAccountant`."""

    fallback = None

    def __init__(self, fn: Callable[[LedgerRounds, str, float], float]):
        self._fn = fn

    def epsilon(self, rounds: LedgerRounds, relation: str, delta: float, cache: bool = True) -> float:
        return float(self._fn(rounds, relation, delta))


def _require_mechanisms(method: str, rounds: LedgerRounds) -> None:
    others = sorted({type(r).__name__ for events in rounds for r in events if not isinstance(r, Mechanism)})
    if others:
        able = ", ".join(
            n for n, a in ACCOUNTANTS.items() if a.kind == CERTIFIED_KIND and a.accepts_any_event
        )
        raise PrivacyInputError(
            "method",
            method,
            f"composes per-round Mechanisms only and this ledger also holds {', '.join(others)} releases; use "
            f"{_or_list(able)}",
        )


class _CurveLedgerAccountant:
    """A closed form (an accountant with only a ``curve``) on a ledger: it needs the same single mechanism in every
    round, and then is that mechanism's curve at the number of rounds."""

    fallback = None

    def __init__(self, method: str):
        self.method = method

    def epsilon(self, rounds: LedgerRounds, relation: str, delta: float, cache: bool = True) -> float:
        _require_mechanisms(self.method, rounds)
        first = rounds[0]
        if len(first) != 1 or any(events != first for events in rounds):
            composers = ", ".join(n for n, a in ACCOUNTANTS.items() if a.composes_ledgers)
            raise PrivacyInputError(
                "method",
                self.method,
                f"needs the same single mechanism in every round; use {_or_list(composers)} for this ledger",
            )
        curve = compute_curve(first[0], len(rounds), delta, self.method)
        return float(curve.epsilon[-1])


def _or_list(names: str) -> str:
    """``"pld, rdp, basic"`` as ``"pld, rdp or basic"``."""
    head, _, tail = names.rpartition(", ")
    return f"{head} or {tail}" if head else tail


@dataclass(frozen=True)
class Accountant:
    """One entry of the registry: a name, its kind (one of :data:`KINDS`), what it is, and how it computes.

    ``curve(query: CurveQuery) -> CurveResult``: epsilon after the rounds ``query.T`` of one mechanism
    (:func:`compute_curve`). How it composes a ledger's rounds (each a tuple of releases: per-round Mechanisms, the
    releases of one round on one cohort composed first, or any other release with ``to_dp_event(relation)``):

    * ``of_ledger(rounds, relation, delta) -> float``: stateless (``rdp``, ``basic``);
    * ``ledger_accountant(pld_discretization) -> LedgerAccountant``: a state the ledger keeps (``pld``: its
      composition cache and memory fallback, :class:`fedsim.privacy.certified.PldLedgerAccountant`);
    * neither (the closed forms): the ledger must hold the same single mechanism in every round, and its epsilon is
      ``curve`` at the number of rounds.

    ``accepts_any_event``: whether its ledger composition takes releases other than Mechanisms (by their
    dp-accounting events); only then is it suggested for such a ledger.

    What callers ask of an entry instead of its name:

    * ``falls_back_to``: for an accountant whose composition is a privacy loss distribution (memory grows as the
      noise per unit of sensitivity shrinks), the accountant that answers, with a valid and looser epsilon, where
      that PLD would not fit in memory (:data:`fedsim.privacy.certified.MAX_PLD_POINTS`); calibration over a
      schedule also searches the whole noise range with it, since it always answers. None: it always answers.
    * ``dp_accountant``: for a certified accountant built on dp-accounting, a factory of a fresh
      ``dp_accounting.PrivacyAccountant`` of that kind: what a schedule's closed-form event is composed with and
      calibrated by (``dp_accounting.calibrate_dp_mechanism``). None: it cannot account a schedule.
    * ``cheap_per_round``: whether its epsilon after many rounds costs about what it costs after one (RDP
      evaluates its orders in closed form; a PLD of ``t`` rounds grows with ``t``), so a schedule's curve is
      computed at every round rather than at checkpoints.
    * ``rank``: where it comes among the accountants of its kind when one epsilon is to be shown from several
      (:func:`tightest`; lower first, the tighter in practice).
    """

    name: str
    kind: str
    description: str
    curve: Callable[[CurveQuery], CurveResult] | None
    of_ledger: Callable[[LedgerRounds, str, float], float] | None = None
    ledger_accountant: Callable[[float], LedgerAccountant] | None = None
    accepts_any_event: bool = False
    falls_back_to: str | None = None
    dp_accountant: Callable[[], Any] | None = None
    cheap_per_round: bool = False
    rank: int = 100

    @property
    def composes_ledgers(self) -> bool:
        """Whether it composes a heterogeneous ledger (else it needs the same single mechanism every round)."""
        return self.of_ledger is not None or self.ledger_accountant is not None

    def for_ledger(
        self, pld_discretization: float = certified.DEFAULT_PLD_DISCRETIZATION
    ) -> LedgerAccountant:
        """A new :class:`LedgerAccountant` for one ledger (a :class:`fedsim.privacy.Ledger` keeps one per accountant
        and PLD discretisation and hands it its rounds)."""
        if self.ledger_accountant is not None:
            return self.ledger_accountant(float(pld_discretization))
        if self.of_ledger is not None:
            return _FunctionLedgerAccountant(self.of_ledger)
        return _CurveLedgerAccountant(self.name)


def _rdp_curve(q: _Query) -> _Result:
    if q.only_last:
        eps = np.array([certified.rdp_epsilon([[q.m]] * q.rounds, q.m.neighbouring, q.delta)])
        return _Result(eps, np.full(1, q.delta))
    # each checkpoint is one dp-accounting composition (35-220 ms): every round up to 10, then 10% apart
    eps, exact = certified.rdp_curve(
        q.m, q.rounds, q.delta, dense=q.rounds if q.pld_exact_every_round else 10, extra=q.exact_at
    )
    if not exact.all():
        q.notes.append(
            f"exact RDP at {int(exact.sum())} checkpoint rounds; rounds in between report the next "
            "checkpoint's epsilon (an upper bound)"
        )
    return _Result(eps, np.full(q.rounds, q.delta), exact=exact)


def _pld_curve(q: _Query) -> _Result:
    points = certified.estimated_pld_points(q.m, None, q.pld_discretization)
    if points > certified.MAX_PLD_POINTS:
        # as the ledger does: instead of exhausting memory, RDP, also a valid (looser) upper bound
        q.notes.append(
            f"pld impractical (one round needs about {points:.3g} PLD points): epsilon from rdp, "
            "a valid, looser upper bound"
        )
        q.details["accountant_used"] = "rdp"
        return _rdp_curve(q)
    if q.only_last:
        single = certified.round_pld(q.m, discretization=q.pld_discretization)
        pld = single if q.rounds == 1 else single.self_compose(q.rounds)
        return _Result(np.array([pld.get_epsilon_for_delta(q.delta)]), np.full(1, q.delta))
    eps, exact = certified.pld_curve(
        q.m,
        q.rounds,
        q.delta,
        discretization=q.pld_discretization,
        checkpoint_ratio=q.pld_checkpoint_ratio,
        exact_every_round=q.pld_exact_every_round,
        extra=q.exact_at,
    )
    if not exact.all():
        q.notes.append(
            f"exact PLD at {int(exact.sum())} checkpoint rounds; rounds in between report the next "
            "checkpoint's epsilon (an upper bound)"
        )
    q.notes.append(f"PLD discretisation {q.pld_discretization:g} (pessimistic)")
    return _Result(eps, np.full(q.rounds, q.delta), exact=exact)


def _paper_curve(method: str) -> Callable[[_Query], _Result]:
    def curve(q: _Query) -> _Result:
        p = q.m.igmm_params()
        T, delta = q.T, q.delta
        dt = delta / 2.0 if q.dtil is None else validate_delta(q.dtil, "dtil")
        if method == "igmm":

            def fn(ds):
                return closed_forms.igmm_theorem7(p["N"], p["tau"], T, p["sigma"], p["D"], ds, dt)
        else:
            sigma8 = q.m.noise_multiplier / p["tau"]  # noise std on the average relative to the clip

            def fn(ds):
                return closed_forms.dpfl_theorem8(p["N"], p["tau"], T, sigma8, ds, dt)

        if q.step_delta is not None:
            ds = validate_delta(q.step_delta, "step_delta")
            r = fn(ds)
            ds_arr = np.full(len(T), ds)
            meets = r["statement"]
        else:
            ds_arr, r = closed_forms.calibrate_step_delta(fn, delta)
            meets = r["statement"] & (r["delta_prime"] <= delta)
        status = _status_array(len(T))
        bound = "T*et" if method == "igmm" else "p*T*et8"
        status[~r["defined"]] = f"undefined: eps' >= {bound}, the Chernoff factor dtil' is not defined"
        status[r["defined"] & ~r["statement"]] = "no statement: printed delta' >= 1 (or not finite)"
        if q.step_delta is None:
            status[r["statement"] & ~meets] = f"no per-step delta gives printed delta' <= {delta:g}"
        q.details.update(
            step_delta=ds_arr, dtil=dt, **{k: r[k] for k in ("eps0", "et", "K", "dtil_prime", "delta_prime")}
        )
        q.notes.append(ACCOUNTANTS[method].description)
        return _Result(
            np.where(meets, r["eps_prime"], np.nan),
            np.where(r["statement"], r["delta_prime"], np.nan),
            status=status,
        )

    return curve


def _igmm_corrected_curve(q: _Query) -> _Result:
    p = q.m.igmm_params()
    T, delta = q.T, q.delta
    rate = p["tau"] / p["N"]
    r_step = p["D"] / (p["tau"] * p["sigma"])
    dt = delta / 2.0 if q.dtil is None else validate_delta(q.dtil, "dtil")
    if dt >= delta:
        raise PrivacyInputError("dtil", q.dtil, f"must be below delta={delta:g}")
    q_ds = -np.expm1((np.log1p(-delta) - np.log1p(-dt)) / T)  # 1 - (1 - q*ds)^T (1 - dt) = delta
    ds = np.minimum(q_ds / rate, 1.0 - 1e-16)
    eps0 = gaussian_epsilon(ds, r_step)
    et = amplify_epsilon(eps0, rate)
    q.details.update(step_delta=ds, eps0=eps0, et=et, dtil=dt)
    return _Result(closed_forms.kairouz_theorem34(et, T, dt), -np.expm1(T * np.log1p(-q_ds) + np.log1p(-dt)))


def _kairouz_curve(q: _Query) -> _Result:
    T = q.T
    q_ds = -np.expm1(
        np.log1p(-q.delta / 2.0) / T
    )  # half of delta to 1-(1-q ds)^T, the rest to the composition
    et = per_step_epsilon(q.m, q_ds)
    eps = closed_forms.optimal_composition_epsilon(et, T, q_ds, q.delta)
    dl = closed_forms.optimal_composition_delta(et, T, eps, q_ds)
    if not q.only_last:
        # the grid (T-2i)*eps_step shifts with the parity of T; a running maximum keeps the curve monotone and is
        # still an upper bound (epsilon(t) >= epsilon(s) for s <= t)
        eps = np.fmax.accumulate(eps)
    q.details.update(et=et, step_delta=q_ds)
    q.notes.append("optimal composition evaluated on its grid (T-2i)*eps_step (running maximum over rounds)")
    return _Result(eps, dl)


def _basic_curve(q: _Query) -> _Result:
    q_ds = np.full(len(q.T), q.delta) / q.T
    et = per_step_epsilon(q.m, q_ds)
    q.details.update(et=et, step_delta=q_ds)
    return _Result(q.T * et, q.T * q_ds)


def _pld_dp_accountant() -> Any:
    # dp-accounting is loaded on first accounting, not when fedsim is imported (Ray workers, ClientApps)
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant()


def _rdp_dp_accountant() -> Any:
    from dp_accounting.rdp import rdp_privacy_accountant

    return rdp_privacy_accountant.RdpAccountant()


def _rdp_of_ledger(rounds: LedgerRounds, relation: str, delta: float) -> float:
    return certified.rdp_epsilon(rounds, relation, delta)


def _basic_of_ledger(rounds: LedgerRounds, relation: str, delta: float) -> float:
    _require_mechanisms("basic", rounds)
    mechs = [m for events in rounds for m in events]
    return float(sum(float(per_step_epsilon(m, delta / len(mechs))) for m in mechs))


#: The one registry of accountants, by name: runs, the ledger, ``fedsim privacy``, calibration and the scenario
#: schema all take their choices from it. A method is added here, or from outside with :func:`register_accountant`.
ACCOUNTANTS: dict[str, Accountant] = {
    a.name: a
    for a in (
        Accountant(
            "pld",
            "certified",
            "privacy loss distribution (dp-accounting), certified",
            _pld_curve,
            ledger_accountant=certified.PldLedgerAccountant,
            accepts_any_event=True,
            falls_back_to="rdp",
            dp_accountant=_pld_dp_accountant,
            rank=0,
        ),
        Accountant(
            "rdp",
            "certified",
            "Renyi DP (dp-accounting), certified",
            _rdp_curve,
            _rdp_of_ledger,
            accepts_any_event=True,
            dp_accountant=_rdp_dp_accountant,
            cheap_per_round=True,
            rank=1,
        ),
        Accountant(
            "igmm",
            "paper bound, not a certificate",
            "UAI Theorem 7 as printed; paper bound, not a certificate",
            _paper_curve("igmm"),
        ),
        Accountant(
            "igmm-corrected",
            "valid closed-form bound",
            "IGMM structure with exact Gaussian step, amplified "
            "delta and Kairouz Thm 3.4; valid closed-form bound",
            _igmm_corrected_curve,
            rank=1,
        ),
        Accountant(
            "dp-fl-thm8",
            "paper bound, not a certificate",
            "arXiv Theorem 8 as printed; paper bound, not a certificate",
            _paper_curve("dp-fl-thm8"),
        ),
        Accountant(
            "kairouz",
            "valid closed-form bound",
            "optimal composition (Kairouz et al. Thm 3.3) of per-step (eps, delta); valid closed-form bound",
            _kairouz_curve,
            rank=0,
        ),
        Accountant(
            "basic",
            "valid closed-form bound",
            "basic composition of per-step (eps, delta); valid closed-form bound",
            _basic_curve,
            _basic_of_ledger,
            rank=2,
        ),
    )
}


def register_accountant(acc: Accountant, *, replace: bool = False) -> Accountant:
    """Add ``acc`` to :data:`ACCOUNTANTS` (and so to :data:`CERTIFIED` / :data:`VALID_BOUNDS` /
    :data:`PAPER_BOUNDS` by its kind): the ledger, :func:`compute_curve`, ``fedsim privacy`` and the scenario schema
    accept its name from then on. A name registered already (to another accountant) is a ``ValueError`` unless
    ``replace``. Returns ``acc``."""
    if not isinstance(acc, Accountant):
        raise TypeError(f"register_accountant takes a fedsim.privacy.accountants.Accountant, got {acc!r}")
    if not isinstance(acc.name, str) or not acc.name or acc.name != acc.name.strip():
        raise ValueError(
            f"an accountant's name must be a non-empty string without surrounding spaces: {acc.name!r}"
        )
    if acc.kind not in KINDS:
        raise ValueError(
            f"accountant {acc.name!r}: kind={acc.kind!r} must be one of {', '.join(map(repr, KINDS))}"
        )
    for part in ("curve", "of_ledger", "ledger_accountant", "dp_accountant"):
        fn = getattr(acc, part)
        if fn is not None and not callable(fn):
            raise TypeError(f"accountant {acc.name!r}: {part} must be callable, got {fn!r}")
    if acc.curve is None and not acc.composes_ledgers:
        raise TypeError(
            f"accountant {acc.name!r}: give a curve, a ledger composition (of_ledger or ledger_accountant), or both"
        )
    if acc.falls_back_to is not None:
        fallback = ACCOUNTANTS.get(acc.falls_back_to) if isinstance(acc.falls_back_to, str) else None
        if fallback is None or fallback.kind != acc.kind or fallback.falls_back_to is not None:
            raise ValueError(
                f"accountant {acc.name!r}: falls_back_to={acc.falls_back_to!r} must name a registered accountant "
                "of the same kind that always answers (falls back to none itself)"
            )
    if acc.name in ACCOUNTANTS and ACCOUNTANTS[acc.name] is not acc and not replace:
        raise ValueError(
            f"an accountant named {acc.name!r} is registered already ({', '.join(ACCOUNTANTS)}); "
            "pass replace=True to replace it"
        )
    ACCOUNTANTS[acc.name] = acc
    return acc


class _MethodsOfKind(AbstractSet):
    """The names of the registered accountants of one kind: a live, read-only set view of :data:`ACCOUNTANTS`
    (it follows :func:`register_accountant`); compares equal to a set of the same names."""

    def __init__(self, kind: str):
        self._kind = kind

    def __contains__(self, name: object) -> bool:
        acc = ACCOUNTANTS.get(name) if isinstance(name, str) else None
        return acc is not None and acc.kind == self._kind

    def __iter__(self) -> Iterator[str]:
        return iter(accountant_names(self._kind))

    def __len__(self) -> int:
        return len(accountant_names(self._kind))

    @classmethod
    def _from_iterable(cls, it) -> frozenset:  # set operations (|, &, -) give a plain frozenset
        return frozenset(it)

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self))}}}"


#: the registered names by kind, live (a registration shows at once); ``frozenset(CERTIFIED)`` for a snapshot
CERTIFIED: AbstractSet[str] = _MethodsOfKind(CERTIFIED_KIND)
VALID_BOUNDS: AbstractSet[str] = _MethodsOfKind(VALID_BOUND_KIND)
PAPER_BOUNDS: AbstractSet[str] = _MethodsOfKind(PAPER_BOUND_KIND)


#: the status of every round of a non-private release (``noise_multiplier = 0`` or ``clip = 0``)
NOT_PRIVATE = "not private"
NOT_PRIVATE_NOTE = (
    "noise_multiplier = 0 (or clip = 0): nothing is noised, so no (epsilon, delta) holds; epsilon is infinite "
    "by every accountant (the non-private baseline of a comparison)"
)


def counterpart(method: str) -> str:
    """The certified accountant a run's epsilon by ``method`` is shown beside (a second, independent
    certificate): :data:`DEFAULT_ACCOUNTANT`, or for the default itself the accountant it falls back to. Any name is
    taken, registered or not (a finished run may name an accountant this process has not registered)."""
    if method != DEFAULT_ACCOUNTANT:
        return DEFAULT_ACCOUNTANT
    return ACCOUNTANTS[DEFAULT_ACCOUNTANT].falls_back_to or DEFAULT_ACCOUNTANT


def tightest(methods) -> str | None:
    """Of the registered names in ``methods``, the one whose epsilon is the statement to make when one is shown:
    certified before valid closed-form bounds, then by :attr:`Accountant.rank` (then registration order). A paper
    bound is never picked (it is not a certificate); None when no name qualifies."""
    order = {name: i for i, name in enumerate(ACCOUNTANTS)}
    kinds = (CERTIFIED_KIND, VALID_BOUND_KIND)
    picks = [m for m in methods if isinstance(m, str) and m in ACCOUNTANTS and ACCOUNTANTS[m].kind in kinds]
    if not picks:
        return None
    return min(picks, key=lambda m: (kinds.index(ACCOUNTANTS[m].kind), ACCOUNTANTS[m].rank, order[m]))


def method_kind(method: str) -> str:
    """``"certified"`` (dp-accounting), ``"valid closed-form bound"`` or ``"paper bound, not a certificate"``."""
    return ACCOUNTANTS[validate_method(method)].kind


def compute_curve(
    mechanism: Mechanism,
    rounds: int,
    delta: float,
    method: str = DEFAULT_ACCOUNTANT,
    *,
    step_delta: float | None = None,
    dtil: float | None = None,
    pld_discretization: float = certified.DEFAULT_PLD_DISCRETIZATION,
    pld_checkpoint_ratio: float = 1.03,
    pld_exact_every_round: bool = False,
    exact_at: tuple[int, ...] = (),
    _only_last: bool = False,
) -> EpsilonCurve:
    """The full per-round result for one method of the registry (see :class:`EpsilonCurve`).

    ``step_delta`` and ``dtil`` fix the free parameters of ``igmm`` / ``dp-fl-thm8`` (then the curve
    reports the printed delta' they imply instead of meeting ``delta``); by default ``dtil=delta/2``
    and the per-step delta is calibrated so that the printed delta' is at most ``delta``. ``exact_at``: rounds
    at which the certified curves (computed exactly at checkpoints, bounded in between) must be exact.
    """
    if not isinstance(mechanism, Mechanism):
        raise PrivacyInputError("mechanism", type(mechanism).__name__, "must be a fedsim.privacy.Mechanism")
    rounds = validate_rounds(rounds)
    delta = validate_delta(delta)
    acc = ACCOUNTANTS[validate_method(method)]
    T = np.array([float(rounds)]) if _only_last else np.arange(1, rounds + 1, dtype=float)
    q = _Query(
        mechanism,
        T,
        rounds,
        delta,
        _only_last,
        step_delta,
        dtil,
        pld_discretization,
        pld_checkpoint_ratio,
        pld_exact_every_round,
        tuple(exact_at),
        list(mechanism.caveats),
        {},
    )
    if not mechanism.private:  # nothing to compose: an un-noised release is not private by any accountant
        status = _status_array(len(T), NOT_PRIVATE)
        inf = np.full(len(T), np.inf)
        return EpsilonCurve(acc.name, inf, np.full(len(T), delta), status, acc.kind == CERTIFIED_KIND,
                            np.ones(len(T), dtype=bool), [NOT_PRIVATE_NOTE], {})  # fmt: skip
    if acc.curve is None:
        curves = ", ".join(n for n, a in ACCOUNTANTS.items() if a.curve is not None)
        raise PrivacyInputError(
            "method",
            acc.name,
            f"accounts a ledger's releases only (it has no curve for a Gaussian mechanism); use {curves}",
        )
    r = acc.curve(q)
    eps = np.asarray(r.epsilon, dtype=float)
    status = _status_array(len(T)) if r.status is None else r.status
    if r.status is None:
        status[~np.isfinite(eps)] = "no finite epsilon at this delta"
    exact = np.ones(len(T), dtype=bool) if r.exact is None else r.exact
    return EpsilonCurve(
        acc.name,
        eps,
        np.asarray(r.delta, dtype=float),
        status,
        acc.kind == CERTIFIED_KIND,
        exact,
        q.notes,
        q.details,
    )


def epsilon_at(
    mechanism: Mechanism, rounds: int, delta: float, method: str = DEFAULT_ACCOUNTANT, **options
) -> float:
    """Epsilon after exactly ``rounds`` rounds (computes only that round; PLD exact there)."""
    return float(compute_curve(mechanism, rounds, delta, method, _only_last=True, **options).epsilon[-1])


def epsilon_curve(
    mechanism: Mechanism, rounds: int, delta: float, method: str = DEFAULT_ACCOUNTANT, **options
) -> np.ndarray:
    """Epsilon after each round t = 1..rounds (NaN where a paper bound makes no statement)."""
    return compute_curve(mechanism, rounds, delta, method, **options).epsilon
