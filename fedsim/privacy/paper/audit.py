"""Audit of the paper bounds (``igmm``: UAI Theorem 7; ``dp-fl-thm8``: arXiv Theorem 8).

For given parameters the audit reports, for each paper bound:

* the per-step check: the exact delta of the per-step Gaussian mechanism (Balle and Wang 2018)
  at the printed per-step epsilon, against the per-step delta the theorem claims;
* the composition check: the printed composed ``delta'`` against the optimal composition
  (Kairouz et al. 2015 Thm 3.3; Murtagh and Vadhan 2016) of the per-step pairs the theorem composes,
  evaluated at the printed ``eps'`` -- no valid bound can be below it;
* the comparison with the certified PLD epsilon at the same delta;
* the structural defects visible in the numbers (the ``K`` exponent, the sign of the Chernoff factor);
* a one-line verdict, always starting with "paper bound; ", e.g.
  ``paper bound; not a valid certificate because the per-step delta is 1.08e-04 at the printed
  eps0, above the claimed 1e-05``.

The audit never presents a paper bound as a certified epsilon.
"""

from __future__ import annotations

import math

import numpy as np

from fedsim.privacy import closed_forms
from fedsim.privacy.accountants import (
    DEFAULT_ACCOUNTANT,
    compute_curve,
    epsilon_at,
    validate_delta,
    validate_rounds,
)
from fedsim.privacy.errors import PrivacyInputError
from fedsim.privacy.gaussian import gaussian_delta
from fedsim.privacy.mechanism import Mechanism

__all__ = ["audit_closed_forms", "audit_igmm_params"]


#: where each theorem's printed Chernoff factor stops being defined (eps' at or above it): named in the verdict
_IGMM_UNDEFINED_AT = "T*et"
_THM8_UNDEFINED_AT = "p*T*et8"


def _fmt(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


def audit_igmm_params(N, tau, T, sigma, D, step_delta, dtil) -> dict:
    """Audit UAI Theorem 7 at explicit parameters (the papers' notation)."""
    r = closed_forms.igmm_theorem7(N, tau, T, sigma, D, step_delta, dtil)
    g = {k: float(np.asarray(v)) for k, v in r.items()}
    ratio = D / (tau * sigma)
    exact_step = float(gaussian_delta(g["eps0"], ratio))
    valid_eps0 = ratio * math.sqrt(2 * math.log(1 / step_delta)) + ratio**2 / 2
    out = dict(
        method="igmm",
        N=N,
        tau=tau,
        T=T,
        sigma=sigma,
        D=D,
        step_delta=step_delta,
        dtil=dtil,
        eps0=g["eps0"],
        eps0_valid_tail_bound=valid_eps0,
        per_step_ratio=ratio,
        exact_step_delta=exact_step,
        per_step_valid=exact_step <= step_delta * (1 + 1e-9),
        et=g["et"],
        eps_prime=g["eps_prime"],
        delta_prime=g["delta_prime"],
        defined=bool(g["defined"]),
        statement=bool(g["statement"]),
        K_printed=g["K"],
        defined_below=g["defined_below"],
        K_corrected=math.ceil(g["eps_prime"] / g["et"]) if math.isfinite(g["eps_prime"]) else None,
        dtil_prime=g["dtil_prime"],
    )
    if g["defined"]:
        # the Chernoff factor with the sign the derivation gives: exp(+(eps'+T et)/2)
        # exp(+(eps'+T et)/2) instead of exp(-(eps'+T et)/2), in log space (it overflows for large epsilons)
        with np.errstate(over="ignore", divide="ignore"):
            out["dtil_prime_sign_corrected"] = float(
                np.exp(np.log(g["dtil_prime"]) + g["eps_prime"] + T * g["et"])
            )
        opt = float(closed_forms.optimal_composition_delta(g["et"], T, g["eps_prime"], step_delta))
        out["optimal_delta_at_eps_prime"] = opt
        out["below_optimal"] = bool(g["statement"] and g["delta_prime"] < opt)
    else:
        out["dtil_prime_sign_corrected"] = None
        out["optimal_delta_at_eps_prime"] = None
        out["below_optimal"] = None
    out["verdict"] = _verdict(out, _IGMM_UNDEFINED_AT)
    return out


def _audit_thm8(N, tau, T, z, step_delta, dtil) -> dict:
    sigma8 = z / tau
    r = closed_forms.dpfl_theorem8(N, tau, T, sigma8, step_delta, dtil)
    g = {k: float(np.asarray(v)) for k, v in r.items()}
    ratio = 2.0 / (tau * sigma8)  # replace-one sensitivity 2L/tau of the average over noise L*sigma
    exact_step = float(gaussian_delta(g["eps0"], ratio))
    p = tau / N
    et_amp = g["et"]  # 2 p et8 (linearised amplification as printed)
    out = dict(
        method="dp-fl-thm8",
        N=N,
        tau=tau,
        T=T,
        sigma=sigma8,
        step_delta=step_delta,
        dtil=dtil,
        eps0=g["eps0"],
        per_step_ratio=ratio,
        exact_step_delta=exact_step,
        per_step_valid=exact_step <= step_delta * (1 + 1e-9),
        et=et_amp,
        eps_prime=g["eps_prime"],
        delta_prime=g["delta_prime"],
        defined=bool(g["defined"]),
        statement=bool(g["statement"]),
        K_printed=g["K"],
        dtil_prime=g["dtil_prime"],
        defined_below=g["defined_below"],
    )
    if g["defined"]:
        opt = float(closed_forms.optimal_composition_delta(et_amp, T, g["eps_prime"], p * step_delta))
        out["optimal_delta_at_eps_prime"] = opt
        out["below_optimal"] = bool(g["statement"] and g["delta_prime"] < opt)
    else:
        out["optimal_delta_at_eps_prime"] = None
        out["below_optimal"] = None
    out["verdict"] = _verdict(out, _THM8_UNDEFINED_AT)
    return out


def _audit_igmm_of(mechanism: Mechanism, p: dict, rounds: int, step_delta: float, dtil: float) -> dict:
    return audit_igmm_params(p["N"], p["tau"], rounds, p["sigma"], p["D"], step_delta, dtil)


def _audit_thm8_of(mechanism: Mechanism, p: dict, rounds: int, step_delta: float, dtil: float) -> dict:
    return _audit_thm8(p["N"], p["tau"], rounds, mechanism.noise_multiplier, step_delta, dtil)


#: the paper bounds audited: each accountant's name, where its printed statement is undefined, and its audit at a
#: mechanism's paper parameters (``Mechanism.igmm_params``), the per-step delta and the dtil its curve used
_AUDITS = (
    ("igmm", _IGMM_UNDEFINED_AT, _audit_igmm_of),
    ("dp-fl-thm8", _THM8_UNDEFINED_AT, _audit_thm8_of),
)


def _verdict(a: dict, bound: str) -> str:
    """The audit's one-line verdict; ``bound``: the eps' at or above which the printed Chernoff factor is
    undefined (the theorem's own expression)."""
    if not a["defined"]:
        return (
            f"paper bound; no statement at T={a['T']:g}: eps'={_fmt(a['eps_prime'])} >= {bound}="
            f"{_fmt(a['defined_below'])}, so the printed Chernoff factor is undefined"
        )
    if not a["statement"]:
        return f"paper bound; no statement at T={a['T']:g}: printed delta'={_fmt(a['delta_prime'])} >= 1"
    reasons = []
    if not a["per_step_valid"]:
        reasons.append(
            f"the exact per-step delta at the printed eps0={_fmt(a['eps0'])} is {a['exact_step_delta']:.3g}, "
            f"above the claimed {a['step_delta']:.3g}"
        )
    if a.get("below_optimal"):
        reasons.append(
            f"the printed delta'={a['delta_prime']:.5g} is below the optimal composition "
            f"{a['optimal_delta_at_eps_prime']:.5g} at eps'={_fmt(a['eps_prime'])}"
        )
    if reasons:
        return "paper bound; not a valid certificate because " + " and ".join(reasons)
    cert = a.get("certified_epsilon")
    if cert is not None and math.isfinite(cert) and a["eps_prime"] < cert:
        return (
            f"paper bound; not a valid certificate because eps'={_fmt(a['eps_prime'])} is below the certified "
            f"PLD epsilon {_fmt(cert)} at the same delta"
        )
    return "paper bound; not a certificate (its derivation has known defects); use the certified epsilon"


def audit_closed_forms(
    mechanism: Mechanism,
    rounds: int,
    delta: float,
    *,
    step_delta: float | None = None,
    dtil: float | None = None,
    certified_method: str = DEFAULT_ACCOUNTANT,
) -> dict:
    """Audit ``igmm`` and ``dp-fl-thm8`` for ``mechanism`` after ``rounds`` rounds at target ``delta``.

    The per-step delta and dtil are those the accountants use (calibrated to the target unless
    given). Returns ``{"igmm": {...}, "dp-fl-thm8": {...}}``, each with a ``verdict`` line.
    """
    if not isinstance(mechanism, Mechanism):
        raise PrivacyInputError("mechanism", type(mechanism).__name__, "must be a fedsim.privacy.Mechanism")
    rounds = validate_rounds(rounds)
    delta = validate_delta(delta)
    if not mechanism.private:  # nothing is noised: no bound, printed or corrected, has anything to say
        verdict = (
            "not private (noise_multiplier = 0, or clip = 0): no paper bound applies; epsilon is infinite"
        )
        return {
            m: {
                "status": "not private",
                "statement": False,
                "certified_epsilon": math.inf,
                "verdict": verdict,
            }
            for m, _, _ in _AUDITS
        }
    p = mechanism.igmm_params()
    out = {}
    for method, bound, audit in _AUDITS:
        c = compute_curve(mechanism, rounds, delta, method, step_delta=step_delta, dtil=dtil, _only_last=True)
        ds = float(c.details["step_delta"][-1])
        dt = float(c.details["dtil"])
        a = audit(mechanism, p, rounds, ds, dt)
        a["status"] = str(c.status[-1])
        cert_delta = a["delta_prime"] if a["statement"] and 0 < a["delta_prime"] < 1 else delta
        a["certified_method"] = certified_method
        a["certified_delta"] = cert_delta
        a["certified_epsilon"] = epsilon_at(mechanism, rounds, cert_delta, certified_method)
        a["verdict"] = _verdict(a, bound)
        out[method] = a
    return out
