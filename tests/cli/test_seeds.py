"""Separate data and noise seeds: ``data_seed`` draws the data and the training (partition, held-out clients, initial
model, batch orders), ``noise_seed`` the privacy mechanism (cohorts, noise, canaries); ``seed`` is the shorthand for
both. config.toml records the values a run used, and a sweep's seeds vary every seed the scenario does not fix."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.scenarios import ScenarioError, load_scenario, scenario_to_toml
from fedsim.scenarios.schema import SEEDS
from fedsim.sweep import config_differences, plan_sweep, planned_config, uncomposed_releases

SMALL = ["rounds=2", "data.num_clients=30", "engine.name=local", "privacy.sampling_rate=0.5"]


def _seeds(scenario):
    return scenario.seed, scenario.data_seed, scenario.noise_seed


def test_seed_is_the_shorthand_for_both_and_config_toml_records_what_ran():
    assert set(SEEDS) == {"data_seed", "noise_seed"}
    assert _seeds(load_scenario("quickstart", ["seed=3"])) == (3, 3, 3)
    assert _seeds(load_scenario("quickstart", ["seed=3", "data_seed=1"])) == (3, 1, 3)
    assert _seeds(load_scenario("quickstart", ["seed=3", "noise_seed=8"])) == (3, 3, 8)
    assert _seeds(load_scenario("quickstart", ["seed=4", "data_seed=none"])) == (
        4,
        4,
        4,
    )  # none: follows seed
    sc = load_scenario("quickstart", ["seed=3", "data_seed=1"])
    config = tomllib.loads(scenario_to_toml(sc))
    assert (config["seed"], config["data_seed"], config["noise_seed"]) == (3, 1, 3)
    # read back, the config is the same run
    assert _seeds(load_scenario("quickstart", [f"{k}={config[k]}" for k in ("seed", *SEEDS)])) == (3, 1, 3)
    sc.seed = 9  # assigned later (the Python API): the seed not fixed follows it
    assert _seeds(sc) == (9, 1, 9)


def test_a_seed_that_would_draw_nothing_and_bad_seeds_are_refused():
    # a run's config.toml fixes both; a seed given beside them, equal to neither, would be a label of nothing
    with pytest.raises(
        ScenarioError, match=r"seed=5 is the shorthand for data_seed and noise_seed.*data_seed=1"
    ):
        load_scenario("quickstart", ["seed=5", "data_seed=1", "noise_seed=2"])
    assert _seeds(load_scenario("quickstart", ["seed=1", "data_seed=1", "noise_seed=2"])) == (1, 1, 2)
    with pytest.raises(ScenarioError, match=r"data_seed: .*greater than or equal to 0"):
        load_scenario("quickstart", ["data_seed=-1"])
    with pytest.raises(ScenarioError, match=r"noise_seed"):
        load_scenario("quickstart", ["noise_seed=true"])


def _build(*sets):
    return build_experiment(load_scenario("quickstart", [*SMALL, *sets]))


def _same_data(a, b) -> bool:
    if not (np.array_equal(a.train_ids, b.train_ids) and np.array_equal(a.heldout_ids, b.heldout_ids)):
        return False
    return all(
        np.array_equal(xa, xb) and np.array_equal(ya, yb)
        for cid in [*a.train_ids, *a.heldout_ids]
        for (xa, ya), (xb, yb) in [(a.data.client_data(int(cid)), b.data.client_data(int(cid)))]
    )


def _mechanism(exp, rounds=3):
    """What the privacy mechanism draws: each round's cohort and model noise, over the same population."""
    population = range(int(exp.train_ids.size))
    return [
        (
            sorted(exp.strategy.begin_round(t, population).cohort),
            exp.strategy.noise.noise(t, "model", 8, 1.0),
        )
        for t in range(1, rounds + 1)
    ]


def _same_mechanism(a, b) -> bool:
    return all(
        ca == cb and np.array_equal(na, nb)
        for (ca, na), (cb, nb) in zip(_mechanism(a), _mechanism(b), strict=True)
    )


def test_the_same_data_seed_with_another_noise_seed_keeps_the_data_and_redraws_the_noise():
    a, b = _build("data_seed=0", "noise_seed=0"), _build("data_seed=0", "noise_seed=1")
    assert _same_data(a, b)
    assert np.array_equal(a.initial_weights, b.initial_weights)  # the model's initialisation is the data side
    assert a.settings == b.settings  # batch orders and dropout masks: from the training settings' seed
    assert not _same_mechanism(a, b)
    assert a.strategy.seed == 0 and b.strategy.seed == 1


def test_the_same_noise_seed_with_another_data_seed_redraws_the_data_and_keeps_the_noise():
    a, b = _build("data_seed=0", "noise_seed=0"), _build("data_seed=1", "noise_seed=0")
    assert (
        a.train_ids.size == b.train_ids.size
    )  # the same population size: the mechanism's draws are comparable
    assert not _same_data(a, b)
    assert not np.array_equal(a.initial_weights, b.initial_weights)
    assert _same_mechanism(a, b)


def test_runs_with_one_data_seed_differ_only_by_their_noise(tmp_path):
    """Whole runs: the same data_seed, another noise_seed: the same data description and held-out clients in
    data.json, other cohorts; then the same noise_seed with another data_seed: the same cohorts (one population
    size), other data."""
    import json

    def run(name, *sets):
        out = tmp_path / name
        res = run_scenario(load_scenario("quickstart", [*SMALL, *sets]), out)
        data = json.loads((out / "data.json").read_text())
        config = tomllib.loads((out / "config.toml").read_text())
        cohorts = [r["non_private"]["cohort"] for r in res.rows]
        return data, config, cohorts, res.weights

    d00, c00, k00, w00 = run("a", "seed=0")
    d01, c01, k01, w01 = run("b", "seed=0", "noise_seed=1")
    d10, _, k10, _ = run("c", "seed=1", "noise_seed=0")
    assert (c00["data_seed"], c00["noise_seed"]) == (0, 0) and (c01["data_seed"], c01["noise_seed"]) == (0, 1)
    public = {k: v for k, v in d00.items() if k != "non_private"}
    assert public == {k: v for k, v in d01.items() if k != "non_private"} and d00 == d01
    assert k00 != k01 and np.abs(w00 - w01).max() > 1e-4
    assert d10 != d00 and k10 == k00


def test_a_sweep_varies_every_seed_the_scenario_does_not_fix(tmp_path):
    def seeds(sets, n=3):
        _, runs = plan_sweep("quickstart", sets=[*SMALL, *sets], seeds=n, out=tmp_path / "s")
        return [(r.seed, *_seeds(load_scenario("quickstart", r.overrides))[1:]) for r in runs]

    assert seeds([]) == [(0, 0, 0), (1, 1, 1), (2, 2, 2)]
    assert seeds(["data_seed=7"]) == [(0, 7, 0), (1, 7, 1), (2, 7, 2)]  # the data stays, the noise varies
    assert seeds(["noise_seed=7"]) == [(0, 0, 7), (1, 1, 7), (2, 2, 7)]
    both = [
        "seed=7",
        "data_seed=7",
        "noise_seed=8",
    ]  # quickstart.toml gives seed = 0: seed must be one of them
    assert seeds(both, 1) == [(7, 7, 8)]  # both fixed: one seed
    with pytest.raises(
        ScenarioError, match=r"sweep.seeds=3 varies seed.*fixes both \(data_seed=7, noise_seed=8\)"
    ):
        seeds(both)
    with pytest.raises(ScenarioError, match=r"seed=0 is the shorthand .* \(--set seed=7, the data's\)"):
        seeds(["data_seed=7", "noise_seed=8"], 1)
    with pytest.raises(ScenarioError, match=r"grid/variants set 'seed'"):
        plan_sweep("quickstart", sets=SMALL, grid={"seed": [0, 1]}, out=tmp_path / "g")
    # a grid over noise_seed at one data seed: the data_seed stays the scenario's seed
    _, runs = plan_sweep("quickstart", sets=SMALL, grid={"noise_seed": [3, 4]}, out=tmp_path / "n")
    assert [_seeds(load_scenario("quickstart", r.overrides)) for r in runs] == [(0, 0, 3), (0, 0, 4)]


def test_a_config_written_before_the_two_seeds_is_the_same_run(tmp_path):
    """An older config.toml has seed alone, which drew both: a sweep reuses its directory, and a replaced run of
    other settings on the same data_seed counts as released about the same clients."""
    planned = planned_config("quickstart", [*SMALL, "seed=2"])
    old = {k: v for k, v in planned.items() if k not in SEEDS}
    assert config_differences(old, planned) == []
    assert config_differences({**old, "seed": 3}, planned) == [
        "data_seed: 3 in the run, 2 planned",
        "noise_seed: 3 in the run, 2 planned",
        "seed: 3 in the run, 2 planned",
    ]
    import tomli_w

    run = tmp_path / "old"
    run.mkdir()
    (run / "config.toml").write_text(tomli_w.dumps({**old, "privacy": {**old["privacy"], "clip": 0.5}}))
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    assert "1 round released on the same clients" in uncomposed_releases(run, planned)
    # another noise seed: other cohorts and noise, the same clients
    assert uncomposed_releases(run, planned_config("quickstart", [*SMALL, "seed=2", "noise_seed=5"]))
    assert uncomposed_releases(run, planned_config("quickstart", [*SMALL, "seed=2", "data_seed=5"])) is None
