"""The round loop in parts (fedsim.loop): an error in a round leaves every earlier round's row written, the run
directory finished and the accountant thread shut down; the background epsilon settles one row at a time."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from fedsim.engine.local_engine import LocalEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.loop import BackgroundEpsilon, run_rounds
from fedsim.scenarios import load_scenario

SMALL = ["engine.name=local", "data.num_clients=20", "privacy.sampling_rate=0.3", "engine.checkpoint_every=0"]


def _accountant_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fedsim-accountant")]


class BreaksInRound(LocalEngine):
    """The local engine, except that training round ``broken`` raises (the engine, not a client, fails)."""

    def __init__(self, data, settings, broken: int) -> None:
        super().__init__(data, settings)
        self.broken = broken
        self.rounds: list[int] = []

    def train(self, plan, weights):
        self.rounds.append(plan.round)
        if plan.round == self.broken:
            raise RuntimeError(f"engine broke in round {plan.round}")
        return super().train(plan, weights)


def test_an_error_in_round_3_keeps_rows_1_and_2_and_finishes_the_run_directory(tmp_path):
    scenario = load_scenario("quickstart", [*SMALL, "rounds=4"])
    exp = build_experiment(scenario)
    engine = BreaksInRound(exp.data, exp.settings, broken=3)
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="engine broke in round 3"):
        run_scenario(scenario, tmp_path / "run", engine=engine, on_row=lambda row: seen.append(row["round"]))
    assert engine.rounds == [1, 2, 3]
    # round 2's epsilon was still being computed when round 3 raised: its row is written all the same
    assert seen == [1, 2]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all(np.isfinite(r["epsilon"]) for r in rows)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary and ledger  # the run directory is finished: ledger, summary and model written
    assert (tmp_path / "run" / "model.npz").is_file()
    assert not _accountant_threads()


def test_the_rows_of_a_run_in_parts_are_those_of_the_strategy_and_the_ledger():
    exp = build_experiment(load_scenario("quickstart", [*SMALL, "rounds=3", "engine.eval_every=2"]))
    result = run_rounds(exp, LocalEngine(exp.data, exp.settings))
    assert [r["round"] for r in result.rows] == [1, 2, 3]
    assert [r["epsilon"] for r in result.rows] == [h["epsilon"] for h in result.strategy.history]
    assert all("round_index" not in r for r in result.rows)
    # evaluated every second round and at the end; every row has its round's timing
    assert ["heldout_accuracy" in r for r in result.rows] == [False, True, True]
    assert all(r["non_private"]["round_time_s"] >= r["non_private"]["train_time_s"] for r in result.rows)
    assert result.stopped_by is None and result.timings["rounds_s"] > 0
    assert not _accountant_threads()


class _Strategy:
    """What BackgroundEpsilon needs of a strategy: ``epsilon()`` and ``history``."""

    def __init__(self, values) -> None:
        self.values = iter(values)
        self.history: list[dict] = []

    def epsilon(self) -> float:
        value = next(self.values)
        if isinstance(value, Exception):
            raise value
        return value


def test_background_epsilon_settles_one_row_at_a_time_and_closes_after_an_error():
    strategy = _Strategy([1.5, ValueError("accountant failed"), RuntimeError("again")])
    done: list[dict] = []
    accounting = BackgroundEpsilon(strategy, done.append)
    accounting.settle()  # nothing pending: nothing happens
    strategy.history.append({})
    accounting.submit({"round": 1, "round_index": 0})
    assert accounting.pending
    accounting.settle()
    assert done == [{"round": 1, "epsilon": 1.5}] and strategy.history == [{"epsilon": 1.5}]
    assert not accounting.pending
    strategy.history.append({})
    accounting.submit({"round": 2, "round_index": 1})
    with pytest.raises(ValueError, match="accountant failed"):
        accounting.settle()
    assert not accounting.pending  # a failed epsilon is not settled twice
    strategy.history.append({})
    accounting.submit({"round": 3, "round_index": 2})
    accounting.close()  # the run is failing already: the pending row's error is not raised again
    assert [r["round"] for r in done] == [1] and not _accountant_threads()
