"""Accountants selected by name; each returns epsilon after every round (and the delta it used).

=================  ==============  ==============================================================
method             kind            what it is
=================  ==============  ==============================================================
``pld``            certified       dp-accounting privacy loss distributions (tightest)
``rdp``            certified       dp-accounting Renyi DP (looser, exact at every round)
``igmm-corrected`` valid bound     the paper's structure with valid pieces (formula sheet, s. 3)
``kairouz``        valid bound     optimal composition (Kairouz et al. Thm 3.3) of per-step (eps, delta)
``basic``          valid bound     basic composition of per-step (eps, delta)
``igmm``           **paper bound** UAI Theorem 7 exactly as printed (not a valid certificate)
``dp-fl-thm8``     **paper bound** arXiv Theorem 8 as printed (not a valid certificate)
=================  ==============  ==============================================================

*Certified* means computed by dp-accounting's accountants, which fedsim reports as the run's epsilon. A *valid
bound* is a closed form written here that is a correct upper bound on epsilon (never below the certified
value, looser in practice), shown for comparison. A *paper bound* is reproduced as printed and audited.

The per-step (eps, delta) of ``kairouz`` and ``basic`` is the exact Gaussian profile of one round
under the mechanism's own neighbouring relation, amplified by the sampling probability (Balle et
al. 2018: Poisson/add-remove and without-replacement/replace-one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedsim.validation import open_unit

from . import certified, closed_forms
from .errors import PrivacyInputError
from .gaussian import amplify_epsilon, gaussian_epsilon
from .mechanism import Mechanism

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "PAPER_BOUNDS",
    "VALID_BOUNDS",
    "Accountant",
    "EpsilonCurve",
    "compute_curve",
    "epsilon_at",
    "epsilon_curve",
    "method_kind",
    "per_step_epsilon",
    "validate_delta",
    "validate_method",
    "validate_rounds",
]


def validate_delta(delta, field_name: str = "delta") -> float:
    return open_unit(field_name, delta)


def validate_rounds(rounds, field_name: str = "rounds") -> int:
    if isinstance(rounds, float) and rounds.is_integer():
        rounds = int(rounds)
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise PrivacyInputError(field_name, rounds, "must be an integer >= 1")
    return int(rounds)


def validate_method(method, field_name: str = "method") -> str:
    if not isinstance(method, str) or method not in ACCOUNTANTS:
        raise PrivacyInputError(field_name, method, f"must be one of {', '.join(ACCOUNTANTS)}")
    return method


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
class _Query:
    """One curve request: the mechanism, the rounds asked for (``T``), delta and the method's options."""

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
class _Result:
    epsilon: np.ndarray
    delta: np.ndarray
    status: np.ndarray | None = None  # None: "ok", or "no finite epsilon" where epsilon is not finite
    exact: np.ndarray | None = None  # None: exact at every round


@dataclass(frozen=True)
class Accountant:
    """One entry of the registry: a name, its kind, what it is, and how it computes.

    ``curve(query)``: epsilon after the rounds ``query.T`` of one mechanism. ``of_ledger(rounds, relation,
    delta, ledger, cache)``: epsilon of a ledger's rounds (each a tuple of mechanisms composed on one cohort); None for
    the closed forms, which need one identical mechanism in every round and then use ``curve``.
    """

    name: str
    kind: str
    description: str
    curve: Callable[[_Query], _Result]
    of_ledger: Callable[..., float] | None = None


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


def _rdp_of_ledger(rounds, relation: str, delta: float, ledger, cache: bool) -> float:
    return certified.rdp_epsilon(rounds, relation, delta)


def _basic_of_ledger(rounds, relation: str, delta: float, ledger, cache: bool) -> float:
    mechs = [m for events in rounds for m in events]
    return float(sum(float(per_step_epsilon(m, delta / len(mechs))) for m in mechs))


def _pld_of_ledger(rounds, relation: str, delta: float, ledger, cache: bool) -> float:
    # the ledger composes its rounds incrementally (dp-accounting's compose) and raises PldTooLarge instead of
    # exhausting memory
    return ledger.pld_epsilon(rounds, relation, delta, cache)


#: The one registry of accountants, by name: runs, the ledger, ``fedsim privacy``, calibration and the scenario
#: schema all take their choices from it. A method is added here, and only here.
ACCOUNTANTS: dict[str, Accountant] = {
    a.name: a
    for a in (
        Accountant(
            "pld",
            "certified",
            "privacy loss distribution (dp-accounting), certified",
            _pld_curve,
            _pld_of_ledger,
        ),
        Accountant("rdp", "certified", "Renyi DP (dp-accounting), certified", _rdp_curve, _rdp_of_ledger),
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
        ),
        Accountant(
            "basic",
            "valid closed-form bound",
            "basic composition of per-step (eps, delta); valid closed-form bound",
            _basic_curve,
            _basic_of_ledger,
        ),
    )
}
CERTIFIED = frozenset(n for n, a in ACCOUNTANTS.items() if a.kind == "certified")
VALID_BOUNDS = frozenset(n for n, a in ACCOUNTANTS.items() if a.kind == "valid closed-form bound")
PAPER_BOUNDS = frozenset(n for n, a in ACCOUNTANTS.items() if a.kind == "paper bound, not a certificate")


#: the status of every round of a non-private release (``noise_multiplier = 0`` or ``clip = 0``)
NOT_PRIVATE = "not private"
NOT_PRIVATE_NOTE = (
    "noise_multiplier = 0 (or clip = 0): nothing is noised, so no (epsilon, delta) holds; epsilon is infinite "
    "by every accountant (the non-private baseline of a comparison)"
)


def method_kind(method: str) -> str:
    """``"certified"`` (dp-accounting), ``"valid closed-form bound"`` or ``"paper bound, not a certificate"``."""
    return ACCOUNTANTS[validate_method(method)].kind


def compute_curve(
    mechanism: Mechanism,
    rounds: int,
    delta: float,
    method: str = "pld",
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
        return EpsilonCurve(acc.name, inf, np.full(len(T), delta), status, acc.kind == "certified",
                            np.ones(len(T), dtype=bool), [NOT_PRIVATE_NOTE], {})  # fmt: skip
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
        acc.kind == "certified",
        exact,
        q.notes,
        q.details,
    )


def epsilon_at(mechanism: Mechanism, rounds: int, delta: float, method: str = "pld", **options) -> float:
    """Epsilon after exactly ``rounds`` rounds (computes only that round; PLD exact there)."""
    return float(compute_curve(mechanism, rounds, delta, method, _only_last=True, **options).epsilon[-1])


def epsilon_curve(
    mechanism: Mechanism, rounds: int, delta: float, method: str = "pld", **options
) -> np.ndarray:
    """Epsilon after each round t = 1..rounds (NaN where a paper bound makes no statement)."""
    return compute_curve(mechanism, rounds, delta, method, **options).epsilon
