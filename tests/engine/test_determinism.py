"""Same seed, same model: with 1 or 2 Ray workers and in process; the engine matches the strategy's own path."""

import numpy as np
import pytest

from fedsim.engine.ray_engine import LocalEngine, RayEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data
from fedsim.scenarios import load_scenario
from fedsim.training.trainer import TrainSettings

OVERRIDES = ["rounds=3", "data.num_clients=24", "privacy.sampling_rate=0.5", "engine.eval_every=3"]


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("quickstart", OVERRIDES)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _final(scenario, engine):
    return run_scenario(scenario, write=False, engine=engine)


def test_one_and_two_workers_and_in_process_agree(scenario, ray_session):
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    local = _final(scenario, LocalEngine(data, settings))
    results = {"local": local}
    for n in (1, 2):
        engine = RayEngine(data, settings, num_workers=n)
        try:
            results[n] = _final(scenario, engine)
            if n == 2:
                assert len({i["pid"] for i in engine.infos}) == 2
        finally:
            engine.close()
    for key in (1, 2):
        np.testing.assert_allclose(results[key].weights, local.weights, rtol=0, atol=1e-5)
        assert [r["non_private"]["cohort"] for r in results[key].rows] == [
            r["non_private"]["cohort"] for r in local.rows
        ]
        assert results[key].rows[-1]["epsilon"] == local.rows[-1]["epsilon"]


def test_a_different_seed_gives_a_different_model(scenario):
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    a = _final(scenario, LocalEngine(data, settings))
    other = load_scenario("quickstart", [*OVERRIDES, "seed=1"])
    b = _final(other, LocalEngine(build_data(other), TrainSettings.from_scenario(other)))
    assert np.abs(a.weights - b.weights).max() > 1e-3


def test_a_run_whose_pld_would_not_fit_in_memory_reports_rdp_and_says_so():
    import warnings

    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    sc = load_scenario("quickstart", ["rounds=2", "engine.name=local", "privacy.noise_multiplier=0.005"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = run_scenario(sc, write=False)
    row = res.rows[-1]
    assert row["accountant"] == "pld" and row["accountant_used"] == "rdp"
    assert "noise multiplier 0.005" in row["accountant_note"]
    assert row["epsilon"] == res.strategy.ledger.epsilon(sc.privacy.delta, "rdp")


def test_weights_travel_inline_when_small_and_by_reference_when_large(scenario, ray_session, monkeypatch):
    """Small weights go inside each worker's call (no object-store round trip); large ones are put once per round.
    Either way the round is the same, bit for bit."""
    import ray

    from fedsim.engine import ray_engine

    assert isinstance(ray_engine._shipped(np.zeros(1000)), np.ndarray)  # 4 KB as float32
    assert isinstance(ray_engine._shipped(np.zeros(100_000)), ray.ObjectRef)  # 400 KB
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    engine = RayEngine(data, settings, num_workers=2)
    try:
        # joined the running Ray session: its start is the join (near zero), the workers' start is measured
        assert set(engine.start_timings) == {"ray_start_s", "workers_start_s"}
        assert engine.start_timings["workers_start_s"] > 0
        rounds = {}
        for limit in (ray_engine.INLINE_WEIGHTS_BYTES, 0):  # the default, then everything by reference
            monkeypatch.setattr(ray_engine, "INLINE_WEIGHTS_BYTES", limit)
            rounds[limit] = run_scenario(scenario, write=False, engine=engine)
    finally:
        engine.close()
    a, b = rounds.values()
    np.testing.assert_array_equal(a.weights, b.weights)
    assert [r.get("heldout_accuracy") for r in a.rows] == [r.get("heldout_accuracy") for r in b.rows]
