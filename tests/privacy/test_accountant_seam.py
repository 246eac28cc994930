"""An accountant added from outside the package (issue 22): defined here, registered with register_accountant, it is
used by the ledger, compute_curve, the live CERTIFIED / VALID_BOUNDS views and a scenario run, touching no
fedsim file."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.privacy import (
    ACCOUNTANTS,
    CERTIFIED,
    PAPER_BOUNDS,
    VALID_BOUNDS,
    Ledger,
    Mechanism,
    PrivacyInputError,
    certified_methods,
    compose_same_cohort,
    compute_curve,
    register_accountant,
)
from fedsim.privacy.accountants import (
    CERTIFIED_KIND,
    VALID_BOUND_KIND,
    Accountant,
    CurveQuery,
    CurveResult,
    validate_method,
)

DELTA = 1e-5
#: another order grid than dp-accounting's default (which starts at 1.25 and stops at 512)
ORDERS = [1.0 + x / 8.0 for x in range(1, 80)] + list(range(11, 129))
POISSON = Mechanism(population=1000, sampling="poisson", sampling_rate=0.05, noise_multiplier=1.1)
FIXED = Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0)
EVERYONE = Mechanism(population=100, sampling="all", noise_multiplier=2.0)


def _rdp(events, relation: str, delta: float) -> float:
    """dp-accounting's RdpAccountant on ORDERS composing ``events`` ((event, count) pairs) under ``relation``."""
    from dp_accounting import privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    rel = {
        "add-remove": privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace-one": privacy_accountant.NeighboringRelation.REPLACE_ONE,
    }[relation]
    acc = rdp_privacy_accountant.RdpAccountant(orders=ORDERS, neighboring_relation=rel)
    for event, count in events:
        acc.compose(event, count)
    return float(acc.get_epsilon(delta))


def _coarse_rdp_curve(q: CurveQuery) -> CurveResult:
    event = q.m.to_dp_event()
    eps = np.array([_rdp([(event, int(t))], q.m.neighbouring, q.delta) for t in q.T])
    q.notes.append(f"RDP on {len(ORDERS)} orders")
    return CurveResult(eps, np.full(len(q.T), q.delta))


def _coarse_rdp_of_ledger(rounds, relation: str, delta: float) -> float:
    return _rdp([(r.to_dp_event(relation), 1) for events in rounds for r in events], relation, delta)


COARSE_RDP = Accountant(
    "test-rdp-orders",
    CERTIFIED_KIND,
    "Renyi DP (dp-accounting) on another order grid, certified",
    _coarse_rdp_curve,
    _coarse_rdp_of_ledger,
    accepts_any_event=True,
)


def _twice_basic_curve(q: CurveQuery) -> CurveResult:
    basic = ACCOUNTANTS["basic"].curve(q)
    return CurveResult(2.0 * np.asarray(basic.epsilon), basic.delta)


TWICE_BASIC = Accountant(
    "test-twice-basic",
    VALID_BOUND_KIND,
    "twice basic composition; valid closed-form bound",
    _twice_basic_curve,
)


@pytest.fixture
def registered():
    for acc in (COARSE_RDP, TWICE_BASIC):
        register_accountant(acc)
    yield
    for acc in (COARSE_RDP, TWICE_BASIC):
        ACCOUNTANTS.pop(acc.name, None)


def test_registering_shows_in_the_live_views_and_refuses_duplicates(registered):
    assert "test-rdp-orders" in CERTIFIED and "test-rdp-orders" in certified_methods()
    assert "test-twice-basic" in VALID_BOUNDS and "test-twice-basic" not in CERTIFIED | PAPER_BOUNDS
    assert set(CERTIFIED) == {"pld", "rdp", "test-rdp-orders"}
    assert {"pld", "rdp", "test-rdp-orders"} == CERTIFIED  # a live view compares as a set
    assert validate_method("test-rdp-orders", "privacy.accountant", kind=CERTIFIED_KIND) == "test-rdp-orders"
    with pytest.raises(PrivacyInputError, match="must be one of pld, rdp, test-rdp-orders"):
        validate_method("test-twice-basic", "privacy.accountant", kind=CERTIFIED_KIND)
    register_accountant(COARSE_RDP)  # the same entry again: nothing to do
    other = Accountant("test-rdp-orders", CERTIFIED_KIND, "another", _coarse_rdp_curve, _coarse_rdp_of_ledger)
    with pytest.raises(ValueError, match="registered already"):
        register_accountant(other)
    with pytest.raises(ValueError, match="registered already"):
        register_accountant(Accountant("pld", CERTIFIED_KIND, "not pld", _coarse_rdp_curve))
    with pytest.raises(ValueError, match="kind"):
        register_accountant(Accountant("test-bad", "approximately right", "?", _coarse_rdp_curve))
    with pytest.raises(TypeError):
        register_accountant("test-rdp-orders")
    assert register_accountant(other, replace=True) is other and ACCOUNTANTS["test-rdp-orders"] is other


def test_the_ledger_and_compute_curve_use_a_registered_accountant(registered):
    ledger = Ledger()  # made before it is used: the accountant's state is made on first use
    count = POISSON.replace(noise_multiplier=4.0)  # a second release on the round's cohort
    one_round = compose_same_cohort([POISSON, count]).to_dp_event()
    for t in range(1, 6):
        ledger.record(round=t, mechanism=POISSON)
        ledger.record(round=t, mechanism=count, name="count")
        assert ledger.epsilon(DELTA, "test-rdp-orders") == _rdp([(one_round, 1)] * t, "add-remove", DELTA)
    assert ledger.epsilon(DELTA, "test-rdp-orders") != ledger.epsilon(DELTA, "rdp")  # its own orders
    fixed = Ledger()
    fixed.record(round=1, mechanism=FIXED)
    fixed.record(round=2, mechanism=EVERYONE)
    assert fixed.epsilon(DELTA, "test-rdp-orders") == _rdp(
        [(FIXED.to_dp_event("replace-one"), 1), (EVERYONE.to_dp_event("replace-one"), 1)],
        "replace-one",
        DELTA,
    )

    curve = compute_curve(POISSON, 12, DELTA, "test-rdp-orders")
    assert curve.certified and curve.notes[-1] == f"RDP on {len(ORDERS)} orders"
    assert curve.epsilon.tolist() == [
        _rdp([(POISSON.to_dp_event(), t)], "add-remove", DELTA) for t in range(1, 13)
    ]

    # a closed form: the same single mechanism every round, else it says which accountants compose a ledger
    same = Ledger()
    for t in range(1, 9):
        same.record(round=t, mechanism=POISSON)
    twice = compute_curve(POISSON, 8, DELTA, "test-twice-basic")
    assert not twice.certified
    assert same.epsilon(DELTA, "test-twice-basic") == twice.epsilon[-1]
    assert twice.epsilon[-1] == 2.0 * compute_curve(POISSON, 8, DELTA, "basic").epsilon[-1]
    with pytest.raises(PrivacyInputError, match=r"same single mechanism.*test-rdp-orders"):
        fixed.epsilon(DELTA, "test-twice-basic")


def test_a_scenario_runs_with_a_registered_accountant(registered):
    """Needs the scenario schema to take privacy.accountant from the registry at validation time."""
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    s = load_scenario("quickstart", ["rounds=2", "engine.name=local", "privacy.accountant=test-rdp-orders"])
    res = run_scenario(s, write=False)
    assert [row["accountant"] for row in res.rows] == ["test-rdp-orders"] * 2
    raw = res.strategy.ledger.to_dict()
    for row in res.rows:
        upto = {**raw, "releases": [r for r in raw["releases"] if r["round"] <= row["round"]]}
        ledger = Ledger.from_dict(upto)
        events = [(r.mechanism.to_dp_event(), 1) for r in ledger.releases]
        want = _rdp(events, "add-remove", row["delta"])
        assert row["epsilon"] == ledger.epsilon(row["delta"], "test-rdp-orders") == want
        assert math.isfinite(row["epsilon"])
