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
from dataclasses import dataclass, field

import numpy as np

from . import certified, closed_forms
from .errors import PrivacyInputError
from .gaussian import amplify_epsilon, gaussian_epsilon
from .mechanism import Mechanism

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "VALID_BOUNDS",
    "PAPER_BOUNDS",
    "method_kind",
    "EpsilonCurve",
    "compute_curve",
    "epsilon_curve",
    "epsilon_at",
    "validate_delta",
    "validate_rounds",
    "validate_method",
    "per_step_epsilon",
]

ACCOUNTANTS = ("pld", "rdp", "igmm", "igmm-corrected", "dp-fl-thm8", "kairouz", "basic")
CERTIFIED = frozenset({"pld", "rdp"})
VALID_BOUNDS = frozenset({"igmm-corrected", "kairouz", "basic"})
PAPER_BOUNDS = frozenset({"igmm", "dp-fl-thm8"})


def method_kind(method: str) -> str:
    """``"certified"`` (dp-accounting), ``"valid closed-form bound"`` or ``"paper bound, not a certificate"``."""
    if method in CERTIFIED:
        return "certified"
    if method in VALID_BOUNDS:
        return "valid closed-form bound"
    return "paper bound, not a certificate"

DESCRIPTIONS = {
    "pld": "privacy loss distribution (dp-accounting), certified",
    "rdp": "Renyi DP (dp-accounting), certified",
    "igmm": "UAI Theorem 7 as printed; paper bound, not a certificate",
    "igmm-corrected": "IGMM structure with exact Gaussian step, amplified delta and Kairouz Thm 3.4; valid "
    "closed-form bound",
    "dp-fl-thm8": "arXiv Theorem 8 as printed; paper bound, not a certificate",
    "kairouz": "optimal composition (Kairouz et al. Thm 3.3) of per-step (eps, delta); valid closed-form bound",
    "basic": "basic composition of per-step (eps, delta); valid closed-form bound",
}


def validate_delta(delta, field_name: str = "delta") -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise PrivacyInputError(field_name, delta, "must be a number in (0, 1)") from None
    if isinstance(delta, bool) or not (0.0 < d < 1.0):
        raise PrivacyInputError(field_name, delta, "must be in (0, 1)")
    return d


def validate_rounds(rounds, field_name: str = "rounds") -> int:
    if isinstance(rounds, float) and rounds.is_integer():
        rounds = int(rounds)
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise PrivacyInputError(field_name, rounds, "must be an integer >= 1")
    return int(rounds)


def validate_method(method, field_name: str = "method") -> str:
    if method not in ACCOUNTANTS:
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
            return [None if (isinstance(v, float) and not math.isfinite(v)) else v for v in np.asarray(a).tolist()]

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
    _only_last: bool = False,
) -> EpsilonCurve:
    """The full per-round result for one method (see :class:`EpsilonCurve`).

    ``step_delta`` and ``dtil`` fix the free parameters of ``igmm`` / ``dp-fl-thm8`` (then the curve
    reports the printed delta' they imply instead of meeting ``delta``); by default ``dtil=delta/2``
    and the per-step delta is calibrated so that the printed delta' is at most ``delta``.
    """
    if not isinstance(mechanism, Mechanism):
        raise PrivacyInputError("mechanism", type(mechanism).__name__, "must be a fedsim.privacy.Mechanism")
    rounds = validate_rounds(rounds)
    delta = validate_delta(delta)
    method = validate_method(method)
    T = np.array([float(rounds)]) if _only_last else np.arange(1, rounds + 1, dtype=float)
    n_out = len(T)
    m = mechanism
    notes = list(m.caveats)
    exact = np.ones(n_out, dtype=bool)
    status = _status_array(n_out)
    details: dict = {}
    rdp_instead = False
    if method == "pld":
        points = certified.estimated_pld_points(m, None, pld_discretization)
        if points > certified.MAX_PLD_POINTS:
            # as the ledger does: instead of exhausting memory, RDP, also a valid (looser) upper bound
            rdp_instead = True
            notes.append(f"pld impractical (one round needs about {points:.3g} PLD points): epsilon from rdp, "
                         "a valid, looser upper bound")
            details["accountant_used"] = "rdp"

    if rdp_instead or method == "rdp":
        eps = certified.rdp_epsilon(T[:, None] * certified.round_rdp(m)[None, :], delta)
        dl = np.full(n_out, delta)
    elif method == "pld" and _only_last:
        single = certified.round_pld(m, discretization=pld_discretization)
        eps = np.array([(single if rounds == 1 else single.self_compose(rounds)).get_epsilon_for_delta(delta)])
        dl = np.full(1, delta)
    elif method == "pld":
        eps, exact = certified.pld_curve(
            m, rounds, delta, discretization=pld_discretization,
            checkpoint_ratio=pld_checkpoint_ratio, exact_every_round=pld_exact_every_round,
        )
        if not exact.all():
            notes.append(
                f"exact PLD at {int(exact.sum())} checkpoint rounds; rounds in between report the next "
                "checkpoint's epsilon (an upper bound)"
            )
        notes.append(f"PLD discretisation {pld_discretization:g} (pessimistic)")
        dl = np.full(rounds, delta)
    elif method in ("igmm", "dp-fl-thm8"):
        p = m.igmm_params()
        dt = delta / 2.0 if dtil is None else validate_delta(dtil, "dtil")
        if method == "igmm":
            def fn(ds):
                return closed_forms.igmm_theorem7(p["N"], p["tau"], T, p["sigma"], p["D"], ds, dt)
        else:
            sigma8 = m.noise_multiplier / p["tau"]  # noise std on the average relative to the clip

            def fn(ds):
                return closed_forms.dpfl_theorem8(p["N"], p["tau"], T, sigma8, ds, dt)
        if step_delta is not None:
            ds = validate_delta(step_delta, "step_delta")
            r = fn(ds)
            ds_arr = np.full(n_out, ds)
            meets = r["statement"]
        else:
            ds_arr, r = closed_forms.calibrate_step_delta(fn, delta)
            meets = r["statement"] & (r["delta_prime"] <= delta)
        eps = np.where(meets, r["eps_prime"], np.nan)
        dl = np.where(r["statement"], r["delta_prime"], np.nan)
        status[:] = "ok"
        bound = "T*et" if method == "igmm" else "p*T*et8"
        status[~r["defined"]] = f"undefined: eps' >= {bound}, the Chernoff factor dtil' is not defined"
        bad_delta = r["defined"] & ~r["statement"]
        status[bad_delta] = "no statement: printed delta' >= 1 (or not finite)"
        if step_delta is None:
            above = r["statement"] & ~meets
            status[above] = f"no per-step delta gives printed delta' <= {delta:g}"
        details = dict(step_delta=ds_arr, dtil=dt, **{k: r[k] for k in ("eps0", "et", "K", "dtil_prime", "delta_prime")})
        notes.append(DESCRIPTIONS[method])
    elif method == "igmm-corrected":
        p = m.igmm_params()
        q = p["tau"] / p["N"]
        r_step = p["D"] / (p["tau"] * p["sigma"])
        dt = delta / 2.0 if dtil is None else validate_delta(dtil, "dtil")
        if dt >= delta:
            raise PrivacyInputError("dtil", dtil, f"must be below delta={delta:g}")
        # 1 - (1 - q*ds)^T (1 - dt) = delta
        q_ds = -np.expm1((np.log1p(-delta) - np.log1p(-dt)) / T)
        ds = np.minimum(q_ds / q, 1.0 - 1e-16)
        eps0 = gaussian_epsilon(ds, r_step)
        et = amplify_epsilon(eps0, q)
        eps = closed_forms.kairouz_theorem34(et, T, dt)
        dl = -np.expm1(T * np.log1p(-q_ds) + np.log1p(-dt))
        details = dict(step_delta=ds, eps0=eps0, et=et, dtil=dt)
    elif method == "kairouz":
        # half of delta to 1-(1-q ds)^T, the rest to the optimal-composition term
        q_ds = -np.expm1(np.log1p(-delta / 2.0) / T)
        et = per_step_epsilon(m, q_ds)
        eps = closed_forms.optimal_composition_epsilon(et, T, q_ds, delta)
        dl = closed_forms.optimal_composition_delta(et, T, eps, q_ds)
        if not _only_last:
            # the grid (T-2i)*eps_step shifts with the parity of T; a running maximum keeps the curve
            # monotone and is still an upper bound (epsilon(t) >= epsilon(s) for s <= t)
            eps = np.fmax.accumulate(eps)
        details = dict(et=et, step_delta=q_ds)
        notes.append("optimal composition evaluated on its grid (T-2i)*eps_step (running maximum over rounds)")
    else:  # basic
        q_ds = np.full(n_out, delta) / T
        et = per_step_epsilon(m, q_ds)
        eps = T * et
        dl = T * q_ds
        details = dict(et=et, step_delta=q_ds)

    eps = np.asarray(eps, dtype=float)
    if method not in PAPER_BOUNDS:
        status[~np.isfinite(eps)] = "no finite epsilon at this delta"
    return EpsilonCurve(method, eps, np.asarray(dl, dtype=float), status, method in CERTIFIED, exact, notes, details)


def epsilon_at(mechanism: Mechanism, rounds: int, delta: float, method: str = "pld", **options) -> float:
    """Epsilon after exactly ``rounds`` rounds (computes only that round; PLD exact there)."""
    return float(compute_curve(mechanism, rounds, delta, method, _only_last=True, **options).epsilon[-1])


def epsilon_curve(mechanism: Mechanism, rounds: int, delta: float, method: str = "pld", **options) -> np.ndarray:
    """Epsilon after each round t = 1..rounds (NaN where a paper bound makes no statement)."""
    return compute_curve(mechanism, rounds, delta, method, **options).epsilon
