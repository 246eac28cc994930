"""Settings that do not do what they say are refused or warned about (fedsim.run_checks), with the numbers: bands
beyond the rounds, a cyclic schedule that leaves clients out, delta >= 1/N, canaries swamping the cohort, noise
dwarfing the signal; and the run's header states the realised facts. Every scenario here is built for real (small
populations, few rounds), and the numbers are checked against what the strategy actually samples and adds."""

import json
import logging
import math
import re

import numpy as np
import pytest

import fedsim
from fedsim.cli import main
from fedsim.experiment import build_experiment, build_strategy
from fedsim.round import PartialSum
from fedsim.run_checks import (
    CANARY_SHARE_LIMIT,
    NOISE_RATIO_LIMIT,
    describe_experiment,
    experiment_facts,
    noise_factors,
)
from fedsim.scenarios import ScenarioError, available_scenarios, load_scenario
from fedsim.training.trainer import make_model

#: quickstart over 30 clients (27 training, 3 held out): q = 0.2, an expected cohort of 5.4, 2,410 parameters
SMALL = ["data.num_clients=30", "rounds=2"]


def _kinds(exp):
    return [w.kind for w in exp.warnings]


def _warning(exp, kind):
    found = [w for w in exp.warnings if w.kind == kind]
    assert len(found) == 1, (kind, exp.warnings)
    return found[0]


def _parameters(exp) -> int:
    module = make_model(exp.settings, exp.data.input_shape, exp.data.num_classes)
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------------- bands
CYCLIC_MF = ["privacy.sampling=cyclic", "privacy.sampling_rate=none", "privacy.min_separation=5"]


def test_bands_beyond_the_rounds_are_refused_naming_both(capsys):
    with pytest.raises(ScenarioError) as err:
        load_scenario(
            "quickstart",
            [*CYCLIC_MF, "privacy.mechanism=banded-mf", "privacy.mechanism.bands=200", "rounds=20"],
        )
    msg = str(err.value)
    assert "privacy.mechanism.bands=200" in msg and "rounds=20" in msg and "allowed: 1 to 20" in msg
    # the command line: exit 2, the same message, nothing run
    argv = ["run", "quickstart", *(f"--set={s}" for s in [*CYCLIC_MF, "privacy.mechanism=banded-mf"])]
    assert main([*argv, "--set", "privacy.mechanism.bands=21", "--set", "rounds=20"]) == 2
    err_text = capsys.readouterr().err
    assert (
        "privacy.mechanism.bands=21" in err_text and "rounds=20" in err_text and "Traceback" not in err_text
    )


def test_bands_up_to_the_rounds_run_as_given():
    s = load_scenario(
        "quickstart", [*CYCLIC_MF, "privacy.mechanism=banded-mf", "privacy.mechanism.bands=20", "rounds=20"]
    )
    strategy = build_strategy(s, population=90)
    # config.toml's value is the one that runs
    assert strategy.noise.bands == 20 == s.privacy.mechanism_options()["bands"]
    assert len(strategy.noise.coefficients) == 20


# ---------------------------------------------------------------------------------------------------- schedule
def test_a_cyclic_schedule_with_more_groups_than_rounds_warns_with_the_fraction_left_out():
    # 60 clients: 54 training; 50 groups over 20 rounds: groups 21..50 never get a turn (30 of 50: 60%)
    exp = build_experiment(
        load_scenario(
            "quickstart",
            [
                "data.num_clients=60",
                "rounds=20",
                "privacy.sampling=cyclic",
                "privacy.sampling_rate=none",
                "privacy.min_separation=50",
            ],
        )
    )
    w = _warning(exp, "schedule")
    assert w.values["fraction_never_participating"] == pytest.approx(30 / 50)
    assert w.values["min_separation"] == 50 and w.values["rounds"] == 20
    assert "60%" in w.message and "min_separation <= 20" in w.message
    # what the schedule really does: the clients never sampled in the 20 rounds are exactly those whose group
    # never gets a turn, and they are a large share of the 54
    sampler, ids = exp.strategy.sampler, exp.train_ids
    mechanism = exp.strategy.mechanism(int(ids.size))
    trained: set[int] = set()
    for t in range(1, 21):
        trained |= {int(c) for c in sampler.sample(t, ids, mechanism)}
    never = {int(c) for c in ids} - trained
    assert never == {c for c, g in sampler.groups.items() if g >= 20}
    assert 0.35 < len(never) / ids.size < 0.85  # 60% expected; the groups are drawn at random


def test_no_schedule_warning_when_every_group_gets_a_turn_and_more_groups_than_clients_are_refused():
    base = ["data.num_clients=30", "privacy.sampling=cyclic", "privacy.sampling_rate=none"]
    exp = build_experiment(load_scenario("quickstart", [*base, "privacy.min_separation=10", "rounds=10"]))
    assert "schedule" not in _kinds(exp)
    # 27 training clients cannot be split into 28 groups: refused when the strategy is built, naming the field
    with pytest.raises(ValueError, match=r"min_separation=28 .*at most the population \(27\)"):
        build_experiment(load_scenario("quickstart", [*base, "privacy.min_separation=28", "rounds=30"]))


# ---------------------------------------------------------------------------------------------------- delta
def test_delta_at_least_one_over_the_population_warns():
    # 60 clients, 54 training: 1/N = 0.0185 <= 0.1
    exp = build_experiment(load_scenario("quickstart", ["data.num_clients=60", "privacy.delta=0.1"]))
    w = _warning(exp, "delta")
    assert w.values["population"] == 54 == exp.train_ids.size == exp.strategy.population
    assert w.values["one_over_population"] == pytest.approx(1 / 54)
    assert w.values["delta"] == 0.1
    assert "1/54" in w.message and "releasing a client's data outright" in w.message
    assert w.values["suggested_delta"] < 1 / 54
    # just below 1/N: no warning; a non-private run (no noise, epsilon infinite): no warning either
    assert "delta" not in _kinds(
        build_experiment(load_scenario("quickstart", ["data.num_clients=60", "privacy.delta=0.0185"]))
    )
    nonprivate = ["data.num_clients=60", "privacy.delta=0.1", "privacy.noise_multiplier=0"]
    assert _kinds(build_experiment(load_scenario("quickstart", nonprivate))) == []


# ---------------------------------------------------------------------------------------------------- canaries
def test_canaries_swamping_the_cohort_warn_with_both_numbers_and_the_share():
    # 80 clients: 72 training; 200 canaries: a public population of 272, of which 200/272 = 74% are canaries
    exp = build_experiment(load_scenario("quickstart", ["data.num_clients=80", "privacy.canaries=200"]))
    w = _warning(exp, "canaries")
    cohort = exp.strategy.mechanism(272).expected_cohort
    assert cohort == pytest.approx(0.2 * 272)
    assert w.values["expected_cohort"] == pytest.approx(cohort)
    assert w.values["expected_canaries_per_round"] == pytest.approx(0.2 * 200)
    assert w.values["canary_share"] == pytest.approx(200 / 272)
    assert "74%" in w.message and "40 of the expected cohort of 54.4" in w.message
    # the most canaries within the limit, and one more
    most = int(CANARY_SHARE_LIMIT * 72 / (1 - CANARY_SHARE_LIMIT))
    assert f"at most {most} canaries" in w.message
    for k, warned in ((most, False), (most + 1, True)):
        exp = build_experiment(load_scenario("quickstart", ["data.num_clients=80", f"privacy.canaries={k}"]))
        assert ("canaries" in _kinds(exp)) is warned, k


# ---------------------------------------------------------------------------------------------------- noise
def test_noise_dwarfing_the_signal_warns_with_the_ratio_and_matches_the_noise_added():
    exp = build_experiment(load_scenario("quickstart", SMALL))
    w = _warning(exp, "noise")
    d, cohort = _parameters(exp), 0.2 * 27
    assert w.values["parameters"] == d == exp.initial_weights.size
    assert w.values["expected_cohort"] == pytest.approx(cohort)
    ratio = 1.0 * math.sqrt(d) / cohort  # z = 1, clip 1
    assert w.values["ratio"] == pytest.approx(ratio) and ratio > NOISE_RATIO_LIMIT
    assert f"{ratio:.3g}x the clip 1" in w.message and f"d={d:,} parameters" in w.message
    assert f">= {math.ceil(math.sqrt(d) / NOISE_RATIO_LIMIT)} clients" in w.message
    # the round's released mean when every client's update is zero: the noise alone, of the norm predicted
    strategy = exp.strategy
    plan = strategy.begin_round(1, exp.train_ids)
    _, metrics = strategy.finish_round(plan, exp.initial_weights, PartialSum(d), account=False)
    assert metrics["update_norm"] == pytest.approx(w.values["noise_norm"], rel=0.05)


def test_correlated_noise_is_judged_by_the_noise_it_leaves_in_the_model():
    # banded-mf on a cyclic schedule of 3 groups over 12 rounds, 27 training clients: 9 a round
    sets = [
        "data.num_clients=30",
        "rounds=12",
        *CYCLIC_MF[:2],
        "privacy.min_separation=3",
        "privacy.mechanism=banded-mf",
        "privacy.noise_multiplier=4",
    ]
    exp = build_experiment(load_scenario("quickstart", sets))
    factors = noise_factors(exp)
    w = _warning(exp, "noise")
    assert w.values["noise_factor_accumulated"] == pytest.approx(factors.accumulated)
    assert w.values["ratio"] == pytest.approx(4 * factors.accumulated * math.sqrt(2410) / 9)
    # against the noise the strategy really adds, each round's mean from zero updates: per round (exact, as the
    # rows publish it) and accumulated over the rounds (estimated over 2,410 coordinates)
    strategy, w0, d = exp.strategy, exp.initial_weights, exp.initial_weights.size
    per_round, total, accumulated = [], np.zeros(d), []
    for t in range(1, 13):
        plan = strategy.begin_round(t, exp.train_ids)
        stepped, metrics = strategy.finish_round(plan, w0, PartialSum(d), account=False)
        per_round.append(metrics["noise_std_sum"] / metrics["noise_std_draw"])
        total += stepped - w0  # server sgd at lr 1 (quickstart's): the step is the released mean
        accumulated.append(float(np.mean(total**2)) / t)
    assert factors.per_round == pytest.approx(math.sqrt(np.mean(np.square(per_round))))
    # per unit of the fresh draws' std on the sum (z * clip = 4), over the expected cohort of 9
    measured = math.sqrt(np.mean(accumulated)) * 9 / 4.0
    assert measured == pytest.approx(factors.accumulated, rel=0.1)
    # more noise per round than independent noise, less left in the model
    assert factors.per_round > 1 > factors.accumulated


def test_non_private_and_normal_runs_get_no_warning():
    assert build_experiment(load_scenario("quickstart")).warnings == []  # 90 training, 18 a round: ratio 2.7
    nonprivate = build_experiment(load_scenario("quickstart", [*SMALL, "privacy.noise_multiplier=0"]))
    assert nonprivate.warnings == []
    # either side of the limit: z sqrt(2410) / 5.4 = 4.95 and 5.04
    for z, warned in ((0.545, False), (0.555, True)):
        exp = build_experiment(load_scenario("quickstart", [*SMALL, f"privacy.noise_multiplier={z}"]))
        ratio = z * math.sqrt(2410) / 5.4
        assert (ratio > NOISE_RATIO_LIMIT) is warned and ("noise" in _kinds(exp)) is warned, (z, ratio)


# ---------------------------------------------------------------------------------------------------- the header
def test_the_header_states_the_realised_run_and_descriptions_hold_no_counts():
    exp = build_experiment(load_scenario("shakespeare-transformer", ["data.num_clients=40"]))
    facts = experiment_facts(exp)
    assert (facts["clients"], facts["training_clients"], facts["heldout_clients"]) == (40, 36, 4)
    line = describe_experiment(exp)
    assert line.startswith("40 clients: 36 training, 4 held out")
    assert f"{_parameters(exp):,} parameters" in line and "expected cohort 3.6 clients a round" in line
    # the diverged transformer: z = 0.5 over 3.6 clients a round
    w = _warning(exp, "noise")
    assert w.values["ratio"] == pytest.approx(0.5 * math.sqrt(_parameters(exp)) / 3.6)
    for name in available_scenarios():  # a count in prose goes stale under --set: the header states the run's
        description = load_scenario(name).description
        assert not re.search(r"\d[\d,]*\s*(clients|roles|domains)\b", description), (name, description)


# ---------------------------------------------------------------------------------------------------- where they go
def test_fedsim_run_prints_the_warnings_before_the_first_round_and_records_them(tmp_path, capsys):
    out = tmp_path / "run"
    sets = ["rounds=1", "engine.name=local", "data.num_clients=30", "privacy.delta=0.1"]
    assert (
        main(
            [
                "run",
                "quickstart",
                *(a for s in sets for a in ("--set", s)),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "run: 30 clients: 27 training, 3 held out (never trained on); model: 2,410 parameters" in printed
    first_round = printed.index("round   1/1")
    for kind in ("delta", "noise"):
        where = [m.start() for m in re.finditer(re.escape(f"warning ({kind}): "), printed)]
        assert len(where) == 2 and where[0] < first_round < where[1], (
            kind,
            printed,
        )  # before the run, and after
    summary = json.loads((out / "summary.json").read_text())
    assert [w["kind"] for w in summary["warnings"]] == ["delta", "noise"]
    assert summary["warnings"][0]["values"]["population"] == 27


def test_the_python_api_logs_and_returns_them(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedsim.run_checks"):
        result = fedsim.run(
            "quickstart", tmp_path / "a", overrides=["rounds=1", "engine.name=local", *SMALL[:1]]
        )
    assert [w["kind"] for w in result.warnings] == ["noise"]
    assert [r.getMessage()[:16] for r in caplog.records if r.name == "fedsim.run_checks"] == [
        "warning (noise):"
    ]
    result = fedsim.run("quickstart", tmp_path / "b", overrides=["rounds=1", "engine.name=local"])
    assert result.warnings == []
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["warnings"] == []
