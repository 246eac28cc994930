"""Accounting of the distributed discrete Gaussian and Skellam mechanisms (issue 36): the research code's numbers, the
continuous Gaussian limit, and the two release kinds through the ledger's ``rdp`` accountant.

The vectors (``discrete_vectors.json``) are the outputs of google-research/federated
``distributed_dp/accounting_utils.py`` at commit 5e27a86323a35c2018fb97fbbe755c7ade9370ab, copied verbatim and run
with ``import tensorflow_privacy as tfp`` resolved to a shim over dp-accounting 0.6.0's RDP module (the file's
``source`` and ``shim`` say exactly how)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from fedsim.privacy import RELEASE_KINDS, Ledger, Mechanism, PrivacyInputError
from fedsim.privacy import discrete as dd
from fedsim.privacy.discrete import RDP_ORDERS, DDGaussRound, SkellamRound
from fedsim.round.discrete import heuristic_scale

VECTORS = json.loads((Path(__file__).parent / "discrete_vectors.json").read_text())["vectors"]
DELTA = 1e-5


def _id(v: dict) -> str:
    return f"q{v['q']}-n{v['n']}-d{v['dim']}-b{v['bits']}-beta{v['beta']:.2f}-T{v['steps']}"


def _gaussian_rdp_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    """dp-accounting's RDP epsilon of the (Poisson-subsampled) Gaussian at the integer orders."""
    acc = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    event = dp_event.GaussianDpEvent(z)
    acc.compose(event if q == 1 else dp_event.PoissonSampledDpEvent(q, event), steps)
    return acc.get_epsilon(delta)


def _zhu_wang_gaussian_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    """The continuous Gaussian amplified the way the discrete mechanisms are (Zhu and Wang's general bound, capped by
    the unamplified RDP): the limit the discrete mechanisms reach as the grid vanishes."""
    rdp = np.array(
        [
            min(dd.subsampled_rdp(a, q, lambda ls: np.asarray(ls) / (2 * z * z)), a / (2 * z * z))
            for a in RDP_ORDERS
        ]
    )
    return dd.epsilon_from_rdp(RDP_ORDERS, rdp * steps, delta)[0]


def _ddgauss(bits: int, z: float, q: float, steps: int, beta: float, n: int = 100, dim: int = 2**16) -> float:
    local = z / math.sqrt(n)
    gamma = 1.0 / heuristic_scale(local, 1.0, bits, n, dim, 4)
    return dd.ddgauss_epsilon(gamma, local, n, 1.0, beta, dim, q, steps, DELTA)[0]


def _skellam(bits: int, z: float, q: float, steps: int, beta: float, n: int = 100, dim: int = 2**16) -> float:
    local = z / math.sqrt(n)
    scale = heuristic_scale(local, 1.0, bits, n, dim, 3)
    return dd.skellam_epsilon(scale, z, 1.0, beta, dim, q, steps, DELTA)[0]


def _round(cls: type, round_: int = 1, **kw) -> dd._DiscreteRound:
    """A round of 100 clients at q = 0.01, z = 1, 16 bits, d = 2^16, beta = exp(-0.5), gamma from the heuristic."""
    p = dict(q=0.01, clip=1.0, shares=100.0, dim=2**16, beta=math.exp(-0.5), bits=16, z=1.0)
    p.update(kw)
    local = p.pop("z") * p["clip"] / math.sqrt(100)
    k = 4 if cls is DDGaussRound else 3
    gamma = p.pop("gamma", None) or 1.0 / heuristic_scale(local, p["clip"], p["bits"], 100, p["dim"], k)
    return cls(round=round_, gamma=gamma, local_std_grid=local / gamma, **p)


# ---------------------------------------------------------------------------------------------- the research code
@pytest.mark.parametrize("v", VECTORS, ids=_id)
def test_reproduces_the_research_code(v):
    eps, order = dd.ddgauss_epsilon(
        v["ddgauss_gamma"],
        v["local_stddev"],
        v["n"],
        v["clip"],
        v["beta"],
        v["dim"],
        v["q"],
        v["steps"],
        v["delta"],
    )
    assert eps == pytest.approx(v["ddgauss_epsilon"], rel=1e-9) and order == v["ddgauss_order"]
    eps, order = dd.skellam_epsilon(
        v["skellam_scale"],
        v["local_stddev"] * math.sqrt(v["n"]),
        v["clip"],
        v["beta"],
        v["dim"],
        v["q"],
        v["steps"],
        v["delta"],
    )
    assert eps == pytest.approx(v["skellam_epsilon"], rel=1e-9) and order == v["skellam_order"]
    tau = dd.ddgauss_tau(v["local_stddev"] / v["ddgauss_gamma"], v["n"])
    assert tau == pytest.approx(v["ddgauss_tau"], rel=1e-9, abs=1e-300)
    # fedsim.round.discrete's heuristic is the research code's heuristic_scale_factor
    assert 1.0 / heuristic_scale(
        v["local_stddev"], v["clip"], v["bits"], v["n"], v["dim"], 4
    ) == pytest.approx(v["ddgauss_gamma"], rel=1e-12)
    assert heuristic_scale(v["local_stddev"], v["clip"], v["bits"], v["n"], v["dim"], 3) == pytest.approx(
        v["skellam_scale"], rel=1e-12
    )


def test_vectors_cover_the_brief():
    """Both sampling rates, cohorts, dimensions, betas and horizons, and a vector where tau is not zero."""
    for key, values in (
        ("q", {1.0, 0.01}),
        ("n", {100, 1000}),
        ("dim", {2**16, 2**20}),
        ("steps", {1, 1000}),
    ):
        assert {v[key] for v in VECTORS} >= values
    assert {v["beta"] for v in VECTORS} >= {0.0, math.exp(-0.5)}
    assert any(v["ddgauss_tau"] * v["dim"] > 1e-3 for v in VECTORS)


@pytest.mark.parametrize("v", VECTORS, ids=_id)
def test_release_kinds_account_as_the_research_functions(v):
    """A ledger of ``steps`` rounds of each release kind (grid units) gives the research function's epsilon
    (original units)."""
    gamma, local, n = v["ddgauss_gamma"], v["local_stddev"], v["n"]
    common = dict(q=v["q"], clip=v["clip"], shares=float(n), dim=v["dim"], beta=v["beta"], bits=v["bits"])
    for release, expected in (
        (DDGaussRound(round=1, gamma=gamma, local_std_grid=local / gamma, **common), v["ddgauss_epsilon"]),
        (
            SkellamRound(
                round=1, gamma=1 / v["skellam_scale"], local_std_grid=local * v["skellam_scale"], **common
            ),
            v["skellam_epsilon"],
        ),
    ):
        eps = dd.epsilon_from_rdp(RDP_ORDERS, release.rdp() * v["steps"], v["delta"])[0]
        assert eps == pytest.approx(expected, rel=1e-9)
        if v["steps"] == 1:
            assert release.epsilon(v["delta"]) == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------------------------------------- the Gaussian limit
@pytest.mark.parametrize("beta", [0.0, math.exp(-0.5)])
def test_without_sampling_tends_to_the_gaussian(beta):
    """At q = 1, as bits grow (gamma -> 0 at a fixed local std), both mechanisms' epsilons fall towards the
    continuous Gaussian's at z = sqrt(n) sigma / c (dp-accounting's RDP at the same orders), within 1% at 24 bits,
    and never below it."""
    gauss = _gaussian_rdp_epsilon(1.0, 1.0, 10, DELTA)
    for fn in (_ddgauss, _skellam):
        eps = [fn(bits, 1.0, 1.0, 10, beta) for bits in range(12, 25, 2)]
        assert all(e >= gauss * (1 - 1e-12) for e in eps)
        assert all(later <= earlier * (1 + 1e-12) for earlier, later in itertools.pairwise(eps))
        assert eps[-1] == pytest.approx(gauss, rel=1e-2)


def test_with_sampling_tends_to_the_gaussian_under_the_same_amplification():
    """At q = 0.01 the discrete mechanisms tend to the Gaussian amplified by Zhu and Wang's general bound (the
    research code's subsampling), within 1% at 24 bits. That bound is itself about 16% above dp-accounting's exact
    subsampled-Gaussian RDP here, so the discrete epsilons stay above the Gaussian's by that much."""
    q, steps = 0.01, 1000
    limit = _zhu_wang_gaussian_epsilon(1.0, q, steps, DELTA)
    exact = _gaussian_rdp_epsilon(1.0, q, steps, DELTA)
    assert 1.1 * exact < limit < 1.25 * exact
    for fn in (_ddgauss, _skellam):
        eps = [fn(bits, 1.0, q, steps, 0.0) for bits in range(12, 25, 4)]
        assert all(later <= earlier * (1 + 1e-12) for earlier, later in itertools.pairwise(eps))
        assert eps[-1] == pytest.approx(limit, rel=1e-2)


@pytest.mark.parametrize("bits", [8, 10, 12, 16, 20])
@pytest.mark.parametrize("q", [1.0, 0.1, 0.01])
def test_ddgauss_never_below_the_gaussian(bits, q):
    """Rounding inflates the sensitivity and tau only adds: DDGauss's epsilon is at least the continuous Gaussian's
    at the same central noise, even at few bits (where tau is large)."""
    for z in (0.5, 1.0, 3.0):
        assert _ddgauss(bits, z, q, 100, 0.0, n=200) >= _gaussian_rdp_epsilon(z, q, 100, DELTA) * (1 - 1e-12)


def test_zhu_wang_upper_bounds_the_exact_subsampled_gaussian():
    """Zhu and Wang's bound is an upper bound: above dp-accounting's exact Poisson-subsampled Gaussian RDP at every
    integer order; at q = 1 it is the mechanism's own RDP."""
    for z in (0.7, 1.0, 2.0):
        exact = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(0.05, z, RDP_ORDERS)
        bound = [dd.subsampled_rdp(a, 0.05, lambda ls, z=z: np.asarray(ls) / (2 * z * z)) for a in RDP_ORDERS]
        assert np.all(np.asarray(bound) >= exact * (1 - 1e-12))
    assert dd.subsampled_rdp(7, 1.0, lambda ls: np.asarray(ls) * 0.5) == 3.5
    with pytest.raises(ValueError, match="integers"):
        dd.subsampled_rdp(2.5, 0.1, lambda ls: np.asarray(ls) * 0.5)


def test_tau_sums_every_term(monkeypatch):
    """tau sums in chunks exactly what the research code's loop sums, rounds a fractional count of shares up, and
    vanishes for a few grid steps of noise."""

    def loop(sigma, n):
        return 10 * sum(math.exp(-2 * (math.pi * sigma) ** 2 * (k / (k + 1))) for k in range(1, n))

    monkeypatch.setattr(dd, "_TAU_CHUNK", 7)
    for sigma in (0.2, 0.5, 1.0):
        for n in (1, 2, 8, 50):
            assert dd.ddgauss_tau(sigma, n) == pytest.approx(loop(sigma, n), rel=1e-12)
    assert dd.ddgauss_tau(0.5, 49.5) == dd.ddgauss_tau(0.5, 50)
    assert dd.ddgauss_tau(9.0, 10**6) == 0.0
    assert 0 < dd.ddgauss_tau(2.0, 100) < 1e-14


# ---------------------------------------------------------------------------------------------- release kinds
def test_release_kinds_are_registered_and_round_trip():
    assert RELEASE_KINDS["ddgauss-round"] is DDGaussRound and RELEASE_KINDS["skellam-round"] is SkellamRound
    for cls in (DDGaussRound, SkellamRound):
        r = _round(cls, 3)
        assert r.private and r.neighbouring == "add-remove"
        assert isinstance(r.to_dp_event(), dp_event.UnsupportedDpEvent)
        assert cls.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(ValueError, match="q must be in"):
        _round(DDGaussRound, q=0.0)
    with pytest.raises(ValueError, match="beta must be in"):
        _round(SkellamRound, beta=1.0)


def test_ledger_round_trip_and_composition():
    """Rounds of both kinds through ``Ledger.to_dict``/``from_dict`` (and JSON): the ``rdp`` accountant gives the
    sum of their RDP curves, converted by dp-accounting's conversion."""
    led = Ledger()
    releases = [
        _round(DDGaussRound, 1),
        _round(DDGaussRound, 2, shares=90.0),
        _round(SkellamRound, 3),
        _round(SkellamRound, 3, q=0.02),
        _round(DDGaussRound, 4, bits=12, beta=0.0),
    ]
    for r in releases:
        led.record(round=r.round, mechanism=r)
    direct = dd.epsilon_from_rdp(RDP_ORDERS, sum(r.rdp() for r in releases), DELTA)[0]
    assert led.epsilon(DELTA, "rdp") == pytest.approx(direct, rel=1e-12)
    loaded = Ledger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert [r.mechanism for r in loaded.releases] == releases
    assert loaded.epsilon(DELTA, "rdp") == pytest.approx(direct, rel=1e-12)
    with pytest.raises(PrivacyInputError, match="UnsupportedDpEvent"):
        led.epsilon(DELTA, "pld")


def test_ledger_mixing_gaussian_mechanisms():
    """A ledger mixing discrete rounds with Gaussian Mechanisms adds the mechanisms' RDP at the same integer orders
    (dp-accounting's RdpAccountant); a ledger of Gaussian Mechanisms alone keeps dp-accounting's default orders."""
    gauss = Mechanism(population=1000, sampling="poisson", sampling_rate=0.05, noise_multiplier=1.1)
    alone = Ledger()
    for t in (1, 2, 3):
        alone.record(round=t, mechanism=gauss)
    default = rdp_privacy_accountant.RdpAccountant()
    default.compose(gauss.to_dp_event("add-remove"), 3)
    assert alone.epsilon(DELTA, "rdp") == pytest.approx(default.get_epsilon(DELTA), rel=1e-12)

    mixed, discrete = Ledger(), _round(DDGaussRound, 1)
    for t in (1, 2, 3):
        mixed.record(round=t, mechanism=gauss)
    mixed.record(round=3, mechanism=discrete)
    acc = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    acc.compose(gauss.to_dp_event("add-remove"), 3)
    expected = dd.epsilon_from_rdp(RDP_ORDERS, acc.rdp + discrete.rdp(), DELTA)[0]
    assert mixed.epsilon(DELTA, "rdp") == pytest.approx(expected, rel=1e-12)

    fixed = Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0)
    mixed.record(round=4, mechanism=fixed)
    with pytest.raises(PrivacyInputError, match="replace-one"):
        mixed.epsilon(DELTA, "rdp")


def test_not_private_without_noise():
    silent = DDGaussRound(
        round=1, q=0.01, clip=1.0, gamma=1e-3, local_std_grid=0.0, shares=100.0, dim=2**16, beta=0.0, bits=16
    )
    assert not silent.private and np.all(np.isinf(silent.rdp()))
    led = Ledger()
    led.record(round=1, mechanism=silent)
    assert led.epsilon(DELTA, "rdp") == math.inf


@pytest.mark.parametrize("cls", [DDGaussRound, SkellamRound])
def test_more_shares_less_epsilon(cls):
    """Fewer dropouts, more noise shares in the sum: a smaller epsilon, for the same local noise."""
    eps = [_round(cls, shares=s).epsilon(DELTA) for s in (50.0, 75.0, 90.0, 100.0)]
    assert all(later < earlier for earlier, later in itertools.pairwise(eps))


def test_conditional_rounding_inflates_less_at_12_bits():
    """At 12 bits plain randomized rounding (beta = 0) inflates the sensitivity by about 3x (the reference's figure
    for n = 100-1000, d = 2^20), conditional rounding (beta = exp(-0.5)) by far less, and the epsilon follows."""
    for cls in (DDGaussRound, SkellamRound):
        plain = _round(cls, bits=12, beta=0.0, dim=2**20)
        conditional = _round(cls, bits=12, beta=math.exp(-0.5), dim=2**20)
        grid_clip = plain.clip / plain.gamma
        assert 2.5 < plain.l2_sensitivity / grid_clip < 3.5
        assert 1.0 < conditional.l2_sensitivity / grid_clip < 1.5
        assert conditional.epsilon(DELTA) < plain.epsilon(DELTA)
