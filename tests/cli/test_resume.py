"""A run killed with SIGKILL in the middle finishes under ``fedsim run --resume`` exactly as a run never
interrupted: the same rows, ledger and final model; no round counted twice or lost. A bad checkpoint is a clear
error that changes nothing. ``--resume --set rounds=M`` extends a finished run to what a run of M rounds from
scratch gives; a finished run with no more rounds is left as it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.cli import main
from fedsim.engine import runner
from fedsim.privacy.settings import extension_refusal
from fedsim.report.checkpoint import CheckpointError, read_checkpoint, retarget_checkpoint
from fedsim.report.rundir import RunWriter

# adaptive clipping, a momentum server optimizer and Poisson sampling: every piece of state a checkpoint carries
SETTINGS = [
    "rounds=16",
    "engine.name=local",
    "engine.checkpoint_every=3",
    "data.num_clients=40",
    "privacy.adaptive_clip=true",
    "server.optimizer=momentum",
    "server.lr=0.5",
]
TIMING = {"train_time_s", "round_time_s"}


def _args(out: Path) -> list[str]:
    args = ["run", "quickstart", "--no-progress", "--out", str(out)]
    for s in SETTINGS:
        args += ["--set", s]
    return args


def _rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        for k in TIMING:
            r["non_private"].pop(k, None)
    return rows


def _kill_mid_run(out: Path, after_rows: int) -> int:
    """Start the run in its own process and SIGKILL it once ``after_rows`` rows are on disk."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim.cli", *_args(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= after_rows:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_run_resumes_to_the_same_result(tmp_path):
    ref = tmp_path / "whole"
    assert main(_args(ref)) == 0
    killed = tmp_path / "killed"
    assert _kill_mid_run(killed, after_rows=8) == -signal.SIGKILL
    done = len((killed / "metrics.jsonl").read_text().splitlines())
    assert 8 <= done < 16 and not (killed / "summary.json").exists()
    ckpt = json.loads(str(np.load(killed / "checkpoint.npz")["meta"]))
    assert ckpt["round"] in (6, 9, 12) and ckpt["round"] <= done

    assert main(["run", "--resume", str(killed), "--no-progress"]) == 0
    assert _rows(killed) == _rows(ref)  # rounds after the checkpoint were dropped and run again, once
    assert json.loads((killed / "ledger.json").read_text()) == json.loads((ref / "ledger.json").read_text())
    np.testing.assert_array_equal(
        np.load(killed / "model.npz")["weights"], np.load(ref / "model.npz")["weights"]
    )
    summary = json.loads((killed / "summary.json").read_text())
    assert (
        summary["rounds_completed"] == 16
        and summary["final"] == json.loads((ref / "summary.json").read_text())["final"]
    )


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other-config"])
def test_a_bad_checkpoint_is_a_clear_error_that_changes_nothing(tmp_path, capsys, damage):
    out = tmp_path / "run"
    assert main([*_args(out), "--set", "rounds=7"]) == 0  # checkpoints after rounds 3 and 6
    ckpt = out / "checkpoint.npz"
    if damage == "truncate":
        ckpt.write_bytes(ckpt.read_bytes()[:200])
    elif damage == "garbage":
        ckpt.write_bytes(os.urandom(4096))
    else:
        (out / "config.toml").write_text(
            (out / "config.toml").read_text().replace("rounds = 7", "rounds = 8")
        )
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.npz" in err and "nothing was changed" in err and "Traceback" not in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_run_that_drew_from_os_entropy_is_not_resumed(tmp_path, capsys):
    """Its rounds after the checkpoint were released with noise that cannot be drawn again: running them again
    would release more than the ledger accounts."""
    out = tmp_path / "os"
    assert main([*_args(out), "--set", "rounds=4", "--set", "privacy.randomness=os-entropy"]) == 0
    assert not (out / "checkpoint.npz").exists()  # a checkpoint it could never be resumed from is not written
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # nor extended: its new rounds would be fine, but not the old ones it would run again
    for more in ([], ["--set", "rounds=6"]):
        assert main(["run", "--resume", str(out), "--no-progress", *more]) == 2
        err = capsys.readouterr().err
        assert "--resume needs privacy.randomness = 'seeded'" in err and "nothing was changed" in err
        assert "Traceback" not in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_refuses_what_would_change_the_run(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path), "quickstart"]) == 2
    assert "give no scenario or --out" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nothing-here")]) == 2
    assert "config.toml" in capsys.readouterr().err


def _files(out: Path) -> dict[Path, bytes]:
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "model.pt", weights_only=True)


@pytest.mark.parametrize(
    ("written", "eval_every"),
    [
        ("checkpoint-at-the-end", 1),  # a run of this fedsim: extended from its last round, nothing run again
        ("older-run", 2),  # a run without the final checkpoint: rounds 4-5 run again, its rows are kept
    ],
)
def test_a_finished_run_extends_to_the_run_from_scratch(tmp_path, capsys, monkeypatch, written, eval_every):
    every = ["--set", f"engine.eval_every={eval_every}"]
    ref = tmp_path / "ref"
    assert main([*_args(ref), "--set", "rounds=8", *every]) == 0
    out = tmp_path / "extended"
    with monkeypatch.context() as m:
        if written == "older-run":
            m.setattr(runner, "final_checkpoint", lambda *a, **k: None)
        assert main([*_args(out), "--set", "rounds=5", *every]) == 0
    ckpt = json.loads(str(np.load(out / "checkpoint.npz")["meta"]))["round"]
    assert ckpt == (5 if written == "checkpoint-at-the-end" else 3)
    old_lines = (out / "metrics.jsonl").read_text().splitlines()
    capsys.readouterr()

    assert main(["run", "--resume", str(out), "--no-progress", "--set", "rounds=8"]) == 0
    printed = capsys.readouterr().out
    assert "round   6/8 |" in printed and "round   5/8 |" not in printed  # only the new rounds are news
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines[:5] == old_lines  # the old rows, as they were written
    rows, expected = _rows(out), _rows(ref)
    assert len(rows) == 8 and rows[5:] == expected[5:] and rows[:4] == expected[:4]
    if eval_every == 1:
        assert rows == expected
    else:  # the old last round was evaluated as the end of that run; the run from scratch did not evaluate it
        assert "heldout_accuracy" in rows[4] and "heldout_accuracy" not in expected[4]
        assert {k: rows[4][k] for k in expected[4] if k != "non_private"} == {
            k: v for k, v in expected[4].items() if k != "non_private"
        }
    assert rows[-1]["epsilon"] == expected[-1]["epsilon"]  # the ledger continued: no round counted twice
    assert json.loads((out / "ledger.json").read_text()) == json.loads((ref / "ledger.json").read_text())
    np.testing.assert_array_equal(
        np.load(out / "model.npz")["weights"], np.load(ref / "model.npz")["weights"]
    )
    got, want = _state_dict(out), _state_dict(ref)
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert (out / "config.toml").read_text() == (ref / "config.toml").read_text()  # rounds = 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_planned"] == summary["rounds_completed"] == 8
    assert summary["final"] == json.loads((ref / "summary.json").read_text())["final"]
    assert json.loads(str(np.load(out / "checkpoint.npz")["meta"]))["round"] == 8  # it can be extended again

    before = _files(out)  # finished: nothing to do, nothing changed, not an error
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert (
        "already finished: 8 of 8 rounds; nothing to do; to extend it, --set rounds=M"
        in capsys.readouterr().out
    )
    assert _files(out) == before


def test_resume_changes_only_rounds_and_only_upwards(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_args(out), "--set", "rounds=4"]) == 0
    before = _files(out)
    for sets, message in [
        (["--set", "rounds=5", "--set", "privacy.noise_multiplier=2"], "only rounds may be changed"),
        (["--set", "seed=1"], "only rounds may be changed (--set rounds=M extends the run to M rounds)"),
        (["--set", "rounds=two"], "rounds must be a whole number"),
        (["--set", "rounds=3"], "never shortened"),
    ]:
        assert main(["run", "--resume", str(out), "--no-progress", *sets]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert _files(out) == before
    # the same number of rounds: nothing to do
    assert main(["run", "--resume", str(out), "--no-progress", "--set", "rounds=4"]) == 0
    assert "already finished: 4 of 4 rounds" in capsys.readouterr().out and _files(out) == before


def test_an_extension_killed_between_its_two_writes_resumes_either_way(tmp_path, capsys):
    """The checkpoint is made valid for the new config before config.toml is replaced."""
    out = tmp_path / "run"
    assert main([*_args(out), "--set", "rounds=4"]) == 0
    config = out / "config.toml"
    old = config.read_text()
    new = old.replace("rounds = 4", "rounds = 6", 1)
    retarget_checkpoint(out, old, new)  # killed here: the run is still the finished 4-round run
    assert read_checkpoint(out, old).round == read_checkpoint(out, new).round == 4
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert "already finished: 4 of 4 rounds" in capsys.readouterr().out
    config.write_text(new)  # killed here: a 6-round run with 4 rounds done, resumed as any other
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert [r["round"] for r in _rows(out)] == list(range(1, 7))
    with pytest.raises(CheckpointError, match=r"another config\.toml"):
        read_checkpoint(out, old)  # the checkpoint at the end is of the 6-round config only


# ------------------------------------------------------------------------------------------ extending correlated noise
def _small(out: Path, rounds: int, *settings: str) -> list[str]:
    argv = ["run", "quickstart", "--no-progress", "--out", str(out)]
    for s in (
        "engine.name=local",
        f"rounds={rounds}",
        "data.num_clients=20",
        "client.local_epochs=1",
        *settings,
    ):
        argv += ["--set", s]
    return argv


@pytest.fixture
def no_plots(monkeypatch):
    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])


def test_a_tree_run_extends_to_the_run_from_scratch(tmp_path, capsys, no_plots):
    """Tree aggregation draws each node from the seed and the node when it completes, and its sensitivity after t
    rounds counts the nodes complete by then: nothing depends on the rounds planned, so it extends bit for bit
    (round 4 completes the node over rounds 1-4, begun before the extension)."""
    tree = ["privacy.sampling=cyclic", "privacy.min_separation=2", "privacy.mechanism=tree"]
    ref, out = tmp_path / "ref", tmp_path / "extended"
    assert main(_small(ref, 6, *tree)) == 0
    assert main(_small(out, 3, *tree)) == 0
    assert main(["run", "--resume", str(out), "--no-progress", "--set", "rounds=6"]) == 0
    capsys.readouterr()
    assert _rows(out) == _rows(ref)
    assert json.loads((out / "ledger.json").read_text()) == json.loads((ref / "ledger.json").read_text())
    np.testing.assert_array_equal(
        np.load(out / "model.npz")["weights"], np.load(ref / "model.npz")["weights"]
    )


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (
            ["privacy.sampling=cyclic", "privacy.min_separation=2", "privacy.mechanism=banded-mf"],
            "mechanism 'banded-mf' optimised its banded Toeplitz coefficients (privacy.mechanism.bands of them) for the 2 "
            "rounds planned, and the checkpoint keeps them, so 3 rounds from here would add noise optimised for 2 "
            "rounds, not the run that rounds=3 gives from scratch (optimised for 3 rounds)",
        ),
        (
            ["privacy.sampling=cyclic", "privacy.min_separation=2", "privacy.mechanism=blt"],
            "mechanism 'blt' optimised its buffers' decays and output scales for the 2 rounds planned",
        ),
    ],
    ids=["banded-mf", "blt"],
)
def test_an_extension_that_would_not_be_the_run_from_scratch_is_refused_saying_why(
    tmp_path, capsys, no_plots, settings, why
):
    out = tmp_path / "run"
    assert main(_small(out, 2, *settings)) == 0
    capsys.readouterr()
    before = _files(out)
    assert main(["run", "--resume", str(out), "--no-progress", "--set", "rounds=3"]) == 2
    err = capsys.readouterr().err
    assert f"rounds=3: {why}" in err and "Start a new run; nothing was changed" in err, err
    assert "Traceback" not in err
    assert _files(out) == before


def test_each_mechanism_says_whether_and_why_its_run_cannot_be_extended():
    assert extension_refusal("independent", 5, 8) is None
    assert extension_refusal("tree", 5, 8) is None
    for name in ("banded-mf", "blt"):
        why = extension_refusal(name, 5, 8)
        assert why.startswith(f"mechanism {name!r} optimised its ") and "for the 5 rounds planned" in why
        assert "optimised for 8 rounds" in why
