"""The paper bounds transcribed as printed, checked against an independent high-precision
transcription written directly from the paper text (mpmath, 50 digits), and the audit."""

import math

import mpmath as mp
import numpy as np
import pytest

from fedsim.privacy import Mechanism, compute_curve
from fedsim.privacy.closed_forms import (
    dpfl_theorem8,
    igmm_theorem7,
    optimal_composition_delta,
    paper_composition,
)
from fedsim.privacy.gaussian import gaussian_delta
from fedsim.privacy.paper import audit_closed_forms
from fedsim.privacy.paper.audit import audit_igmm_params

mp.mp.dps = 50


def uai_thm7_reference(N, tau, T, sigma, D, delta, dtil):
    """UAI Theorem 7 typed from the paper (Section 5), term by term."""
    N, tau, T, sigma, D, delta, dtil = map(mp.mpf, (N, tau, T, sigma, D, delta, dtil))
    et = mp.log(
        (N - tau) / N
        + tau
        / N
        * mp.exp(
            (mp.sqrt(2) * D * sigma * (1 / tau) * mp.sqrt(mp.log(1 / delta)) + D**2 / tau**2) / (2 * sigma**2)
        )
    )
    eps_p = mp.sqrt(2 * T * mp.log(1 / dtil) * et**2) + T * et * (mp.exp(et) - 1) / (mp.exp(et) + 1)
    if not T * et > eps_p:
        return dict(et=et, eps_prime=eps_p, delta_prime=None)
    K = mp.ceil(N * eps_p / (tau * et))
    dtil_p = (
        mp.exp(-(eps_p + T * et) / 2)
        * ((T * et + eps_p) / (T * et - eps_p)) ** (-(eps_p + T * et) / (2 * et))
        * ((1 / (1 + mp.exp(et))) * (2 * T * et / (T * et - eps_p))) ** T
    )
    delta_p = (
        2
        - (1 - delta / (1 + mp.exp(et))) ** T
        + dtil_p
        - (1 - delta * mp.exp(et) / (1 + mp.exp(et))) ** K * (1 - delta / (1 + mp.exp(et))) ** (T - K)
    )
    return dict(et=et, eps_prime=eps_p, delta_prime=delta_p, K=K, dtil_prime=dtil_p)


def arxiv_thm8_reference(N, tau, T, sigma, delta, dtil):
    """arXiv Theorem 8 typed from the paper (eq. 15 and the definitions after it)."""
    N, tau, T, sigma, delta, dtil = map(mp.mpf, (N, tau, T, sigma, delta, dtil))
    p = tau / N
    e = (4 * sigma / tau * mp.sqrt(mp.log(1 / delta)) + 1 / tau**2) / (2 * sigma**2)
    eps_p = mp.sqrt(8 * mp.log(1 / dtil) * (p**2 * T * e**2)) + 2 * T * p * e * (mp.exp(2 * p * e) - 1) / (
        mp.exp(2 * p * e) + 1
    )
    if not p * T * e > eps_p:
        return dict(eps_prime=eps_p, delta_prime=None)
    K = mp.ceil(N * eps_p / (2 * tau * e))
    y = p * delta / (1 + mp.exp(2 * p * e))
    dt = (
        mp.exp(-(eps_p + p * T * e) / 2)
        * ((1 / (1 + mp.exp(p * e))) * (2 * p * T * e / (p * T * e - eps_p))) ** T
        * ((p * e * T + eps_p) / (p * T * e - eps_p)) ** (-(N * eps_p + tau * T * e) / (2 * tau * e))
    )
    delta_p = 1 - (1 - mp.exp(2 * p * e) * y) ** K * (1 - y) ** (T - K) + 1 - (1 - y) ** T + dt
    return dict(eps_prime=eps_p, delta_prime=delta_p)


POINTS = [  # (N, tau, T, sigma, D, delta, dtil)
    (1000, 100, 1000, 1.0, 2.0, 1e-5, 1e-5),
    (1000, 100, 5000, 0.5, 2.0, 1e-8, 1e-6),
    (60000, 256, 20000, 0.02, 2.0, 1e-7, 1e-5),
    (1000, 100, 10, 1.0, 2.0, 1e-5, 1e-5),  # undefined: eps' >= T*et (small T)
    (100, 10, 50, 0.05, 2.0, 1e-5, 1e-5),  # undefined: large per-step eps
    (1000, 100, 2000, 1.0, 2.0, 1e-2, 1e-5),  # delta' >= 1 (large T*delta): no statement
]


@pytest.mark.parametrize("pt", POINTS)
def test_uai_theorem7_transcription(pt):
    ref = uai_thm7_reference(*pt)
    got = igmm_theorem7(*pt)
    assert float(got["eps_prime"]) == pytest.approx(float(ref["eps_prime"]), rel=1e-12)
    assert float(got["et"]) == pytest.approx(float(ref["et"]), rel=1e-12)
    if ref["delta_prime"] is None:
        assert not bool(got["defined"]) and not bool(got["statement"])
        return
    assert bool(got["defined"])
    assert float(got["delta_prime"]) == pytest.approx(float(ref["delta_prime"]), rel=1e-8)
    assert float(got["K"]) == float(ref["K"])
    assert bool(got["statement"]) == (ref["delta_prime"] < 1)


def test_uai_points_cover_every_region():
    st = [(bool(igmm_theorem7(*p)["defined"]), bool(igmm_theorem7(*p)["statement"])) for p in POINTS]
    assert (True, True) in st and (False, False) in st and (True, False) in st


@pytest.mark.parametrize(
    "pt",
    [
        (1000, 100, 1000, 0.01, 1e-5, 1e-5),
        (10000, 100, 5000, 0.02, 1e-6, 1e-6),
        (1000, 100, 5, 0.01, 1e-5, 1e-5),
    ],
)
def test_arxiv_theorem8_transcription(pt):
    ref = arxiv_thm8_reference(*pt)
    got = dpfl_theorem8(*pt)
    assert float(got["eps_prime"]) == pytest.approx(float(ref["eps_prime"]), rel=1e-12)
    if ref["delta_prime"] is None:
        assert not bool(got["defined"])
    else:
        assert float(got["delta_prime"]) == pytest.approx(float(ref["delta_prime"]), rel=1e-8)


@pytest.mark.parametrize("sigma, expected", [(0.5, 1.08e-4), (1.0, 5.4e-5), (2.0, 2.7e-5)])
def test_defect1_printed_eps0_exact_delta(sigma, expected):
    """C_pop=1000, tau=100, D=2, delta=1e-5: the exact delta at the printed eps0 exceeds 1e-5."""
    r = igmm_theorem7(1000, 100, 1000, sigma, 2.0, 1e-5, 1e-5)
    ratio = 2.0 / (100 * sigma)
    d = float(gaussian_delta(float(r["eps0"]), ratio))
    assert d == pytest.approx(expected, rel=0.02) and d > 1e-5
    a = audit_igmm_params(1000, 100, 1000, sigma, 2.0, 1e-5, 1e-5)
    assert not a["per_step_valid"] and a["verdict"].startswith("paper bound; not a valid certificate because")


def test_defect3_below_optimal_composition():
    """Per-step (0.1, 1e-6), T=1000, dtil=1e-10: printed delta' 9.63e-4 < optimal 9.995e-4."""
    r = paper_composition(0.1, 1e-6, 1000, 1e-10, K_scale=1.0)
    assert float(r["delta_prime"]) == pytest.approx(9.63e-4, rel=2e-3)
    opt = float(optimal_composition_delta(0.1, 1000, float(r["eps_prime"]), 1e-6))
    assert opt == pytest.approx(9.995e-4, rel=1e-3) and float(r["delta_prime"]) < opt


def test_optimal_composition_small_cases():
    # T = 1: (eps, delta) itself; at eps' = 0 the optimal delta' of pure eps-DP is (e^eps-1)/(e^eps+1)
    assert float(optimal_composition_delta(0.5, 1, 0.5, 1e-6)) == pytest.approx(1e-6)
    assert float(optimal_composition_delta(0.5, 1, 0.0, 0.0)) == pytest.approx(math.tanh(0.25))
    # T = 2, eps' = 0: sum over l with (2-2l) eps > 0, i.e. l = 0: (e^{2e} - 1)/(1+e^e)^2
    e = 0.3
    assert float(optimal_composition_delta(e, 2, 0.0, 0.0)) == pytest.approx(
        (math.exp(2 * e) - 1) / (1 + math.exp(e)) ** 2
    )


def test_igmm_curve_reports_no_statement_and_is_never_certified():
    m = Mechanism(population=1000, sampling="fixed", clients_per_round=100, noise_multiplier=1.0)
    c = compute_curve(m, 200, 1e-5, "igmm")
    assert not c.certified
    assert np.isnan(c.epsilon[0]) and "undefined" in c.status[0]
    ok = c.status == "ok"
    assert np.all(np.isfinite(c.epsilon[ok])) and np.all(c.delta[ok] <= 1e-5 * (1 + 1e-9))


def test_audit_verdicts():
    m = Mechanism(population=1000, sampling="fixed", clients_per_round=100, noise_multiplier=50.0)
    a = audit_closed_forms(m, 2000, 1e-5)
    for method in ("igmm", "dp-fl-thm8"):
        assert a[method]["verdict"].startswith("paper bound; ")
        assert "certified_epsilon" in a[method]
    assert a["igmm"]["statement"]
    assert not a["igmm"]["per_step_valid"] and "not a valid certificate" in a["igmm"]["verdict"]
    assert a["igmm"]["K_printed"] > a["igmm"]["K_corrected"]
