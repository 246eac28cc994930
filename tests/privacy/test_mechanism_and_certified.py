import dataclasses
import math

import numpy as np
import pytest
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from scipy.stats import norm

from fedsim.privacy import (
    ACCOUNTANTS,
    Mechanism,
    PrivacyInputError,
    compose_same_cohort,
    compute_curve,
    epsilon_curve,
)
from fedsim.privacy.accountants import epsilon_at
from fedsim.privacy.gaussian import gaussian_delta, gaussian_epsilon


def exact_gaussian_delta(eps, r):
    """Balle and Wang (2018), computed independently with scipy.stats."""
    return norm.cdf(r / 2 - eps / r) - math.exp(eps) * norm.cdf(-r / 2 - eps / r)


def test_api_example_and_properties():
    m = Mechanism(
        population=90,
        sampling="poisson",
        sampling_rate=0.1,
        clip=1.0,
        noise_multiplier=1.0,
        noise_placement="central",
    )
    assert m.q == 0.1 and math.isclose(m.expected_cohort, 9.0)
    assert m.neighbouring == "add-remove" and m.sensitivity == 1.0 and m.noise_std == 1.0
    assert isinstance(m.to_dp_event(), dp_event.PoissonSampledDpEvent)
    assert m.igmm_params() == dict(N=90, tau=9.0, sigma=1.0 / 9.0, D=2.0)
    f = Mechanism(population=90, sampling="fixed", clients_per_round=9, clip=0.5, noise_multiplier=2.0)
    assert f.neighbouring == "replace-one" and f.sensitivity == 1.0 and f.noise_std == 1.0
    ev = f.to_dp_event()
    assert isinstance(ev, dp_event.SampledWithoutReplacementDpEvent) and ev.event.noise_multiplier == 1.0
    a = Mechanism(population=5, sampling="all", noise_multiplier=3.0)
    assert a.q == 1.0 and a.expected_cohort == 5 and isinstance(a.to_dp_event(), dp_event.GaussianDpEvent)
    m2 = m.replace(clip=2.0)
    assert m2.clip == 2.0 and m2.noise_std == 2.0 and m.clip == 1.0
    assert Mechanism(population=90, clients_per_round=9).q == pytest.approx(0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.clip = 3.0  # frozen


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(sampling_rate=1.5), "sampling_rate"),
        (dict(sampling_rate=0.1, clip=0.0, noise_multiplier=1.0), "clip"),
        (dict(sampling_rate=0.1, noise_multiplier=-1.0), "noise_multiplier"),
        (dict(sampling_rate=0.1, clip=0.0), "clip"),
        (dict(sampling_rate=0.1, clip=float("nan")), "clip"),
        (dict(), "sampling_rate/clients_per_round"),
        (dict(sampling_rate=0.1, clients_per_round=9), "sampling_rate/clients_per_round"),
        (dict(sampling="uniform", sampling_rate=0.1), "sampling"),
        (dict(sampling="fixed", clients_per_round=91), "clients_per_round"),
        (dict(sampling="fixed", sampling_rate=0.105), "sampling_rate"),
        (dict(sampling="all", sampling_rate=0.5), "sampling_rate"),
        (dict(sampling_rate=0.1, noise_placement="local"), "noise_placement"),
    ],
)
def test_invalid_mechanism(kwargs, field):
    with pytest.raises(PrivacyInputError) as ei:
        Mechanism(population=90, **kwargs)
    assert ei.value.field == field and field.split("/")[0] in str(ei.value)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize(
    "bad", [dict(delta=0.0), dict(delta=1.0), dict(delta=-1e-5), dict(rounds=0), dict(method="moments")]
)
def test_invalid_accounting_inputs(bad):
    m = Mechanism(population=100, sampling_rate=0.1)
    kw = dict(rounds=5, delta=1e-5, method="rdp")
    kw.update(bad)
    with pytest.raises(PrivacyInputError):
        epsilon_curve(m, **kw)


def test_compose_same_cohort_z_eff():
    m = Mechanism(population=100, sampling_rate=0.1, noise_multiplier=1.0)
    c = Mechanism(population=100, sampling_rate=0.1, noise_multiplier=2.0, clip=1.0)
    comb = compose_same_cohort([m, c])
    assert comb.normalized_noise == pytest.approx((1.0 + 0.25) ** -0.5)
    # a Gaussian pair is exactly one Gaussian: ratios add in quadrature
    r = math.hypot(1.0, 0.5)
    assert gaussian_delta(1.0, r) == pytest.approx(
        exact_gaussian_delta(1.0, 1.0 / comb.normalized_noise), rel=1e-9
    )
    with pytest.raises(PrivacyInputError):
        compose_same_cohort([m, m.replace(sampling_rate=0.2)])


def test_gaussian_profile_and_inverse():
    for r in (0.1, 0.5, 1.0, 2.0):
        for eps in (0.0, 0.5, 1.0, 3.0):
            assert float(gaussian_delta(eps, r)) == pytest.approx(
                exact_gaussian_delta(eps, r), rel=1e-7, abs=1e-300
            )
        for d in (1e-3, 1e-5, 1e-10):
            e = gaussian_epsilon(d, r)
            assert float(gaussian_delta(e, r)) <= d * (1 + 1e-9)
            assert float(gaussian_delta(e * (1 - 1e-6) - 1e-12, r)) > d * (1 - 1e-6)
    # mu = 1 GDP: delta(eps = 1)
    assert float(gaussian_delta(1.0, 1.0)) == pytest.approx(0.126936, abs=1e-6)


# sheet: reference vectors (add/remove, Poisson)
@pytest.mark.parametrize(
    "q, z, T, delta, ref",
    [
        (0.01, 1.1, 10000, 1e-5, 5.632),
        (0.04, 1.5, 2250, 1e-5, 7.32911117143),
        (0.0025, 1.3, 6000, 1e-5, 0.7242234026),
        (0.001, 1.0, 30000, 1e-7, 1.4154988495),
    ],
)
def test_rdp_reference_vectors(q, z, T, delta, ref):
    m = Mechanism(population=10**6, sampling_rate=q, noise_multiplier=z)
    assert epsilon_at(m, T, delta, "rdp") == pytest.approx(ref, abs=1e-3 if ref == 5.632 else 5e-4)


def test_pld_reference_vectors():
    m = Mechanism(population=10**6, sampling_rate=0.01, noise_multiplier=1.1)
    assert 5.19 <= epsilon_at(m, 10000, 1e-5, "pld") <= 5.21
    m = Mechanism(population=10**6, sampling_rate=0.04, noise_multiplier=1.5)
    assert epsilon_at(m, 2250, 1e-5, "pld") == pytest.approx(6.7774, rel=3e-3)


def test_exact_gaussian_checks():
    # no sampling, z = sqrt(3), T = 3: mu = 1 GDP, delta(1) = 0.126936
    a = Mechanism(population=10, sampling="all", noise_multiplier=math.sqrt(3))
    assert epsilon_at(a, 3, 0.126936, "pld") == pytest.approx(1.0, abs=2e-3)
    assert epsilon_at(a, 3, 0.126936, "rdp") >= 1.0
    # q = 0.2, z = 0.5, T = 3: delta(1) = 0.15594
    p = Mechanism(population=1000, sampling_rate=0.2, noise_multiplier=0.5)
    assert epsilon_at(p, 3, 0.15594, "pld") == pytest.approx(1.0, abs=5e-3)


@pytest.mark.parametrize("z, T", [(2.0, 1), (4.0, 4), (1.0, 3)])
def test_fixed_everyone_equals_gaussian_with_sensitivity_2clip(z, T):
    """Settles dp-accounting's replace-one noise convention: tau = N is the Gaussian with sensitivity 2*clip."""
    clip = 0.7
    f = Mechanism(population=20, sampling="fixed", clients_per_round=20, clip=clip, noise_multiplier=z)
    r_total = (2 * clip) / (z * clip) * math.sqrt(T)  # T Gaussians compose into one with ratio r*sqrt(T)
    delta = 1e-5
    exact = float(gaussian_epsilon(delta, r_total))
    assert exact_gaussian_delta(exact, r_total) == pytest.approx(delta, rel=1e-6)
    assert epsilon_at(f, T, delta, "pld") == pytest.approx(exact, rel=2e-3, abs=2e-3)
    assert epsilon_at(f, T, delta, "pld") >= exact - 1e-9
    # RDP of the WOR event at tau = N is exactly the Gaussian RDP with ratio 2/z (dp-accounting, public API)
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.GaussianDpEvent(z / 2.0), T)
    assert epsilon_at(f, T, delta, "rdp") == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    assert epsilon_at(f, T, delta, "rdp") >= exact


def test_rdp_curve_is_the_library_at_its_checkpoints_and_above_it_between():
    m = Mechanism(population=1000, sampling="fixed", clients_per_round=50, noise_multiplier=1.3)
    c = compute_curve(m, 60, 1e-6, "rdp", exact_at=(33,))
    curve = c.epsilon
    assert c.exact[:10].all() and c.exact[59] and c.exact[32] and not c.exact.all()
    for t in (1, 7, 33, 34, 60):
        acc = rdp.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(m.to_dp_event(), t)
        if c.exact[t - 1]:
            assert curve[t - 1] == pytest.approx(acc.get_epsilon(1e-6), rel=1e-12)
        else:
            assert curve[t - 1] >= acc.get_epsilon(1e-6)


def test_fixed_pld_below_rdp_and_poisson_relation():
    f = Mechanism(population=1000, sampling="fixed", clients_per_round=100, noise_multiplier=2.0)
    assert epsilon_at(f, 50, 1e-5, "pld") <= epsilon_at(f, 50, 1e-5, "rdp")


@pytest.mark.parametrize("method", [m for m in ACCOUNTANTS if m not in ("igmm", "dp-fl-thm8")])
def test_monotone_in_rounds_and_noise(method):
    m = Mechanism(population=1000, sampling_rate=0.05, noise_multiplier=1.2)
    c = epsilon_curve(m, 120, 1e-5, method)
    assert np.all(np.isfinite(c)) and np.all(np.diff(c) >= -1e-9)
    c2 = epsilon_curve(m.replace(noise_multiplier=2.0), 120, 1e-5, method)
    assert np.all(c2 <= c + 1e-9)


def test_certified_ordering():
    m = Mechanism(population=1000, sampling_rate=0.05, noise_multiplier=1.2)
    pld = epsilon_curve(m, 100, 1e-5, "pld")
    for method in ("rdp", "kairouz", "basic"):
        assert np.all(epsilon_curve(m, 100, 1e-5, method) >= pld * (1 - 1e-5))
    f = Mechanism(population=1000, sampling="fixed", clients_per_round=50, noise_multiplier=1.2)
    assert np.all(epsilon_curve(f, 100, 1e-5, "igmm-corrected") >= epsilon_curve(f, 100, 1e-5, "pld") - 1e-6)


def test_pld_checkpoints_are_upper_bounds():
    m = Mechanism(population=1000, sampling_rate=0.02, noise_multiplier=1.0)
    c = compute_curve(m, 150, 1e-5, "pld")
    assert not c.exact.all() and c.exact[:50].all()
    for t in (51, 77, 149):
        assert c.epsilon[t - 1] >= epsilon_at(m, t, 1e-5, "pld") - 1e-9
