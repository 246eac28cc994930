"""One scenario through every simulation engine (in-process, Ray actors, Flower's Simulation Engine): the same
rows column by column, the same ledger, the same summary. They all run the one round loop (fedsim.loop)."""

from __future__ import annotations

import json
import math

import numpy as np

from fedsim.scenarios import load_scenario

TINY = [
    "seed=5",
    "rounds=2",
    "data.num_clients=5",
    "data.heldout_fraction=0.2",
    "client.local_epochs=1",
    "privacy.sampling=all",
    "privacy.sampling_rate=none",
    "privacy.noise_multiplier=0.7",
    "engine.num_workers=2",
    # distributed noise: the ClientApp clips and adds its own share; the server adds none
    "privacy.noise_placement=distributed",
]
# what only some engines can report: per-client training metrics and, with distributed noise, the update norms
# (Flower's clients send neither back: only their noised update), and timings
ENGINE_SPECIFIC = {
    "local_training",
    "local_training_fallbacks",  # summary.json: Flower's clients choose their path where the engine cannot see it
    "local_training_used",
    "client_train_loss",
    "clipped_fraction",
    "median_update_norm",
    "train_time_s",
    "round_time_s",
}


def _compare(a, b, path: str = "") -> None:
    if isinstance(a, dict):
        keys = set(a) - ENGINE_SPECIFIC
        assert keys == set(b) - ENGINE_SPECIFIC, (path, sorted(keys ^ (set(b) - ENGINE_SPECIFIC)))
        for k in keys:
            _compare(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _compare(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, str):
        # Flower and Ray ship the global model as float32: equal to rounding
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_every_simulation_engine_gives_the_same_rows_ledger_and_summary(tmp_path):
    import ray

    from fedsim.engine.runner import run_scenario

    runs = {}
    for engine in ("local", "ray", "flower"):
        if ray.is_initialized():
            ray.shutdown()
        scenario = load_scenario("quickstart", [*TINY, f"engine.name={engine}"])
        runs[engine] = run_scenario(scenario, tmp_path / engine)
    for engine, res in runs.items():
        assert [r["round"] for r in res.rows] == [1, 2], engine
        for row in res.rows:
            diag = row["non_private"]
            assert diag["cohort"] == 4 and diag["received"] == 4 and diag["rejected"] == 0, (engine, row)
            assert diag["server_noise_std"] == 0.0  # every share came from the clients
            assert (
                "train_accuracy" in diag and "train_accuracy" not in row
            )  # training-client metrics: non-private
    files = {
        e: {f: (tmp_path / e / f).read_text() for f in ("metrics.jsonl", "ledger.json", "summary.json")}
        for e in runs
    }
    ref = files["local"]
    for engine in ("ray", "flower"):
        np.testing.assert_allclose(runs[engine].weights, runs["local"].weights, atol=1e-5, rtol=0)
        rows = [json.loads(x) for x in files[engine]["metrics.jsonl"].splitlines()]
        _compare(rows, [json.loads(x) for x in ref["metrics.jsonl"].splitlines()], engine)
        assert json.loads(files[engine]["ledger.json"]) == json.loads(ref["ledger.json"])
        summary, ref_summary = json.loads(files[engine]["summary.json"]), json.loads(ref["summary.json"])
        summary["non_private"].pop("timings"), ref_summary["non_private"].pop("timings")
        # which engine ran: the one asked for, by name (nothing else of the summary may differ)
        assert summary.pop("engine")["requested"] == engine and ref_summary.pop("engine")["name"] == "local"
        _compare(summary, ref_summary, engine)
