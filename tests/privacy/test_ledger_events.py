"""The ledger records any release that knows its dp-accounting event (issue 22): a whole-run event defined here,
outside the package, is composed by dp-accounting's own accountants, saved with its kind and loaded back; a
ledger of per-round Mechanisms is saved and accounted exactly as before."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fedsim.privacy import RELEASE_KINDS, Ledger, Mechanism, PrivacyInputError, register_release_kind
from fedsim.privacy.certified import PldLedgerAccountant

DELTA = 1e-5
POISSON = Mechanism(population=1000, sampling="poisson", sampling_rate=0.05, noise_multiplier=1.1)
FIXED = Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0)
BEFORE = Path(
    "/tmp/seam/before/quickstart"
)  # a real run's directory, written before the ledger took any event


@dataclasses.dataclass(frozen=True)
class WholeRunGaussian:
    """A toy whole-run release: ``rounds`` Gaussian releases of noise multiplier ``z`` (sensitivity 1), accounted
    as one event over the run (as a matrix-factorization mechanism would be)."""

    kind = "test-whole-run-gaussian"
    z: float
    rounds: int
    neighbouring: str = "add-remove"

    @property
    def private(self) -> bool:
        return self.z > 0

    def to_dp_event(self, relation: str | None = None):
        from dp_accounting import dp_event

        return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(self.z), self.rounds)

    def to_dict(self) -> dict:
        return dict(z=self.z, rounds=self.rounds)

    @classmethod
    def from_dict(cls, d: dict) -> WholeRunGaussian:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class EventRelease:
    """Any dp-accounting event as a release (to probe what each accountant supports)."""

    kind = "test-event"
    name: str

    neighbouring = "add-remove"
    private = True

    def to_dp_event(self, relation: str | None = None):
        from dp_accounting import dp_event

        return {
            "mixture": dp_event.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.5, 0.5]),  # pld only
            "unsupported": dp_event.UnsupportedDpEvent(),
            "composed": dp_event.ComposedDpEvent(
                [dp_event.GaussianDpEvent(2.0), dp_event.GaussianDpEvent(3.0)]
            ),
        }[self.name]

    def to_dict(self) -> dict:
        return dict(name=self.name)

    @classmethod
    def from_dict(cls, d: dict) -> EventRelease:
        return cls(**d)


@pytest.fixture(autouse=True)
def kinds():
    register_release_kind(WholeRunGaussian)
    register_release_kind(EventRelease)
    yield
    RELEASE_KINDS.pop(WholeRunGaussian.kind, None)
    RELEASE_KINDS.pop(EventRelease.kind, None)


def _dp_accounting(event, method: str, discretization: float = 1e-3) -> float:
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    if method == "pld":
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    else:
        acc = rdp_privacy_accountant.RdpAccountant()
    return float(acc.compose(event).get_epsilon(DELTA))


@pytest.mark.parametrize("method", ["pld", "rdp"])
def test_a_whole_run_event_is_dp_accountings_epsilon_of_that_event(method):
    run = WholeRunGaussian(z=4.0, rounds=50)
    ledger = Ledger()
    ledger.record(round=1, mechanism=run, name="mf")
    want = _dp_accounting(run.to_dp_event(), method, ledger.pld_discretization)
    assert ledger.epsilon(DELTA, method) == want
    # a composed event (unhashable in dp-accounting: it holds a list) goes the same way
    composed = EventRelease("composed")
    other = Ledger()
    other.record(round=1, mechanism=composed)
    assert other.epsilon(DELTA, method) == pytest.approx(
        _dp_accounting(composed.to_dp_event(), method, other.pld_discretization), rel=1e-12
    )


def test_a_ledger_with_a_custom_kind_saves_its_kind_and_loads_back(tmp_path):
    ledger = Ledger()
    ledger.record(round=1, mechanism=POISSON)
    ledger.record(round=1, mechanism=WholeRunGaussian(z=5.0, rounds=20), name="mf")
    ledger.record(round=2, mechanism=POISSON)
    d = ledger.to_dict()
    assert d["releases"][0] == {"round": 1, "name": "model", "mechanism": POISSON.to_dict()}  # no kind key
    assert d["releases"][1] == {
        "round": 1,
        "name": "mf",
        "kind": "test-whole-run-gaussian",
        "mechanism": {"z": 5.0, "rounds": 20},
    }
    ledger.save(tmp_path / "ledger.json")
    back = Ledger.load(tmp_path / "ledger.json")
    assert back.to_dict() == d
    assert [r.kind for r in back.releases] == ["mechanism", "test-whole-run-gaussian", "mechanism"]
    for method in ("pld", "rdp"):
        assert back.epsilon(DELTA, method) == ledger.epsilon(DELTA, method)
    RELEASE_KINDS.pop(WholeRunGaussian.kind)  # a reader that does not know the kind says what to do
    with pytest.raises(PrivacyInputError, match="register_release_kind"):
        Ledger.load(tmp_path / "ledger.json")


def test_per_round_mechanisms_and_a_whole_run_event_compose():
    from dp_accounting import dp_event

    run = WholeRunGaussian(z=6.0, rounds=30)
    ledger, mechs_only = Ledger(), Ledger()
    for t in range(1, 11):
        ledger.record(round=t, mechanism=POISSON)
        mechs_only.record(round=t, mechanism=POISSON)
        if t == 3:
            ledger.record(round=t, mechanism=run, name="mf")
    events = [POISSON.to_dp_event()] * 10 + [run.to_dp_event()]
    everything = dp_event.ComposedDpEvent(events)
    # rdp: dp-accounting's RdpAccountant over every event (identical events counted: the same sum)
    assert ledger.epsilon(DELTA, "rdp") == pytest.approx(_dp_accounting(everything, "rdp"), rel=1e-9)
    # pld: the rounds' PLDs (as fedsim privacy builds them) composed with the event's, so dp-accounting's
    # PLDAccountant on all events agrees up to the order of composition
    eps = ledger.epsilon(DELTA, "pld")
    assert eps == pytest.approx(_dp_accounting(everything, "pld"), rel=1e-6)
    assert eps > max(mechs_only.epsilon(DELTA), _dp_accounting(run.to_dp_event(), "pld"))
    # incremental: one more round reuses the cached composition and equals a fresh ledger's answer
    ledger.record(round=11, mechanism=POISSON)
    assert ledger.epsilon(DELTA) == pytest.approx(
        Ledger.from_dict(ledger.to_dict()).epsilon(DELTA), rel=1e-12
    )
    # what-if queries take any release too
    assert ledger.epsilon_with([run], DELTA) > ledger.epsilon(DELTA)
    assert ledger.would_exceed(POISSON, ledger.epsilon(DELTA) * 1.001, DELTA, releases=[run])


def test_unsupported_combinations_are_one_line_privacy_input_errors():
    ledger = Ledger()
    ledger.record(round=1, mechanism=POISSON)
    ledger.record(round=2, mechanism=EventRelease("mixture"))
    assert math.isfinite(ledger.epsilon(DELTA, "pld"))  # the PLD accountant composes a mixture of Gaussians
    with pytest.raises(PrivacyInputError, match=r"MixtureOfGaussiansDpEvent.*RdpAccountant composes") as exc:
        ledger.epsilon(DELTA, "rdp")
    assert "\n" not in str(exc.value) and "try method='pld'" in str(exc.value)

    unsupported = Ledger()
    unsupported.record(round=1, mechanism=EventRelease("unsupported"))
    with pytest.raises(PrivacyInputError, match=r"UnsupportedDpEvent.*PLDAccountant composes") as exc:
        unsupported.epsilon(DELTA, "pld")
    assert "\n" not in str(exc.value)

    whole = Ledger()
    whole.record(round=1, mechanism=WholeRunGaussian(z=4.0, rounds=10))
    for closed_form in ("basic", "kairouz", "igmm-corrected", "igmm"):
        with pytest.raises(
            PrivacyInputError, match=r"per-round Mechanisms only.*WholeRunGaussian.*use pld or rdp"
        ):
            whole.epsilon(DELTA, closed_form)

    with pytest.raises(PrivacyInputError, match="Mechanism or a DP release"):
        whole.record(round=2, mechanism=object())

    @dataclasses.dataclass(frozen=True)
    class Unregistered(WholeRunGaussian):
        kind = "not-registered"

    with pytest.raises(PrivacyInputError, match="register_release_kind"):
        whole.record(round=2, mechanism=Unregistered(z=1.0, rounds=2))
    with pytest.raises(ValueError, match="registered already"):
        register_release_kind(type("Other", (WholeRunGaussian,), {}))  # the same kind, another class


def test_a_release_that_is_not_noised_makes_epsilon_infinite():
    ledger = Ledger()
    ledger.record(round=1, mechanism=POISSON)
    ledger.record(round=1, mechanism=WholeRunGaussian(z=0.0, rounds=10))
    assert not ledger.private
    assert ledger.epsilon(DELTA) == math.inf == ledger.epsilon(DELTA, "rdp")


def test_the_pld_cache_and_fallback_belong_to_the_pld_accountant():
    ledger = Ledger()
    for t in range(1, 4):
        ledger.record(round=t, mechanism=FIXED)
    eps = ledger.epsilon(DELTA)
    state = ledger.accountant("pld")
    assert isinstance(state, PldLedgerAccountant) and state.discretization == ledger.pld_discretization
    assert state.epsilon([(FIXED,)] * 3, "replace-one", DELTA) == eps  # the ledger only hands it rounds
    assert ledger.pld_fallback is None and state.fallback is None
    tiny = Ledger()
    tiny.record(round=1, mechanism=Mechanism(population=1000, sampling="all", noise_multiplier=0.005))
    with pytest.warns(RuntimeWarning, match="RDP"):
        tiny.epsilon(DELTA)
    assert tiny.pld_fallback == tiny.accountant("pld").fallback and "0.005" in tiny.pld_fallback


def test_a_ledger_of_mechanisms_is_saved_exactly_as_before():
    ledger = Ledger()
    ledger.record(round=1, mechanism=POISSON)
    ledger.record(round=1, mechanism=POISSON.replace(clip=1.0, noise_multiplier=5.0), name="clip-count")
    assert ledger.to_dict() == {
        "format": "fedsim.privacy.ledger/1",
        "pld_discretization": 0.001,
        "releases": [
            {"round": 1, "name": "model", "mechanism": POISSON.to_dict()},
            {"round": 1, "name": "clip-count", "mechanism": {**POISSON.to_dict(), "noise_multiplier": 5.0}},
        ],
    }
    assert list(POISSON.to_dict()) == [
        "population",
        "sampling",
        "sampling_rate",
        "clients_per_round",
        "clip",
        "noise_multiplier",
        "noise_placement",
        "diameter",
    ]


@pytest.mark.skipif(not (BEFORE / "ledger.json").exists(), reason="needs the run made before issue 22")
def test_a_ledger_written_before_loads_writes_the_same_bytes_and_gives_the_same_epsilon():
    text = (BEFORE / "ledger.json").read_text()
    ledger = Ledger.load(BEFORE / "ledger.json")
    assert json.dumps(ledger.to_dict(), indent=2) + "\n" == text  # the run directory's writer: indent 2
    rows = [json.loads(line) for line in (BEFORE / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert ledger.epsilon(rows[-1]["delta"], rows[-1]["accountant"]) == rows[-1]["epsilon"]
    raw = json.loads(text)
    for row in rows:  # every round's epsilon, from the ledger as it stood then
        upto = {**raw, "releases": [r for r in raw["releases"] if r["round"] <= row["round"]]}
        assert Ledger.from_dict(upto).epsilon(row["delta"], row["accountant"]) == row["epsilon"]
