"""The default scenario end to end through the command line, on the engine ``engine.name = "auto"`` picks.

One run for the whole file: the quickstart run (30 rounds) is the real thing a user gets from `make run`; its
certified epsilon is checked against dp-accounting computed here independently.
"""

import json
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "quickstart"
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "run", "quickstart", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows, r.stdout


def test_quickstart_writes_the_run_directory(quickstart_run):
    out, rows, stdout = quickstart_run
    for name in ("config.toml", "metrics.jsonl", "ledger.json", "summary.json", "data.json"):
        assert (out / name).is_file(), name
    assert len(rows) == 30 and [r["round"] for r in rows] == list(range(1, 31))
    assert "round  30/30" in stdout and "certified epsilon" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 30
    # which engine ran it and why, in the summary and the output; where the time went
    engine = summary["engine"]
    assert engine["requested"] == "auto" and engine["name"] in ("local", "ray") and engine["why"]
    assert f"engine: {engine['name']} (picked by engine.name='auto'" in stdout
    timings = summary["non_private"]["timings"]
    assert timings["startup_s"] > 0  # the interpreter and the imports, before the run's first step (Linux)
    assert timings["first_round_s"] > 0 and "first_round_extra_s" in timings
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger  # serialised releases


def test_quickstart_learns(quickstart_run):
    _, rows, _ = quickstart_run
    last = rows[-1]
    # 10 classes: chance is 0.1
    assert last["heldout_accuracy"] > 0.5, last
    diag = last["non_private"]
    assert diag["train_accuracy"] > 0.5
    assert abs(diag["gap_accuracy"] - (diag["train_accuracy"] - last["heldout_accuracy"])) < 1e-12
    # every round reported its cohort and every sampled client's update arrived
    assert all(
        r["non_private"]["received"] == r["non_private"]["cohort"] and r["non_private"]["rejected"] == 0
        for r in rows
    )


def test_quickstart_epsilon_matches_dp_accounting(quickstart_run):
    out, rows, _ = quickstart_run
    from fedsim.scenarios import load_scenario

    s = load_scenario(str(out / "config.toml"))
    q, z, delta = s.privacy.sampling_rate, s.privacy.noise_multiplier, s.privacy.delta
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    for t in (1, 10, 30):
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(event, t)
        expected = acc.get_epsilon(delta)
        got = rows[t - 1]["epsilon"]
        # never below the independent computation, and tight
        assert got >= expected * (1 - 1e-9), (t, got, expected)
        assert got == pytest.approx(expected, rel=0.02), (t, got, expected)
    eps = np.array([r["epsilon"] for r in rows])
    assert np.all(np.diff(eps) > 0)
    assert all(r["generalization"]["status"] in ("ok", "no-statement", "vacuous") for r in rows)
