"""Canary clients under participation schedules and correlated noise (cyclic, min-separation; tree, banded-mf, BLT).

Steinke, Nasr and Jagielski's one-run bound audits the whole run's output: it holds for any mechanism that is
(epsilon, delta)-DP with respect to adding or removing one canary, each canary inserted by an independent coin.
A schedule gives a canary its rounds as it gives every client's (from its own id, which no other canary's coin
moves), and the certified epsilon of a correlated mechanism covers all the rounds one client takes part in. So:
the honest runs' lower bound stays below the certified epsilon in every seed, and a correlated mechanism that drops
its noise while its ledger records the nominal noise multiplier is caught (its lower bound above the certified
epsilon). Each run: the digits MLP, cyclic groups or min-separation, 4 rounds, 100 canaries, in process.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.privacy.canaries import CanaryClients
from fedsim.round import NOISE_SOURCES, register_noise_source
from fedsim.round.correlated import TreeAggregation
from fedsim.round.sampling import CyclicSampler
from fedsim.scenarios import ScenarioError, load_scenario

BASE = ["engine.name=local", "engine.eval_every=1000", "engine.checkpoint_every=0", "rounds=4"]
CYCLIC = ["privacy.sampling=cyclic", "privacy.sampling_rate=none", "privacy.min_separation=2"]
MIN_SEPARATION = [
    "privacy.sampling=min-separation",
    "privacy.sampling_rate=0.5",
    "privacy.min_separation=2",
    "privacy.max_participations=2",
]


def _run(*sets: str, canaries: int = 100):
    scenario = load_scenario("quickstart", [*BASE, f"privacy.canaries={canaries}", *sets])
    return run_scenario(scenario, None, write=False)


def test_a_canarys_id_and_its_cyclic_group_do_not_depend_on_the_other_canaries_coins():
    canaries = CanaryClients(50, dim=7, seed=3, first_id=90, delta=1e-5)
    # direction j is client 90 + j, inserted or not: the inserted ones are those ids, with gaps
    np.testing.assert_array_equal(canaries.ids, 90 + np.flatnonzero(canaries.included))
    np.testing.assert_allclose(
        canaries.updates(canaries.ids, 2.0), 2.0 * canaries.directions[canaries.included]
    )
    with pytest.raises(KeyError, match="not inserted canary ids"):
        canaries.updates(np.array([90 + int(np.flatnonzero(~canaries.included)[0])]), 1.0)
    # the cyclic groups of the population with and without one canary: every other client keeps its group
    m = load_scenario("quickstart", [*CYCLIC, "privacy.min_separation=3"]).privacy
    ids = np.concatenate([np.arange(90), canaries.ids])
    with_all, without_one = CyclicSampler(seed=5), CyclicSampler(seed=5)
    with_all._split(ids, m)
    without_one._split(np.delete(ids, 95), m)
    assert {c: g for c, g in with_all.groups.items() if c != int(ids[95])} == without_one.groups


@pytest.mark.parametrize(
    ("schedule", "mechanism", "z"),
    [(CYCLIC, "tree", 8.0), (CYCLIC, "banded-mf", 3.0), (MIN_SEPARATION, "blt", 3.0)],
    ids=["cyclic-tree", "cyclic-banded-mf", "min-separation-blt"],
)
def test_canaries_take_part_as_the_schedule_allows_and_the_bound_stays_below_the_certified_epsilon(
    schedule, mechanism, z
):
    for seed in range(3):
        result = _run(
            *schedule, f"privacy.mechanism={mechanism}", f"privacy.noise_multiplier={z}", f"seed={seed}"
        )
        row = result.rows[-1]
        emp = row["empirical_privacy"]
        # the audit could refute this certificate (its ceiling is above it): the check below can fail
        assert 0 < row["epsilon"] < emp["steinke_epsilon_ceiling"]
        lower = emp["steinke_epsilon_lower_bound"]
        assert lower <= row["epsilon"], (seed, mechanism, lower, row["epsilon"])
        if schedule is CYCLIC:  # every client (canaries included) in every other round: two groups alternate
            cohorts = [r["non_private"]["cohort"] for r in result.rows]
            assert cohorts[0] == cohorts[2] and cohorts[1] == cohorts[3]
            assert cohorts[0] + cohorts[1] == 90 + emp["canaries_inserted"]


def test_without_noise_the_canaries_are_found_under_a_cyclic_schedule():
    emp = _run(*CYCLIC, "privacy.mechanism=banded-mf", "privacy.noise_multiplier=0").rows[-1][
        "empirical_privacy"
    ]
    assert emp["steinke_correct"] == emp["steinke_guesses"] > 0
    assert emp["steinke_epsilon_lower_bound"] == pytest.approx(emp["steinke_epsilon_ceiling"])


@dataclass
class TreeWithoutNoise(TreeAggregation):
    """A broken correlated mechanism: tree aggregation that keeps its state but releases no noise, while the
    strategy's ledger records the nominal noise multiplier (the bug a canary audit exists to catch)."""

    name: ClassVar[str] = "test-tree-without-noise"
    # the lie: it declares tree aggregation's Gaussian release, and adds no noise
    noise_kind: ClassVar[str] = "gaussian"
    dp_release = TreeAggregation.dp_release

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        return 0.0 * super().noise(round_, purpose, size, std, client=client)


@pytest.fixture
def broken_tree():
    register_noise_source(TreeWithoutNoise, replace=True)
    yield TreeWithoutNoise.name
    NOISE_SOURCES.pop(TreeWithoutNoise.name, None)


def test_a_correlated_mechanism_without_its_noise_is_caught(broken_tree):
    sets = (*CYCLIC, "privacy.noise_multiplier=8.0")
    honest = _run(*sets, "privacy.mechanism=tree").rows[-1]
    broken = _run(*sets, f"privacy.mechanism={broken_tree}").rows[-1]
    assert broken["epsilon"] == honest["epsilon"]  # the ledger cannot tell
    # the audit can refute it at this canary count
    assert honest["epsilon"] < broken["empirical_privacy"]["steinke_epsilon_ceiling"]
    lower = broken["empirical_privacy"]["steinke_epsilon_lower_bound"]
    assert lower > broken["epsilon"], (lower, broken["epsilon"])
    assert honest["empirical_privacy"]["steinke_epsilon_lower_bound"] <= honest["epsilon"]


def test_canaries_under_fixed_size_sampling_are_refused_with_what_would_be_needed():
    with pytest.raises(ScenarioError, match=r"add-remove guarantee.*sampling='poisson'"):
        load_scenario(
            "quickstart",
            [
                "privacy.canaries=10",
                "privacy.sampling=fixed",
                "privacy.sampling_rate=none",
                "privacy.clients_per_round=10",
            ],
        )
