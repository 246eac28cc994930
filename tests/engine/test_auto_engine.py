"""engine.name = "auto" (the default): which engine it picks, that it says why, and the timings a run reports;
engine.eval_clients: evaluation on a fixed, seeded sample of clients."""

import json

import numpy as np
import pytest

from fedsim.engine import auto
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.scenarios.schema import EngineConfig

SMALL = ["rounds=3", "data.num_clients=30", "engine.eval_every=1"]


def _choice(overrides, cpus, num_params=5000):
    scenario = load_scenario("quickstart", overrides)
    return auto.choose_engine(scenario, build_data(scenario), num_params, cpus=cpus)


def test_the_default_engine_is_auto():
    assert EngineConfig().name == "auto"
    assert load_scenario("quickstart").engine.name == "auto"


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("engine.ray_address='127.0.0.1:6379'", "ray_address"),
        ("engine.num_gpus_per_worker=0.5", "num_gpus_per_worker"),
        ("engine.round_timeout_s=60", "round_timeout_s"),
    ],
)
def test_a_run_that_needs_ray_gets_it_whatever_the_machine(setting, reason):
    choice = _choice([*SMALL, setting], cpus=1)
    assert choice.name == "ray" and reason in choice.why


def test_a_pool_that_would_oversubscribe_the_machine_runs_in_process():
    # 2 workers x 1 CPU and the driver need 3 CPUs
    choice = _choice(SMALL, cpus=2)
    assert choice.name == "local"
    assert "2 usable CPUs" in choice.why and "2 x 1 CPUs" in choice.why
    # a bigger machine, the same small rounds: the saving cannot repay Ray's start
    choice = _choice(SMALL, cpus=16)
    assert choice.name == "local" and "less than Ray's start-up" in choice.why


def test_large_rounds_on_a_large_machine_run_on_ray():
    # 100 clients a round of ~20 examples x 10 M parameters x 1,000 rounds: minutes of parallel saving
    sets = ["data.num_clients=100", "privacy.sampling=all", "privacy.sampling_rate=none", "rounds=1000"]
    choice = _choice(sets, cpus=16, num_params=10_000_000)
    assert choice.name == "ray" and "save about" in choice.why
    # the estimate grows with the cohort, the client size, the epochs and the model
    scenario = load_scenario("quickstart", sets)
    data = build_data(scenario)
    small = auto.estimated_round_s(scenario, data, 1000)
    assert auto.estimated_round_s(scenario, data, 2000) == pytest.approx(2 * small)
    twice = load_scenario("quickstart", [*sets, "client.local_epochs=6"])  # quickstart has 3
    assert auto.estimated_round_s(twice, data, 1000) == pytest.approx(2 * small)


def test_auto_says_what_it_picked_in_the_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(auto, "usable_cpus", lambda: 2)
    result = run_scenario(load_scenario("quickstart", SMALL), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"]["name"] == "local" and summary["engine"]["requested"] == "auto"
    assert summary["engine"]["why"].startswith("2 usable CPUs")
    assert result.engine == summary["engine"]
    timings = summary["non_private"]["timings"]
    for key in ("setup_s", "engine_start_s", "rounds_s", "total_s", "first_round_s", "first_round_extra_s"):
        assert key in timings and np.isfinite(timings[key]), key
    # a forced engine says so, with no reason to give
    forced = run_scenario(load_scenario("quickstart", [*SMALL, "engine.name=local"]), write=False)
    assert {k: forced.engine[k] for k in ("name", "requested", "why")} == {
        "name": "local",
        "requested": "local",
        "why": None,
    }


class _Recording:
    """The local engine, recording which clients each evaluation asked for."""

    def __init__(self, scenario):
        from fedsim.engine.local_engine import LocalEngine
        from fedsim.training.trainer import TrainSettings

        self.inner = LocalEngine(build_data(scenario), TrainSettings.from_scenario(scenario))
        self.asked: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def evaluate(self, client_ids, weights):
        self.asked.append(sorted(int(c) for c in client_ids))
        return self.inner.evaluate(client_ids, weights)


def _evaluated(overrides):
    scenario = load_scenario("quickstart", overrides)
    engine = _Recording(scenario)
    return run_scenario(scenario, write=False, engine=engine), engine.asked


def test_eval_clients_evaluates_the_same_seeded_sample_every_round():
    sets = ["rounds=3", "data.num_clients=60", "data.heldout_fraction=0.2", "engine.eval_every=1"]
    full, asked_full = _evaluated(sets)
    assert len(asked_full) == 6  # held-out then training clients, each round
    assert "heldout_clients_evaluated" not in full.rows[0]
    assert "train_clients_evaluated" not in full.rows[0]["non_private"]
    sampled, asked = _evaluated([*sets, "engine.eval_clients=5"])
    held, train = asked[0], asked[1]
    assert len(held) == len(train) == 5
    assert asked == [held, train] * 3  # the same sample in every round
    assert set(held) <= set(asked_full[0]) and set(train) <= set(asked_full[1])
    for row in sampled.rows:
        assert row["heldout_clients_evaluated"] == 5
        assert row["non_private"]["train_clients_evaluated"] == 5
    # training is untouched by evaluation: the same model
    np.testing.assert_array_equal(sampled.weights, full.weights)
    # drawn from the seed: the same sample again, another for another seed
    assert _evaluated([*sets, "engine.eval_clients=5"])[1][:2] == [held, train]
    assert _evaluated([*sets, "engine.eval_clients=5", "seed=1"])[1][:2] != [held, train]
    # more than there are: every client, and nothing said
    every, asked_every = _evaluated([*sets, "engine.eval_clients=1000"])
    assert asked_every[:2] == asked_full[:2] and "heldout_clients_evaluated" not in every.rows[0]


def test_eval_clients_must_be_positive():
    with pytest.raises(ScenarioError, match="eval_clients"):
        load_scenario("quickstart", ["engine.eval_clients=0"])
