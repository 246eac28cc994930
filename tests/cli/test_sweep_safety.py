"""``fedsim sweep`` never reports or runs again a run under settings other than its own: a restart into the same
``--out`` with other settings is refused before anything runs (or, with ``--new-run-dirs``, goes to a new run
directory beside the old one), a killed run that drew from the operating system is never run again, a run stopped
by client failures is a failure, and Ray does not retry a sweep's tasks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedsim import sweep
from fedsim.cli import main
from fedsim.report import sweep_figure, sweep_table
from fedsim.scenarios import load_scenario

TINY = ["--set", "rounds=2", "--set", "data.num_clients=40"]
#: one run (one setting, one seed) of noise-sweep, on the in-process engine
ONE = ["sweep", "noise-sweep", "--grid", "privacy.sampling=poisson", "--seeds", "1", "--parallel", "1", *TINY]


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """The plots are most of a tiny run's time, and tests/cli/test_sweep_and_report.py draws them."""
    from fedsim.report.rundir import RunWriter

    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])
    monkeypatch.setattr(sweep_figure, "plot_privacy_utility", lambda *a, **k: None)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _files(root: Path) -> dict[Path, tuple[int, bytes]]:
    """Every file under ``root`` with its modification time and contents."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def _sweep(out: Path, *extra: str) -> int:
    return main([*ONE, "--out", str(out), *extra])


def test_a_restart_with_other_settings_is_refused_before_anything_runs_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "s"
    assert _sweep(out, "--set", "privacy.noise_multiplier=1.0") == 0
    run = out / "sampling=poisson" / "seed0"
    before = _files(out)
    capsys.readouterr()
    assert _sweep(out, "--set", "privacy.noise_multiplier=0.5") == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error: ") and "Traceback" not in err
    assert f"{run}: privacy.noise_multiplier: 1.0 in the run, 0.5 planned" in err
    assert "--new-run-dirs" in err
    assert _files(out) == before  # nothing run, moved or rewritten, sweep.csv included

    # killed (no summary.json), seeded, with a checkpoint or not: still not resumed, nor moved aside, under
    # settings other than its own
    (run / "summary.json").unlink()
    before = _files(out)
    assert _sweep(out, "--set", "privacy.noise_multiplier=0.5", "--set", "client.lr=0.2") == 2
    err = capsys.readouterr().err
    assert "privacy.noise_multiplier: 1.0 in the run, 0.5 planned" in err
    assert "client.lr: 0.1 in the run, 0.2 planned" in err
    assert _files(out) == before and sorted(p.name for p in run.parent.iterdir()) == ["seed0"]


def test_a_killed_seeded_run_with_a_checkpoint_is_resumed_only_under_its_own_config(tmp_path, capsys):
    out = tmp_path / "s"
    ckpt = ["--set", "engine.checkpoint_every=1"]
    assert _sweep(out, *ckpt) == 0
    run = out / "sampling=poisson" / "seed0"
    eps = json.loads((run / "summary.json").read_text())["final"]["epsilon"]
    (run / "summary.json").unlink()  # killed after its checkpoint
    assert (run / "checkpoint.npz").is_file()
    before = _files(out)
    assert _sweep(out, *ckpt, "--set", "privacy.clip=2.0") == 2
    assert f"{run}: privacy.clip: 1.0 in the run, 2.0 planned" in capsys.readouterr().err
    assert _files(out) == before
    assert _sweep(out, *ckpt) == 0
    (row,) = _csv(out / "sweep.csv")
    assert row["status"] == "resumed" and row["run_dir"] == str(run)
    assert float(row["epsilon"]) == pytest.approx(eps, rel=1e-5)


def test_new_run_dirs_starts_a_new_directory_beside_the_old_one_with_the_right_epsilon(tmp_path, capsys):
    out = tmp_path / "s"
    assert _sweep(out, "--set", "privacy.noise_multiplier=1.0") == 0
    old = out / "sampling=poisson" / "seed0"
    old_files = _files(old)
    old_eps = float(_csv(out / "sweep.csv")[0]["epsilon"])
    assert _sweep(out, "--set", "privacy.noise_multiplier=0.5", "--new-run-dirs") == 0
    new = out / "sampling=poisson" / "seed0.2"
    assert _files(old) == old_files  # the old run is kept as it was
    assert load_scenario(str(new / "config.toml")).privacy.noise_multiplier == 0.5
    printed = capsys.readouterr().out
    assert f"{old} holds a run of other settings" in printed
    # third audit: the old run trained the same clients (same seed and data); its 2 released rounds are not
    # composed with the new run's epsilon, and that is said where the run starts and in its row
    said = f"{old}: 2 rounds released on the same clients (same seed and data), not composed with this run's epsilon"
    assert said in " ".join(printed.split())
    assert _csv(out / "sweep.csv")[0]["uncomposed_releases"] == said
    # the epsilon reported is the new run's, the one a fresh sweep of these settings certifies
    assert _sweep(tmp_path / "fresh", "--set", "privacy.noise_multiplier=0.5") == 0
    fresh = float(_csv(tmp_path / "fresh" / "sweep.csv")[0]["epsilon"])
    (row,) = _csv(out / "sweep.csv")
    assert row["status"] == "done" and row["run_dir"] == str(new)
    assert float(row["epsilon"]) == fresh > old_eps
    assert fresh == pytest.approx(
        json.loads((new / "summary.json").read_text())["final"]["epsilon"], rel=1e-5
    )

    # a later sweep of either setting finds its own run, flag or not, and runs nothing
    for z, where, eps in (("0.5", new, fresh), ("1.0", old, old_eps)):
        assert _sweep(out, "--set", f"privacy.noise_multiplier={z}") == 0
        (row,) = _csv(out / "sweep.csv")
        assert (row["status"], row["run_dir"], float(row["epsilon"])) == (
            "skipped: finished before",
            str(where),
            eps,
        )
    # a third setting gets the next directory
    assert _sweep(out, "--set", "privacy.noise_multiplier=0.7", "--new-run-dirs") == 0
    assert _csv(out / "sweep.csv")[0]["run_dir"] == str(out / "sampling=poisson" / "seed0.3")
    assert _files(old) == old_files


def test_a_killed_run_that_drew_from_the_operating_system_is_never_run_again(tmp_path, capsys):
    out = tmp_path / "s"
    entropy = ["--set", "privacy.randomness=os-entropy"]
    assert _sweep(out, *entropy) == 0
    run = out / "sampling=poisson" / "seed0"
    assert load_scenario(str(run / "config.toml")).privacy.randomness == "os-entropy"
    assert _sweep(out, *entropy) == 0  # finished: reported as it is, not run again
    assert _csv(out / "sweep.csv")[0]["status"] == "skipped: finished before"
    (run / "summary.json").unlink()  # killed
    before = _files(out)
    capsys.readouterr()
    for flag in ([], ["--new-run-dirs"]):
        assert _sweep(out, *entropy, *flag) == 2
        err = capsys.readouterr().err
        assert err.startswith("fedsim: error: ") and f"{run} is a run that was killed" in err
        assert "privacy.randomness = 'os-entropy'" in err and "never runs it again" in err
        assert _files(out) == before  # not moved aside (seed0.incomplete-1), not resumed, not rerun
        assert sorted(p.name for p in run.parent.iterdir()) == ["seed0"]
    # the run on its own (as a Ray task calls it) refuses the same
    overrides = sweep.plan_sweep(
        "noise-sweep",
        sets=[*TINY[1::2], "privacy.randomness=os-entropy"],
        grid={"privacy.sampling": ["poisson"]},
        seeds=1,
        out=out,
    )[1][0].overrides
    row = sweep.execute("noise-sweep", overrides, str(run))
    assert row["status"].startswith("failed: refused, nothing changed") and sweep_table.run_failed(row)
    assert _files(out) == before


def test_execute_alone_never_reports_a_directory_of_other_settings(tmp_path):
    out = tmp_path / "s"
    assert _sweep(out, "--set", "privacy.noise_multiplier=1.0") == 0
    run = out / "sampling=poisson" / "seed0"
    before = _files(out)
    _, (planned,) = sweep.plan_sweep(
        "noise-sweep",
        sets=[*TINY[1::2], "privacy.noise_multiplier=0.5"],
        grid={"privacy.sampling": ["poisson"]},
        seeds=1,
        out=out,
    )
    row = sweep.execute("noise-sweep", planned.overrides, str(run))
    assert row["status"].startswith("failed: refused, nothing changed")
    assert "privacy.noise_multiplier: 1.0 in the run, 0.5 planned" in row["status"] and "epsilon" not in row
    assert _files(out) == before


def test_a_run_stopped_by_failures_is_a_failure_and_one_stopped_by_the_budget_a_finish(tmp_path, capsys):
    out = tmp_path / "s"
    # client.lr = 3e38 diverges at once: every client's update is non-finite, so round 2 is not released
    argv = ["sweep", "noise-sweep", "--grid", "client.lr=0.1,3e38", "--seeds", "1", "--parallel", "1", *TINY]
    for attempt in ("first", "restart"):
        assert main([*argv, "--out", str(out)]) == 1, attempt
        ok, stopped = _csv(out / "sweep.csv")
        assert ok["status"] in ("done", "skipped: finished before")
        assert stopped["status"].startswith("failed: stopped by failures at round"), stopped["status"]
        assert "not released" in stopped["status"]
        printed = capsys.readouterr().out
        assert "1 of 2 runs failed" in printed and str(out / "lr=3e+38" / "seed0") in printed
    # privacy.max_epsilon below one round's epsilon: stopped before round 1, a normal finish
    budget = ["sweep", "noise-sweep", "--grid", "privacy.max_epsilon=0.01", "--seeds", "1", "--parallel", "1"]
    assert main([*budget, *TINY, "--out", str(tmp_path / "b")]) == 0
    assert _csv(tmp_path / "b" / "sweep.csv")[0]["status"] == "done; stopped by budget"


def test_an_out_that_is_a_file_is_bad_input(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert _sweep(target) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error: --out ") and "is a file" in err and "Traceback" not in err
    assert target.read_text() == "keep me"
    # a run directory's place taken by a file: named, nothing run
    out = tmp_path / "s"
    (out / "sampling=poisson").mkdir(parents=True)
    (out / "sampling=poisson" / "seed0").write_text("not a run")
    seed0 = out / "sampling=poisson" / "seed0"
    assert _sweep(out) == 2
    err = capsys.readouterr().err
    assert f"{seed0} is a file" in err and f"{seed0}: {seed0}" not in err
    assert not (out / "sweep.csv").exists()
    assert _sweep(out, "--new-run-dirs") == 0  # beside it; the file is left as it is
    assert _csv(out / "sweep.csv")[0]["run_dir"] == str(out / "sampling=poisson" / "seed0.2")
    assert seed0.read_text() == "not a run"


def test_ray_never_retries_a_sweep_task_and_a_lost_task_is_a_failed_row():
    pytest.importorskip("ray")
    options = sweep.remote_execute()._default_options
    assert options["max_retries"] == 0
    run = sweep_table.SweepRun({}, 0, [], Path("x/seed0"))
    row = sweep.lost_task(run, RuntimeError("the worker died"))
    assert row["status"].startswith("failed: its Ray task died") and sweep_table.run_failed(row)


def test_config_differences_name_each_dotted_key_and_ignore_only_what_a_sweep_sets():
    run = {"privacy": {"noise_multiplier": 1.0, "clip": 1.0}, "rounds": 2, "engine": {"name": "ray"}}
    plan = {
        "privacy": {"noise_multiplier": 0.5, "clip": 1.0, "randomness": "seeded"},
        "rounds": 2.0,
        "engine": {"name": "local"},
        "sweep": {"seeds": 3},
    }
    assert sweep.config_differences(run, plan) == [
        "privacy.noise_multiplier: 1.0 in the run, 0.5 planned",
        'privacy.randomness: absent in the run, "seeded" planned',
        "rounds: 2 in the run, 2.0 planned",
    ]
    assert sweep.config_differences(plan, plan) == []
