"""A run stopped by its privacy budget ends cleanly with its own exit code; every run directory says what code
and which library versions produced it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fedsim.cli import EXIT_BUDGET, main

ROOT = Path(__file__).resolve().parents[2]


def test_max_epsilon_stops_before_the_round_that_would_exceed_it(tmp_path, capsys):
    out = tmp_path / "budget"
    args = ["run", "quickstart", "--no-progress", "--out", str(out)]
    for s in ("rounds=12", "engine.name=local", "privacy.max_epsilon=4.0", "data.num_clients=30"):
        args += ["--set", s]
    assert main(args) == EXIT_BUDGET == 3
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("budget: stopping before round ")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= len(rows) < 12 and all(r["epsilon"] <= 4.0 for r in rows)
    assert f"stopping before round {len(rows) + 1}" in printed[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == len(rows) and summary["stopped_reason"].startswith(
        "stopping before"
    )
    assert len(json.loads((out / "ledger.json").read_text())["releases"]) >= len(rows)


def test_the_run_directory_records_versions_and_the_commit(tmp_path):
    out = tmp_path / "prov"
    args = [
        "run",
        "quickstart",
        "--no-progress",
        "--out",
        str(out),
        "--set",
        "rounds=1",
        "--set",
        "engine.name=local",
    ]
    assert main(args) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["fedsim"] and prov["python"]
    for lib in ("torch", "flwr", "ray", "dp-accounting"):
        assert prov["libraries"][lib], lib
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # this checkout is fedsim's source: the commit it ran is recorded
        assert prov["git"]["commit"] == head.stdout.strip() and isinstance(prov["git"]["dirty"], bool)
