"""Running ``scripts/deploy_smoke.sh`` from a test: in its own process group, so that a test that overruns stops it
(its trap then stops every SuperLink and SuperNode it started, by PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "deploy_smoke.sh"


def run_smoke(env: dict[str, str], timeout: float, *args: str) -> str:
    """The script's output (stdout and stderr) after it exited 0; fails the test with its tail otherwise."""
    env = {
        **os.environ,
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script's trap then stops what it started
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"the deployment did not finish in {timeout:.0f} s:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-8000:]
    return out
