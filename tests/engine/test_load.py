"""Load: one round with 10,000 sampled clients (Synthetic(1, 1), fixed-size sampling from 12,000) completes through
``fedsim run`` and counts every client. Time and the process tree's peak memory are measured by
``benchmarks/scale.py --per-round 10000`` (a timed test would measure this machine, not fedsim)."""

from __future__ import annotations

import json

from fedsim.cli import main


def test_a_round_of_ten_thousand_sampled_clients_completes(tmp_path):
    out = tmp_path / "load"
    sets = [
        "data.dataset=synthetic",
        "data.num_clients=12000",
        "data.heldout_fraction=0",
        "data.synthetic_max_samples=50",
        "privacy.sampling=fixed",
        "privacy.sampling_rate=none",
        "privacy.clients_per_round=10000",
        "rounds=1",
        "engine.name=local",
        "model.name=logreg",
        "model.hidden=none",
        "client.local_epochs=1",
    ]
    argv = ["run", "quickstart", "--no-progress", "--out", str(out)]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    diag = row["non_private"]
    assert diag["cohort"] == diag["received"] == 10_000 and diag["rejected"] == 0
    assert row["local_training"] == "per-layer" and row["epsilon"] > 0
