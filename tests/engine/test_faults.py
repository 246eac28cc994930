"""Clients that fail inside a round, for real (``tests/faulty.py``): an exception in local training, a NaN update,
a client that hangs past ``engine.round_timeout_s`` and a Ray worker process killed mid-round.

The round completes with the other clients; each failure is a zero update counted in the row (``non_private.failed``);
the noise and the accounting are those of a round without failures; a dead or hung worker is replaced before the
next round and its clients are never counted twice.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from faulty import scenario_file as scenario

from fedsim.cli import EXIT_FAILURES, main
from fedsim.engine.ray_engine import LocalEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.scenarios import ScenarioError, load_scenario


@pytest.mark.parametrize("vectorize", ["per-layer", "loop"])
def test_a_failed_client_is_a_zero_update_and_the_others_train(tmp_path, vectorize):
    exp = build_experiment(
        load_scenario(str(scenario(tmp_path, faults={2: "raise", 5: "nan"}, vectorize=vectorize)))
    )
    engine = LocalEngine(exp.data, exp.settings)
    assert engine.trainer.path.name == vectorize
    plan = exp.strategy.begin_round(1, exp.train_ids)
    partial, metrics = engine.train(plan, exp.initial_weights)

    assert partial.failures == {"error": 1, "non_finite": 1} and partial.rejected == 2 and partial.count == 6
    failed = {m["client"]: m for m in metrics if "failed" in m}
    assert failed[2]["failed"] == "error" and "injected fault" in failed[2]["error"]
    assert failed[5]["failed"] == "non_finite"
    assert [m["client"] for m in metrics] == list(range(8))  # every sampled client, once
    # the others' updates are exactly what they would be without the failed clients in the cohort
    good = np.array([c for c in range(8) if c not in (2, 5)])
    ref, _ = engine.train(dataclasses.replace(plan, cohort=good), exp.initial_weights)
    assert ref.failures == {} and ref.count == 6
    np.testing.assert_allclose(partial.total, ref.total, rtol=1e-6, atol=1e-7)


def test_failures_leave_the_noise_and_the_ledger_as_planned(tmp_path):
    faulty = run_scenario(
        load_scenario(str(scenario(tmp_path, faults={1: "raise", 6: "nan"}))), tmp_path / "faulty"
    )
    clean = run_scenario(load_scenario(str(scenario(tmp_path, name="clean"))), tmp_path / "clean")
    for row in faulty.rows:
        assert row["non_private"]["failed"] == {"error": 1, "non_finite": 1}
        assert row["non_private"]["received"] == 6 and row["non_private"]["cohort"] == 8
    for a, b in zip(faulty.rows, clean.rows, strict=True):
        assert a["noise_std_sum"] == b["noise_std_sum"] and a["epsilon"] == b["epsilon"]
    assert [r["non_private"]["failed"] for r in clean.rows] == [{}, {}]
    ledger = json.loads((tmp_path / "faulty" / "ledger.json").read_text())
    assert ledger == json.loads((tmp_path / "clean" / "ledger.json").read_text())
    summary = json.loads((tmp_path / "faulty" / "summary.json").read_text())
    assert summary["non_private_failed_clients"] == {"error": 2, "non_finite": 2}


def test_a_round_where_most_clients_fail_stops_the_run_unreleased(tmp_path, capsys):
    path = scenario(tmp_path, faults={0: "raise", 1: "raise", 2: "raise", 3: "nan", 4: "raise"})
    out = tmp_path / "run"
    assert main(["run", str(path), "--no-progress", "--out", str(out)]) == EXIT_FAILURES == 4
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # exact failure counts: the line says it is non-private
    assert last.startswith(
        "failures (non-private: exact counts about clients, not covered by epsilon): stopping at round 1: 5 of "
        "its 8 sampled clients failed (error 4, non_finite 1)"
    )
    assert "engine.max_failed_fraction=0.5" in last and "injected fault" in last
    summary = json.loads((out / "summary.json").read_text())
    # a stop by failures is an exact fact about clients: under non_private, not at the top level
    stop = summary["non_private"]
    assert stop["stopped_by"] == "failures" and stop["rounds_completed"] == 0
    assert not {"stopped_by", "stopped_reason", "rounds_completed"} & set(summary)
    assert (
        json.loads((out / "ledger.json").read_text())["releases"] == []
    )  # nothing released, nothing accounted


def test_a_round_timeout_needs_an_engine_that_can_stop_a_client():
    with pytest.raises(ScenarioError, match=r"round_timeout_s needs engine.name 'ray' or 'flower'"):
        load_scenario("quickstart", ["engine.name=local", "engine.round_timeout_s=5"])


def test_ray_a_hung_client_and_a_killed_worker(tmp_path):
    """One Ray run, two workers, 12 clients on the loop (so each client is its own unit of work): per round client 0
    raises, client 2 gives NaN, client 10 kills its worker process (os.kill SIGKILL) and client 11 sleeps 60 s, past
    the 4 s round timeout. Shares alternate (balance): worker 0 has the even clients, worker 1 the odd ones."""
    faults = {0: "raise", 2: "nan", 10: "kill", 11: "sleep"}
    extra = "round_timeout_s = 4.0"
    s = load_scenario(
        str(scenario(tmp_path, clients=12, faults=faults, engine="ray", vectorize="loop", extra=extra))
    )
    exp = build_experiment(s)
    from fedsim.engine.ray_engine import RayEngine, balance
    from fedsim.loop import run_rounds

    sizes = np.array([exp.data.num_examples(int(c)) for c in exp.train_ids])
    assert balance(exp.train_ids, sizes, 2) == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]
    engine = RayEngine(exp.data, exp.settings, num_workers=2, num_cpus=1.0, round_timeout_s=4.0)
    try:
        pids = [info["pid"] for info in engine.infos]
        result = run_rounds(exp, engine)
        replaced = list(engine.replaced)
        after = [info["pid"] for info in engine.infos]
    finally:
        engine.close()
    assert len(result.rows) == 2
    for row in result.rows:
        diag = row["non_private"]
        # only the four faulty clients are zero updates: the clients that the killed worker (or the timed-out one)
        # had not reported are trained again alone, and only the killer and the sleeper fail there too
        assert diag["failed"] == {"error": 1, "non_finite": 1, "worker_lost": 1, "timeout": 1}, diag
        assert diag["received"] == 8 and diag["cohort"] == 12, diag
        assert diag["train_time_s"] < 40  # the round did not wait for the 60 s sleeper
    # per round: both workers replaced after the first pass (worker 0 lost, worker 1 timed out), then the workers
    # that trained the killer and the sleeper alone; each before the round ended (fresh processes)
    assert sorted(r["why"].split()[0] for r in replaced) == ["timeout"] * 4 + ["worker_lost"] * 4
    assert sum("training client" in r["why"] and "alone" in r["why"] for r in replaced) == 4
    assert set(after).isdisjoint(pids) and all(r["new_pid"] != r["old_pid"] for r in replaced)
    # the failures changed neither the noise nor the accounting
    clean = build_experiment(load_scenario(str(scenario(tmp_path, clients=12, name="clean"))))
    ref = run_rounds(clean, LocalEngine(clean.data, clean.settings))
    assert [r["epsilon"] for r in result.rows] == [r["epsilon"] for r in ref.rows]
    assert result.strategy.ledger.to_dict() == ref.strategy.ledger.to_dict()


def test_ray_one_clients_fault_never_changes_another_clients_contribution(tmp_path):
    """The neighbouring-datasets measurement of a round on the Ray engine: the cohort with a faulty client (D) and
    without it (D'). Whatever the faulty client does (raise, hang past the deadline, kill its worker process), the
    clipped sum differs by at most one clip, the sensitivity the ledger accounts. Clients 0, 1, 2 raise, hang
    and kill; each is put first in its worker's share of a vectorised chunk, with a clip so small that every
    update is clipped to it: a lost chunk would move the sum by several clips (2.45 x clip measured before)."""
    faults = {0: "raise", 1: "sleep", 2: "kill", 9: "kill_eval"}
    s = load_scenario(
        str(
            scenario(
                tmp_path,
                clients=10,
                faults=faults,
                engine="ray",
                vectorize="per-layer",
                extra="round_timeout_s = 4.0",
            )
        )
    )
    exp = build_experiment(s)
    from fedsim.engine.ray_engine import RayEngine

    clip = 0.01
    good = np.arange(3, 9)
    engine = RayEngine(exp.data, exp.settings, num_workers=2, num_cpus=1.0, round_timeout_s=4.0)
    try:
        assert {info["pid"] for info in engine.infos}
        plan = exp.strategy.begin_round(1, exp.train_ids)
        plan = dataclasses.replace(
            plan, mechanism=plan.mechanism.replace(clip=clip)
        )  # the clip is the mechanism's
        ref, ref_metrics = engine.train(dataclasses.replace(plan, cohort=good), exp.initial_weights)
        assert ref.failures == {} and ref.count == good.size
        assert all(
            m["update_norm"] > clip for m in ref_metrics
        )  # every update is clipped: each weighs one clip
        for client, reason in [(0, "error"), (1, "timeout"), (2, "worker_lost")]:
            cohort = np.concatenate([[client], good])
            partial, metrics = engine.train(dataclasses.replace(plan, cohort=cohort), exp.initial_weights)
            moved = float(np.linalg.norm(partial.total - ref.total))
            assert moved <= clip * (1 + 1e-6), (reason, moved / clip)
            # only the faulty client is a zero update; every other client is in the sum, once
            assert partial.failures == {reason: 1} and partial.count == good.size, (reason, partial.failures)
            assert sorted(m["client"] for m in metrics) == sorted(cohort.tolist())
            np.testing.assert_allclose(partial.total, ref.total, rtol=1e-6, atol=1e-9)
        # evaluation isolates a fault the same way: client 9's evaluation kills its worker, the others are evaluated
        rows = engine.evaluate(np.arange(3, 10), exp.initial_weights)
        assert sorted(rows[:, 0].astype(int).tolist()) == list(range(3, 9))
        assert sorted(engine.evaluate(good, exp.initial_weights)[:, 0].astype(int).tolist()) == good.tolist()
    finally:
        engine.close()
