"""Everything exact about clients that a run writes or shows is labelled non-private (``privacy_scope`` lists it),
``local_training`` is the configured path in every row, and an infinite epsilon is strict JSON with its reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from faulty import scenario_file

from fedsim.cli import EXIT_FAILURES, FAILURES_LABEL, main
from fedsim.engine.runner import run_scenario
from fedsim.loop import training_path
from fedsim.report.rows import (
    CONSOLE_NON_PRIVATE,
    PRIVACY_SCOPE,
    format_row,
    summary,
    summary_stop,
    summary_timings,
)
from fedsim.report.rundir import DATA_PUBLIC_KEYS, RunWriter, data_description, json_safe
from fedsim.scenarios import load_scenario

TINY = ["engine.name=local", "rounds=2", "data.num_clients=12"]


def _strict(text: str):
    """``json.loads`` that refuses the non-standard NaN / Infinity tokens."""

    def refuse(token: str):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _rows(run_dir: Path) -> list[dict]:
    return [_strict(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("labels") / "run"
    res = run_scenario(load_scenario("quickstart", TINY), out)
    return out, res


# ---------------------------------------------------------------------------------------------------- data.json
def test_data_json_keeps_the_exact_partition_statistics_under_non_private(tiny_run):
    out, _ = tiny_run
    data = _strict((out / "data.json").read_text())
    exact = data["non_private"]
    assert "epsilon does not cover" in exact["note"]
    for key in ("examples_per_client", "mean_client_label_entropy", "num_examples"):
        assert key in exact and key not in data, key
    assert set(data) - {"non_private"} <= DATA_PUBLIC_KEYS
    assert (
        data["num_clients"] == 12 and data["input_shape"] == [1, 8, 8] and data["partitioner"] == "dirichlet"
    )
    assert "data.json" in PRIVACY_SCOPE


def test_any_writer_of_data_json_labels_it_and_an_unknown_statistic_is_non_private(tmp_path):
    # the deployed ServerApp writes data.json with write_json("data.json", data.describe()): labelled all the same
    writer = RunWriter(tmp_path)
    described = {"dataset": "digits", "num_clients": 3, "examples_per_client": {"min": 1}, "new_statistic": 7}
    writer.write_json("data.json", described)
    writer.close()
    data = _strict((tmp_path / "data.json").read_text())
    assert data["dataset"] == "digits" and data["num_clients"] == 3
    assert data["non_private"]["examples_per_client"] == {"min": 1}
    assert data["non_private"]["new_statistic"] == 7  # not known to be public: labelled (fails closed)
    assert data_description(data) == data  # labelled once


# ------------------------------------------------------------------------------------------------- summary.json
def test_summary_timings_are_under_non_private_and_listed_in_the_scope(tiny_run):
    out, _ = tiny_run
    s = _strict((out / "summary.json").read_text())
    assert "timings" not in s and s["non_private"]["timings"]["total_s"] > 0
    assert "epsilon does not cover" in s["non_private"]["note"]
    # a run of every round: how many and why it stopped are public
    assert s["rounds_completed"] == 2 and s["stopped_by"] is None and s["stopped_reason"] is None
    assert summary_timings(s) == s["non_private"]["timings"]
    assert summary_stop(s) == {
        "rounds_completed": 2,
        "stopped_by": None,
        "stopped_reason": None,
        "non_private": False,
    }
    for listed in (
        "timings",
        "stopped_by",
        "rounds_completed",
        "accuracy.png",
        "'failures' line",
        "data.json",
    ):
        assert listed in s["privacy_scope"], listed


def _fake(rounds: int = 5):
    scenario = SimpleNamespace(
        name="fake",
        rounds=rounds,
        privacy=SimpleNamespace(delta=1e-5, accountant="pld", noise_multiplier=1.0, target_epsilon=None),
    )
    return scenario, SimpleNamespace(randomness="seeded")


@pytest.mark.parametrize("diagnostics", [True, False])
def test_a_stop_by_failures_is_non_private_and_a_stop_by_the_budget_is_public(diagnostics):
    scenario, strategy = _fake()
    rows = [{"round": 1, "epsilon": 1.0, "non_private": {"failed": {"error": 1}}}]
    timings = {"total_s": 1.5}
    failed = summary(
        scenario, rows, strategy, "stopping at round 2: ...", timings, 10, "failures", diagnostics
    )
    assert not {"stopped_by", "stopped_reason", "rounds_completed", "timings"} & set(failed)
    assert failed["non_private"]["stopped_by"] == "failures"
    assert failed["non_private"]["rounds_completed"] == 1
    assert failed["non_private"]["stopped_reason"] == "stopping at round 2: ..."
    assert ("timings" in failed["non_private"]) is diagnostics  # a deployment writes them only when asked
    assert summary_stop(failed) == {
        "rounds_completed": 1,
        "stopped_by": "failures",
        "stopped_reason": "stopping at round 2: ...",
        "non_private": True,
    }
    budget = summary(scenario, rows, strategy, "stopping before round 2", timings, 10, "budget", diagnostics)
    assert budget["stopped_by"] == "budget" and budget["rounds_completed"] == 1
    assert "stopped_by" not in budget["non_private"]


def test_summaries_written_before_this_layout_still_read():
    old = {
        "rounds_completed": 3,
        "stopped_by": "failures",
        "stopped_reason": "x",
        "timings": {"total_s": 2.0},
    }
    assert summary_stop(old)["stopped_by"] == "failures" and summary_timings(old) == {"total_s": 2.0}


def test_fedsim_report_labels_a_stop_by_failures(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    row = {
        "round": 1,
        "epsilon": 1.0,
        "delta": 1e-5,
        "accountant": "pld",
        "generalization": {"population": 8},
    }
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    scenario, strategy = _fake(3)
    s = summary(scenario, [row], strategy, "stopping at round 2: too many [failed]", {}, 8, "failures")
    (run / "summary.json").write_text(json.dumps(s))
    assert main(["report", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "rounds: 1 of 3; stopped (non-private: exact facts about clients" in printed
    assert "too many [failed]" in printed  # shown as written, not read as console markup


# ------------------------------------------------------------------------------------ exit 4: the console line
def test_the_exit_4_line_is_labelled_non_private(tmp_path, capsys):
    path = scenario_file(tmp_path, faults={0: "raise", 1: "raise", 2: "raise", 3: "raise", 4: "nan"})
    assert main(["run", str(path), "--no-progress", "--out", str(tmp_path / "run")]) == EXIT_FAILURES
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(FAILURES_LABEL + ": stopping at round 1: 5 of its 8") and "non-private" in last


# ------------------------------------------------------------------------------------ each round's console line
def _split_console_row(line: str) -> tuple[str, str]:
    """A round's console line as (what epsilon covers or is public, the '[non-private: ...]' group)."""
    head, sep, group = line.partition(CONSOLE_NON_PRIVATE)
    assert sep and line.count(CONSOLE_NON_PRIVATE) == 1, line
    assert group.endswith("]") and "]" not in group[:-1], line
    return head, group[:-1]


def test_a_rounds_console_line_groups_exactly_what_epsilon_does_not_cover():
    row = {
        "round": 4,
        "epsilon": 4.321,
        "delta": 1e-5,
        "accountant": "pld",
        "private": True,
        "heldout_loss": 1.234,
        "heldout_accuracy": 0.777,
        "heldout_perplexity": 3.45,
        "generalization": {"status": "no-statement"},
        "non_private": {
            "cohort": 123,
            "failed": {"error": 2, "timeout": 1},
            "train_loss": 9.876,
            "train_accuracy": 0.555,
            "gap_accuracy": -0.222,
        },
    }
    head, group = _split_console_row(format_row(row, 30))
    exact = ("cohort 123", "failed error=2 timeout=1", "train loss 9.876 acc 0.555", "gap -0.222")
    covered = ("round   4/30", "held-out loss 1.234 acc 0.777 ppl 3.45", "eps 4.321", "bound no-statement")
    for text in exact:
        assert text in group and text not in head, text
    for text in covered:
        assert text in head and text not in group, text
    assert "train" not in head and "cohort" not in head and "gap" not in head and "fail" not in head
    # a round without failures: no failure count is made up
    row["non_private"]["failed"] = {}
    assert "failed" not in format_row(row, 30)


def test_fedsim_run_prints_each_rounds_non_private_group(tmp_path, capsys):
    """Through the console (rich): the group is printed as text, not read as markup, failures inside it."""
    path = scenario_file(tmp_path, faults={2: "raise"})
    assert main(["run", str(path), "--no-progress", "--out", str(tmp_path / "run")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("round ")]
    assert len(lines) == 2
    for line in lines:
        head, group = _split_console_row(line)
        assert group.startswith(" cohort ") and ", failed error=1, train loss " in group and ", gap " in group
        assert " held-out loss " in head and " eps " in head and "cohort" not in head and "train" not in head
    assert "'[non-private: ...]' group of each round's line" in PRIVACY_SCOPE


# --------------------------------------------------------------------------------------------- local_training
def test_local_training_is_the_configured_path_in_every_row_even_with_an_empty_cohort(tiny_run):
    out, res = tiny_run
    rows = _rows(out)
    cohorts = [r["non_private"]["cohort"] for r in rows]
    assert 0 in cohorts and max(cohorts) > 0, cohorts  # seed 0, 11 clients at q = 0.2: round 1 samples nobody
    assert [r["local_training"] for r in rows] == ["per-layer", "per-layer"]
    assert all(r["local_training"] == "per-layer" for r in res.rows)


def test_local_training_stays_the_chosen_path_when_a_chunk_raised(tmp_path):
    # client 2 raises: its per-layer chunk is trained again client by client on the loop; the path stays per-layer
    path = scenario_file(tmp_path, faults={2: "raise"})
    res = run_scenario(load_scenario(str(path)), tmp_path / "run")
    assert [r["non_private"]["failed"] for r in res.rows] == [{"error": 1}] * 2
    assert [r["local_training"] for r in res.rows] == ["per-layer", "per-layer"]
    # what the clients ran on this round (exact: it says a chunk failed) is non-private
    assert all("loop" in r["non_private"]["local_training_used"] for r in res.rows)


def test_the_training_path_comes_from_the_engine_or_the_configuration():
    auto = SimpleNamespace(settings=SimpleNamespace(vectorize="auto"))
    assert training_path(SimpleNamespace(training_path="vmap"), auto) == "vmap"
    trainer = SimpleNamespace(path=SimpleNamespace(name="per-layer"))
    assert training_path(SimpleNamespace(trainer=trainer), auto) == "per-layer"
    loop = SimpleNamespace(settings=SimpleNamespace(vectorize=False))
    assert training_path(SimpleNamespace(), loop) == "loop"
    assert training_path(SimpleNamespace(), auto) is None  # not guessed from what some clients used


# --------------------------------------------------------------------------------------------- infinite epsilon
PRIVACY = [
    "privacy",
    "--json",
    "--population",
    "100",
    "--clients-per-round",
    "100",
    "--sampling",
    "fixed",
    "--noise-multiplier",
    "0.8",
    "--clip",
    "1",
    "--rounds",
    "200",
    "--delta",
    "1e-7",
    "--methods",
    "pld",
]


def test_fedsim_privacy_json_reports_an_infinite_epsilon_as_strict_json(capsys):
    assert main(PRIVACY) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    doc = _strict(captured.out)
    pld = doc["methods"]["pld"]
    assert pld["epsilon"][-1] is None and pld["status"][-1] == "no finite epsilon at this delta"
    assert pld["epsilon"][0] > 0  # the finite rounds are numbers
    last = doc["generalization"]["uai"][-1]
    assert last["epsilon"] is None and last["epsilon_reason"] == "infinite"


def test_json_safe_marks_infinities_and_leaves_nan_undefined():
    out = json_safe(
        {"a": math.inf, "b": -math.inf, "c": math.nan, "d": np.float64(2.0), "e": np.array([1.0, np.inf])}
    )
    assert out == {
        "a": None,
        "a_reason": "infinite",
        "b": None,
        "b_reason": "-infinite",
        "c": None,
        "d": 2.0,
        "e": [1.0, None],
    }
    assert json.dumps(out, allow_nan=False)


def test_a_run_with_an_infinite_epsilon_writes_strict_json_plots_and_reports(tmp_path, monkeypatch, capsys):
    from fedsim.strategies.dpfedavg import DPFedAvg

    monkeypatch.setattr(DPFedAvg, "epsilon", lambda self: math.inf)
    out = tmp_path / "run"
    sets = [arg for item in TINY for arg in ("--set", item)]
    assert main(["run", "quickstart", "--no-progress", "--out", str(out), *sets]) == 0
    assert "certified epsilon infinite" in capsys.readouterr().out
    for row in _rows(out):
        assert row["epsilon"] is None and row["epsilon_reason"] == "infinite"
        assert row["generalization"]["status"] == "no-statement"
    s = _strict((out / "summary.json").read_text())
    assert s["final"]["epsilon"] is None and s["final"]["epsilon_reason"] == "infinite"
    assert {"accuracy.png", "epsilon.png", "generalization.png"} <= {
        p.name for p in (out / "plots").iterdir()
    }
    assert main(["report", str(out)]) == 0
    assert "certified epsilon infinite (no finite epsilon at this delta)" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- accuracy.png
def test_the_accuracy_plot_labels_the_training_accuracy_and_the_gap_non_private(tmp_path, monkeypatch):
    from fedsim.report import plots

    seen: list[str] = []
    save = plots._save

    def capture(fig, path):
        for ax in fig.axes:
            seen.append("title: " + ax.get_title())
            legend = ax.get_legend()
            seen.extend("legend: " + t.get_text() for t in (legend.get_texts() if legend else []))
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", capture)
    rows = [
        {
            "round": t,
            "epsilon": 1.0,
            "delta": 1e-5,
            "accountant": "pld",
            "heldout_accuracy": 0.5,
            "non_private": {"train_accuracy": 0.6, "gap_accuracy": 0.1},
        }
        for t in (1, 2)
    ]
    plots.plot_accuracy({"name": "run", "rows": rows}, tmp_path / "accuracy.png")
    gap = [s for s in seen if s.startswith("legend: gap")]
    train = [s for s in seen if s.startswith("legend: training clients")]
    assert gap and "non-private" in gap[0], seen
    assert train and "non-private" in train[0], seen
    assert any(s.startswith("title: ") and "non-private" in s for s in seen), seen
