"""Canary clients (privacy.canaries): inserted like any client, and what they measure against the certified epsilon.

Calibration, with fixed seeds (each run: the digits MLP, every client every round, a few rounds, in process):
no noise gives a large estimate and a lower bound well above 1; a large noise multiplier keeps the lower bound
below the certified epsilon in every seed; a mechanism that adds a tenth of the noise its ledger records (a noise
source plugged in through the NoiseSource seam) is caught, its lower bound above the certified epsilon.
"""

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.round import NOISE_SOURCES, NoiseSource, register_noise_source
from fedsim.scenarios import ScenarioError, load_scenario

#: every client every round: each inserted canary takes part in every round
BASE = [
    "privacy.sampling=all",
    "privacy.sampling_rate=none",
    "engine.name=local",
    "engine.eval_every=1000",
    "engine.checkpoint_every=0",
]


def _run(*sets: str, rounds: int = 3, canaries: int = 100, tmp=None):
    scenario = load_scenario("quickstart", [*BASE, f"rounds={rounds}", f"privacy.canaries={canaries}", *sets])
    return run_scenario(scenario, tmp, write=tmp is not None)


def test_canaries_are_clients_of_the_population_the_accountant_counts(tmp_path):
    result = _run("privacy.noise_multiplier=1.0", tmp=tmp_path / "run")
    last = result.rows[-1]
    emp = last["empirical_privacy"]
    inserted, held_out = emp["canaries_inserted"], emp["canaries_held_out"]
    assert inserted + held_out == 200 and 70 < inserted < 130  # 200 fair coins
    # sampling 'all': every training client and every inserted canary, every round
    assert all(r["non_private"]["cohort"] == 90 + inserted for r in result.rows)
    # the ledger's population counts them (the accountant's population is what the sampler drew from)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert {rel["mechanism"]["population"] for rel in ledger["releases"]} == {90 + inserted}
    # the generalization statement is about the clients with data, not about the canaries
    assert last["generalization"]["population"] == 90
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["empirical_privacy"]["kind"].startswith("empirical estimates")
    assert summary["empirical_privacy"]["steinke_epsilon_lower_bound"] == emp["steinke_epsilon_lower_bound"]
    assert isinstance(summary["empirical_privacy"]["reading"], list)
    # the epsilon plot draws them beside the certified epsilon
    assert (tmp_path / "run" / "plots" / "epsilon.png").is_file()


#: what each figure can say at the run's canary count, beside it in every evaluated row and in summary.json
LIMITS = (
    "steinke_epsilon_ceiling",
    "andrew_epsilon_all_rounds_ci_low",
    "andrew_epsilon_all_rounds_ci_high",
    "andrew_resolution_all_rounds",
    "andrew_null_median_all_rounds",
    "andrew_epsilon_final_ci_low",
    "andrew_epsilon_final_ci_high",
    "andrew_resolution_final",
    "andrew_null_median_final",
)


def test_every_figure_comes_with_what_it_can_say_at_this_canary_count(tmp_path, monkeypatch):
    from fedsim.cli import describe_empirical
    from fedsim.privacy.empirical import one_run_ceiling
    from fedsim.report.rundir import RunWriter

    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])  # the epsilon plot is drawn below
    result = _run("privacy.noise_multiplier=1.0", rounds=2, tmp=tmp_path / "run")
    for row in (row for row in result.rows if "empirical_privacy" in row):  # the evaluated rows (the last)
        emp = row["empirical_privacy"]
        assert set(LIMITS) <= emp.keys()
        # the ceiling: this run's audit with every guess right, above the lower bound it caps
        m = emp["canaries_inserted"] + emp["canaries_held_out"]
        assert emp["steinke_epsilon_lower_bound"] <= emp["steinke_epsilon_ceiling"]
        assert emp["steinke_epsilon_ceiling"] <= one_run_ceiling(m, emp["delta"])["epsilon_lower_bound"]
        assert 2.5 < emp["steinke_epsilon_ceiling"] < 3.8  # 200 directions, 95%, five Bonferroni candidates
        for stat in ("all_rounds", "final"):
            low, est, high = (emp[f"andrew_epsilon_{stat}{s}"] for s in ("_ci_low", "", "_ci_high"))
            assert low <= est and (high is None or est <= high)
            assert 0 < emp[f"andrew_null_median_{stat}"] <= emp[f"andrew_resolution_{stat}"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["empirical_privacy"]
    last = result.rows[-1]
    assert {k: summary[k] for k in LIMITS} == {k: last["empirical_privacy"][k] for k in LIMITS}
    # certified 1-digit epsilons at z = 1 over 2 rounds are above a ~3 ceiling: the reading says what that means
    if last["epsilon"] > summary["steinke_epsilon_ceiling"]:
        assert any("cannot tell a broken mechanism" in line for line in summary["reading"])
    line = describe_empirical(last["empirical_privacy"])
    assert "ceiling" in line and "95% CI" in line and "resolution" in line
    # the epsilon plot: the ceiling as a dashed line, the estimate's interval as a band, its resolution dotted
    from fedsim.report import plots

    fig = plots.figure_epsilon(plots.read_run(tmp_path / "run"), from_ledger=False)
    texts = [t for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    texts += [t for lg in fig.legends for t in lg.get_texts()]
    legend = [" ".join(t.get_text().split()) for t in texts]  # labels are wrapped to the legend's width
    assert any(t.startswith("Steinke et al. ceiling") for t in legend), legend
    assert any("95% confidence interval" in t for t in legend), legend
    assert any(t.startswith("Andrew et al. resolution") for t in legend), legend
    plots.pyplot().close(fig)


def test_canaries_submit_as_the_partial_sum_adds_them_one_by_one():
    from fedsim.privacy.canaries import CanaryClients
    from fedsim.round import PartialSum

    canaries = CanaryClients(300, 50, 3, 1000, 1e-5)
    cids = canaries.ids[::2]
    one_by_one, at_once = PartialSum(50), PartialSum(50)
    norms = [one_by_one.add(canaries.update(int(c), 0.7), 0.7) for c in cids]
    got = canaries.submit(at_once, cids, 0.7, block=16)
    np.testing.assert_allclose(got, norms, rtol=1e-15)
    np.testing.assert_allclose(at_once.total, one_by_one.total, rtol=1e-12, atol=1e-15)
    assert (at_once.count, at_once.unclipped, at_once.rejected) == (
        one_by_one.count,
        one_by_one.unclipped,
        one_by_one.rejected,
    )
    np.testing.assert_allclose(at_once.norms, one_by_one.norms, rtol=1e-15)
    with pytest.raises(KeyError):
        canaries.updates(np.array([canaries.ids[-1] + 1]), 1.0)


def test_the_same_seed_gives_the_same_canaries_and_scores():
    a, b = (_run("privacy.noise_multiplier=1.0", rounds=2) for _ in range(2))
    assert a.rows[-1]["empirical_privacy"] == b.rows[-1]["empirical_privacy"]
    np.testing.assert_array_equal(a.weights, b.weights)


def test_without_noise_the_canaries_are_found():
    result = _run("privacy.noise_multiplier=0")
    emp = result.rows[-1]["empirical_privacy"]
    assert result.rows[-1]["epsilon"] == float("inf")
    assert emp["steinke_epsilon_lower_bound"] > 2.0  # well above 1: every guess right
    assert emp["steinke_correct"] >= 0.95 * emp["steinke_guesses"]
    assert emp["andrew_epsilon_all_rounds"] is None or emp["andrew_epsilon_all_rounds"] > 5.0


def test_with_much_noise_the_lower_bound_stays_below_the_certified_epsilon():
    for seed in range(3):
        row = _run("privacy.noise_multiplier=3.0", f"seed={seed}").rows[-1]
        lower = row["empirical_privacy"]["steinke_epsilon_lower_bound"]
        assert lower <= row["epsilon"], (seed, lower, row["epsilon"])


@dataclass
class TenthOfTheNoise(NoiseSource):
    """A broken mechanism: it adds a tenth of the noise it is asked for, while the strategy's ledger records the
    nominal noise multiplier (the bug a canary audit exists to catch)."""

    name: ClassVar[str] = "test-tenth-of-the-noise"
    # the lie: it declares the Gaussian release of the noise it was asked for, and adds a tenth of it
    noise_kind: ClassVar[str] = "gaussian"
    dp_release = NoiseSource.dp_release

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        return 0.1 * super().noise(round_, purpose, size, std, client=client)


@pytest.fixture
def broken_noise():
    register_noise_source(TenthOfTheNoise, replace=True)
    yield TenthOfTheNoise.name
    NOISE_SOURCES.pop(TenthOfTheNoise.name, None)


def test_a_mechanism_with_a_tenth_of_its_noise_is_caught(broken_noise):
    sets = ("privacy.noise_multiplier=3.0", "rounds=2")
    honest = _run(*sets, canaries=200).rows[-1]
    broken = _run(*sets, f"privacy.mechanism={broken_noise}", canaries=200).rows[-1]
    assert broken["epsilon"] == honest["epsilon"]  # the ledger cannot tell
    lower = broken["empirical_privacy"]["steinke_epsilon_lower_bound"]
    assert lower > broken["epsilon"], (lower, broken["epsilon"])
    assert honest["empirical_privacy"]["steinke_epsilon_lower_bound"] <= honest["epsilon"]


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("privacy.noise_placement=distributed", "distributed"),
        ("engine.name=flower", "flower"),
        ("agnostic.enabled=true", "agnostic"),
        ("privacy.sampling=fixed", "replace-one"),
        ("privacy.clip=0 privacy.noise_multiplier=0", "canary.s update is its direction scaled"),
    ],
)
def test_canaries_are_refused_where_a_client_would_have_to_do_more(setting, why):
    with pytest.raises(ScenarioError, match=why):
        load_scenario("quickstart", ["privacy.canaries=10", *setting.split()])


def test_a_deployed_server_app_refuses_canaries():
    from fedsim.apps.server_app import main

    class _Context:
        run_config: ClassVar[dict] = {"scenario": "quickstart", "num-server-rounds": 1, "min-nodes": 1}

    with pytest.raises(ValueError, match="canary clients exist only in simulation"):
        _with_canaries(main, _Context())


def _with_canaries(main, context):
    from fedsim.apps import server_app

    original = server_app.load_for_run

    def load(cfg):
        scenario, data, trainer = original(cfg)
        scenario = scenario.model_copy(deep=True)
        scenario.privacy.canaries = 5
        return scenario, data, trainer

    server_app.load_for_run = load
    try:
        return main(None, context)
    finally:
        server_app.load_for_run = original
