"""The run's privacy settings are one frozen object, and every rule of what works with what is asked in one place: a
scenario, the Python API (PrivacySettings, DPFedAvg), --resume and the deployed ServerApp give the same refusal."""

from __future__ import annotations

import dataclasses

import pytest

from fedsim.experiment import build_experiment, privacy_settings
from fedsim.privacy import AdaptiveClipping, PrivacyInputError, PrivacySettings
from fedsim.privacy.settings import SecureAggregation, deployment_refusal, resume_refusal
from fedsim.round import NoiseSource, make_sampler
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.strategies import DPFedAvg


def test_the_settings_are_frozen_and_a_change_is_validated_again():
    s = PrivacySettings(sampling_rate=0.1, mechanism="independent")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.clip = 2.0  # type: ignore[misc]
    assert s.replace(clients_per_round=5).sampling_rate is None  # the other cohort field is cleared
    with pytest.raises(PrivacyInputError, match="noise_placement"):
        s.replace(noise_placement="everywhere")
    with pytest.raises(PrivacyInputError, match="bands"):
        PrivacySettings(
            sampling="cyclic", min_separation=2, mechanism="banded-mf", mechanism_options={"bands": 0}
        )


@pytest.mark.parametrize(
    ("overrides", "keywords", "match"),
    [
        (
            ["privacy.mechanism=tree", "privacy.sampling=poisson"],
            dict(mechanism="tree", sampling="poisson", sampling_rate=0.2),
            "needs a participation schedule",
        ),
        (
            ["privacy.mechanism=tree", "privacy.sampling=all", "privacy.sampling_rate=none",
             "privacy.noise_placement=distributed"],
            dict(mechanism="tree", sampling="all", noise_placement="distributed"),
            "must be 'central' with mechanism='tree'",
        ),
        (
            ["privacy.canaries=10", "privacy.noise_placement=distributed"],
            dict(sampling_rate=0.2, canaries=10, noise_placement="distributed"),
            "a canary would have to add a noise share",
        ),
        (
            ["privacy.noise_multiplier=0", "privacy.noise_placement=distributed"],
            dict(sampling_rate=0.2, noise_multiplier=0, noise_placement="distributed"),
            "it adds no noise: use central",
        ),
        (
            ["privacy.adaptive_clip=true", "privacy.sampling=cyclic", "privacy.min_separation=3"],
            dict(sampling="cyclic", sampling_rate=0.2, min_separation=3, adaptive_clipping=AdaptiveClipping()),
            "the schedule's accounting assumes one clip",
        ),
    ],
)  # fmt: skip
def test_a_rule_refuses_with_one_message_from_a_scenario_and_from_the_api(overrides, keywords, match):
    with pytest.raises(ScenarioError, match=match):
        load_scenario("quickstart", overrides)
    with pytest.raises(PrivacyInputError, match=match):
        PrivacySettings(**keywords)
    with pytest.raises(PrivacyInputError, match=match):
        DPFedAvg(seed=0, **keywords)


def test_the_strategy_takes_the_scenarios_one_object():
    scenario = load_scenario("quickstart", ["rounds=2", "privacy.mechanism=independent"])
    exp = build_experiment(scenario)
    assert exp.strategy.privacy == privacy_settings(scenario)
    m = exp.strategy.mechanism(90)
    assert m == privacy_settings(scenario).mechanism_at(90, public_population=exp.strategy.population)


def test_settings_and_keywords_or_objects_that_disagree_are_refused():
    s = PrivacySettings(sampling_rate=0.1)
    with pytest.raises(PrivacyInputError, match="either as one PrivacySettings or as keywords"):
        DPFedAvg(s, clip=2.0)
    with pytest.raises(PrivacyInputError, match="the privacy settings name sampling 'poisson'"):
        DPFedAvg(s, sampling=make_sampler("all", 0), seed=0)
    assert DPFedAvg(s, noise=NoiseSource(0), seed=0).noise.seed == 0  # an object of the named mechanism


def test_resume_and_deployment_ask_the_same_rules():
    calibrated = PrivacySettings(sampling_rate=0.1, target_epsilon=4.0)
    assert resume_refusal(calibrated, "seeded", 5, 5) is None  # continuing, not extending
    assert "calibrated to privacy.target_epsilon=4.0 over 5 rounds" in resume_refusal(
        calibrated, "seeded", 5, 8
    )
    assert "needs privacy.randomness = 'seeded'" in resume_refusal(calibrated, "os-entropy", 5, 5)
    banded = PrivacySettings(sampling="cyclic", min_separation=2, mechanism="banded-mf")
    assert "optimised its banded Toeplitz coefficients" in resume_refusal(banded, "seeded", 4, 6)
    assert resume_refusal(PrivacySettings(sampling="all", mechanism="tree"), "seeded", 4, 6) is None
    distributed = PrivacySettings(sampling_rate=0.1, noise_placement="distributed")
    assert "refused with Flower nodes without secure aggregation" in deployment_refusal(
        distributed, False, "the flag"
    )
    assert deployment_refusal(distributed, True, "the flag") is None
    # with SecAgg+ the server learns only the noised sum: no opt-in needed; a simulated dropout rate is refused
    secure = dict(noise_placement="distributed", mechanism="ddgauss", accountant="rdp", sampling_rate=0.1)
    assert (
        deployment_refusal(PrivacySettings(**secure, secagg=SecureAggregation()), False, "the flag") is None
    )
    assert "simulates clients that drop out" in deployment_refusal(
        PrivacySettings(**secure, secagg=SecureAggregation(dropout=0.1)), False, "the flag"
    )
    # secure aggregation sums integers: central noise, or Gaussian shares, cannot be summed by it
    for bad in (
        dict(secure, noise_placement="central", mechanism="independent", accountant="pld"),
        dict(secure, mechanism="independent", accountant="pld"),
    ):
        with pytest.raises(
            PrivacyInputError, match="needs noise_placement='distributed' and a mechanism whose"
        ):
            PrivacySettings(**bad, secagg=SecureAggregation())
    for field, value in (
        ("neighbours", 3),
        ("neighbours", -2),
        ("threshold", 0.5),
        ("threshold", 1.2),
        ("dropout", 1),
    ):
        with pytest.raises(PrivacyInputError, match=f"secagg.{field}"):
            SecureAggregation(**{field: value})
    # t: a majority of the k + 1 holders, at least 2; k: the neighbours, or everyone else (full SecAgg)
    assert SecureAggregation().degree(10) == 9 and SecureAggregation(neighbours=4).degree(10) == 4
    assert SecureAggregation(neighbours=4).shares_needed(10) == 3  # ceil(0.6 * 5)
    assert SecureAggregation(neighbours=20).degree(6) == 5 and SecureAggregation().shares_needed(2) == 2
    assert "canary clients exist only in simulation" in deployment_refusal(
        PrivacySettings(sampling_rate=0.1, canaries=2), True, "the flag"
    )


def test_a_noise_name_or_object_is_never_replaced_by_independent_noise():
    with pytest.raises(PrivacyInputError, match="mechanism='banded-mf2' is invalid: must be one of"):
        DPFedAvg(sampling_rate=0.1, noise="banded-mf2", seed=0)

    @dataclasses.dataclass
    class Unregistered(NoiseSource):  # never registered, and it changes the server's part of the noise
        name = "test-unregistered-half"

        def server_noise(self, round_, size, release, shares, purpose="model"):
            noise, std = super().server_noise(round_, size, release, shares, purpose)
            return 0.5 * noise, 0.5 * std

    with pytest.raises(TypeError, match=r"decides its own noise \(Unregistered.server_noise\)"):
        DPFedAvg(sampling_rate=0.1, noise=Unregistered(0), seed=0)


def test_the_public_population_set_after_construction_reaches_the_round():
    strategy = DPFedAvg(clients_per_round=10, seed=0, population=100)
    assert strategy.mechanism(100).q == pytest.approx(0.1)
    strategy.population = 200  # the ServerApp sets the run config's public population after building
    assert strategy.mechanism(100).q == pytest.approx(0.05)
    assert strategy.mechanism(100).public_population == 200


def test_correlated_noise_with_distributed_placement_keeps_its_message():
    with pytest.raises(PrivacyInputError, match="must be 'central' with mechanism='tree'"):
        PrivacySettings(sampling="all", mechanism="tree", noise_placement="distributed")


def test_a_node_with_its_own_policy_keeps_its_own_mechanism():
    from fedsim.apps.client_app import NoisePolicy, NoiseRefused

    scenario = load_scenario("quickstart", ["privacy.noise_placement=distributed"])
    data = build_experiment(scenario).data
    own = {"noise-multiplier": "1.0"}
    assert type(NoisePolicy.for_node(scenario, data, own, 0).noise) is NoiseSource
    tree = load_scenario(
        "quickstart", ["privacy.mechanism=tree", "privacy.sampling=all", "privacy.sampling_rate=none"]
    )
    with pytest.raises(NoiseRefused, match="this node adds 'independent' noise"):
        NoisePolicy.for_node(tree, data, own, 0)
