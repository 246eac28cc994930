"""fedsim.privacy.fast_pld against dp-accounting's own composition and epsilon search."""

import math

import numpy as np
import pytest

from fedsim.privacy import certified
from fedsim.privacy.fast_pld import DensePmf, FastPld, _truncate_tails
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.mechanism import Mechanism

MECHS = [
    Mechanism(population=1000, sampling="poisson", sampling_rate=0.1, noise_multiplier=1.0),
    Mechanism(population=1000, sampling="poisson", sampling_rate=0.01, noise_multiplier=0.7),
    Mechanism(population=1000, sampling="all", noise_multiplier=3.0),
    Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0),
]


@pytest.mark.parametrize("mech", MECHS, ids=lambda m: m.sampling)
def test_composition_and_epsilon_match_dp_accounting(mech):
    dp = certified.round_pld(mech)
    fast = FastPld.from_dp_accounting(dp)
    acc_dp, acc_fast = dp, fast
    for t in range(2, 25):
        acc_dp = acc_dp.compose(dp)
        acc_fast = acc_fast.compose(fast)
        if t % 6 == 0:
            for delta in (1e-2, 1e-5, 1e-9):
                want = acc_dp.get_epsilon_for_delta(delta)
                assert acc_fast.epsilon_for_delta(delta) == pytest.approx(want, rel=1e-10, abs=1e-12)
    # the composed mass arrays themselves agree
    rem = acc_dp._pmf_remove
    assert acc_fast.remove.lower_loss == rem._lower_loss
    np.testing.assert_allclose(acc_fast.remove.probs, rem._probs, rtol=1e-12, atol=1e-300)
    assert acc_fast.remove.infinity_mass == pytest.approx(rem._infinity_mass, rel=1e-12, abs=1e-300)


def test_epsilon_edge_cases_match_dp_accounting():
    from dp_accounting.pld import pld_pmf

    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        probs = rng.random(n) * (rng.random(n) < 0.7)
        inf = float(rng.choice([0.0, 1e-7, 1e-3, 0.2]))
        if probs.sum() == 0:
            probs[0] = 1.0
        probs = probs / probs.sum() * (1 - inf)
        disc = float(rng.choice([1e-3, 0.05, 1.0, 400.0]))  # 400: exp(-loss) underflows to 0
        lower = int(rng.integers(0 if disc > 1 else -30, 30))
        dp = pld_pmf.DensePLDPmf(disc, lower, probs.copy(), inf, True)
        ours = DensePmf(disc, lower, probs.copy(), inf)
        for delta in (0.0, 1e-8, 1e-4, 0.05, 0.5):
            want = dp.get_epsilon_for_delta(delta)
            got = ours.epsilon_for_delta(delta)
            if math.isinf(want):
                assert math.isinf(got), (trial, delta)
            else:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (trial, delta)


def test_tiny_noise_does_not_overflow_and_matches_dp_accounting():
    # z = 0.03 with every client each round: one round's PLD reaches losses below -709, where exp(-loss)
    # overflows; dp-accounting's search stops before reaching them, and ours must not be fooled by them
    import warnings

    mech = Mechanism(population=100, sampling="all", noise_multiplier=0.03)
    dp = certified.round_pld(mech)
    one = FastPld.from_dp_accounting(dp)
    assert one.remove.lower_loss * one.remove.discretization < -709
    two, dp_two = one.compose(one), dp.compose(dp)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [one.epsilon_for_delta(1e-5), two.epsilon_for_delta(1e-5)]
    want = [dp.get_epsilon_for_delta(1e-5), dp_two.get_epsilon_for_delta(1e-5)]
    assert got == pytest.approx(want, rel=1e-10)


def test_ledger_answers_with_rdp_when_a_pld_would_not_fit_in_memory():
    tiny = Mechanism(population=1000, sampling="all", noise_multiplier=0.005)  # ~4e7 PLD points a round
    ledger = Ledger()
    for t in range(1, 4):
        ledger.record(round=t, mechanism=tiny)
    with pytest.warns(RuntimeWarning, match="RDP"):
        eps = ledger.epsilon(1e-5)
    assert eps == ledger.epsilon(1e-5, "rdp") and math.isfinite(eps)
    assert "noise multiplier 0.005" in ledger.pld_fallback
    ok = Ledger()
    ok.record(round=1, mechanism=MECHS[0])
    ok.epsilon(1e-5)
    assert ok.pld_fallback is None


def test_truncation_matches_dp_accounting():
    from dp_accounting.pld import pld_pmf

    rng = np.random.default_rng(1)
    for _ in range(50):
        probs = rng.random(int(rng.integers(1, 60))) ** 8
        probs /= probs.sum()
        for tail in (0.0, 1e-15, 1e-3, 0.3):
            o1, p1, r1 = pld_pmf._truncate_tails(probs.copy(), tail, True)
            o2, p2, r2 = _truncate_tails(probs.copy(), tail)
            assert o1 == o2
            np.testing.assert_array_equal(p1, p2)
            assert r1 == pytest.approx(r2, rel=1e-15, abs=0)


def test_ledger_is_never_below_dp_accounting_and_reuses_its_composition():

    mixed = [MECHS[0], MECHS[0], MECHS[2], MECHS[0]]
    ledger = Ledger()
    ref = None
    for t, m in enumerate(mixed * 3, start=1):
        ledger.record(round=t, mechanism=m)
        p = certified.round_pld(m, ledger_relation_for(ledger))
        ref = p if ref is None else ref.compose(p)
        eps = ledger.epsilon(1e-5)
        want = ref.get_epsilon_for_delta(1e-5)
        assert want <= eps <= want * (1 + 1e-8)
    # a second release in the last round must not reuse the cached whole composition
    ledger.record(round=len(mixed) * 3, mechanism=MECHS[0], name="count")
    fresh = Ledger.from_dict(ledger.to_dict())
    assert ledger.epsilon(1e-5) == pytest.approx(fresh.epsilon(1e-5), rel=1e-12)


def ledger_relation_for(ledger):
    return certified.ledger_relation([r.mechanism for r in ledger.releases])


def test_optimistic_pmfs_are_refused():
    from dp_accounting.pld import pld_pmf

    with pytest.raises(ValueError, match="pessimistic"):
        DensePmf.from_dp_accounting(pld_pmf.DensePLDPmf(0.1, 0, np.array([1.0]), 0.0, False))


@pytest.mark.parametrize(
    "kw",
    [
        dict(sampling="poisson", sampling_rate=0.01, noise_multiplier=1.1),
        dict(sampling="poisson", sampling_rate=0.2, noise_multiplier=0.8),
        dict(sampling="fixed", clients_per_round=10, noise_multiplier=1.5),
        dict(sampling="all", noise_multiplier=2.0),
    ],
)
def test_runs_and_the_cli_report_the_same_pld_epsilon_at_every_round(kw):
    """Runs account with the ledger's incremental PLD (fedsim.privacy.fast_pld); ``fedsim privacy`` with
    compute_curve (dp-accounting's PLD composed round by round). Two code paths, one answer."""
    from fedsim.privacy import Ledger, Mechanism, compute_curve

    m = Mechanism(population=100, **kw)
    rounds = 30
    cli = compute_curve(m, rounds, 1e-5, "pld", pld_exact_every_round=True).epsilon
    ledger = Ledger()
    for t in range(1, rounds + 1):
        ledger.record(t, m)
        run = ledger.epsilon(1e-5, "pld")
        assert run == pytest.approx(cli[t - 1], rel=1e-8), t
        assert run >= cli[t - 1]  # the run's value is rounded up, never below dp-accounting
