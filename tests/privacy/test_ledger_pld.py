"""The ledger's PLD accounting: dp-accounting's own composition, cached round by round, and its fallback."""

import math

import pytest

from fedsim.privacy import certified
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.mechanism import Mechanism

MECHS = [
    Mechanism(population=1000, sampling="poisson", sampling_rate=0.1, noise_multiplier=1.0),
    Mechanism(population=1000, sampling="poisson", sampling_rate=0.01, noise_multiplier=0.7),
    Mechanism(population=1000, sampling="all", noise_multiplier=3.0),
    Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0),
]


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
        assert eps == pytest.approx(want, rel=1e-12)  # the same dp-accounting composition, cached
    # a second release in the last round must not reuse the cached whole composition
    ledger.record(round=len(mixed) * 3, mechanism=MECHS[0], name="count")
    fresh = Ledger.from_dict(ledger.to_dict())
    assert ledger.epsilon(1e-5) == pytest.approx(fresh.epsilon(1e-5), rel=1e-12)


def ledger_relation_for(ledger):
    return certified.ledger_relation([r.mechanism for r in ledger.releases])


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
    """Runs account with the ledger's incremental, cached composition; ``fedsim privacy`` with compute_curve. Both
    compose dp-accounting's PLDs: one answer at every round."""
    from fedsim.privacy import Ledger, Mechanism, compute_curve

    m = Mechanism(population=100, **kw)
    rounds = 30
    cli = compute_curve(m, rounds, 1e-5, "pld", pld_exact_every_round=True).epsilon
    ledger = Ledger()
    for t in range(1, rounds + 1):
        ledger.record(t, m)
        run = ledger.epsilon(1e-5, "pld")
        assert run == pytest.approx(cli[t - 1], rel=1e-12), t


def test_a_composition_that_would_outgrow_memory_is_answered_with_rdp_before_it_is_built():
    small = Mechanism(population=1000, sampling="all", noise_multiplier=0.05)  # ~8e5 points a round: fits
    few, many = Ledger(), Ledger()
    for t in range(1, 11):
        few.record(round=t, mechanism=small)
    assert few.epsilon(1e-5) < few.epsilon(1e-5, "rdp") and few.pld_fallback is None
    for t in range(1, 401):  # 16 * 20 * sqrt(400) / 1e-3 = 6.4e6 points: over the limit
        many.record(round=t, mechanism=small)
    with pytest.warns(RuntimeWarning, match="RDP"):
        eps = many.epsilon(1e-5)
    assert "composing 400 releases" in many.pld_fallback and eps == many.epsilon(1e-5, "rdp")
