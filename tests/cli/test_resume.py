"""A run killed with SIGKILL in the middle finishes under ``fedsim run --resume`` exactly as a run never
interrupted: the same rows, ledger and final model; no round counted twice or lost. A bad checkpoint is a clear
error that changes nothing."""

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

from fedsim.cli import main

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
    assert main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--resume needs privacy.randomness = 'seeded'" in err and "nothing was changed" in err
    assert "Traceback" not in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_refuses_what_would_change_the_run(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path), "quickstart"]) == 2
    assert "give no scenario, --set or --out" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nothing-here")]) == 2
    assert "config.toml" in capsys.readouterr().err
