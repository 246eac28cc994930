"""A real deployment with TLS and SuperNode authentication: one SuperLink and two SuperNodes on loopback, non-default
ports, a temporary FLWR_HOME, `flwr run` of this Flower App for 2 rounds of DPFedAvg (``scripts/deploy_smoke.sh
--secure``, which docs/tutorials/deploy.md follows step by step).

Before the run the script starts a SuperNode whose key was never registered and one that does not speak TLS, and
requires both to be refused. After it, the server's ledger and certified epsilons must equal those of the same
scenario simulated with ``fedsim run``. It stops every process it started by its PID (process group) on exit, failure
included; this test kills the script's own group if it overruns.
"""

from __future__ import annotations

import json
import sys

import pytest
from smoke import run_smoke  # tests/apps/smoke.py


@pytest.mark.skipif(sys.platform != "linux", reason="the script uses setsid and /dev/tcp")
def test_tls_and_supernode_authentication_run_two_rounds_and_refuse_strangers(tmp_path):
    env = {
        "FEDSIM_SMOKE_RUN_DIR": str(tmp_path / "server-run"),
        "FEDSIM_SMOKE_PORT": "19291",
        "FEDSIM_SMOKE_NODE_PORTS": "19301 19302",
        "FEDSIM_SMOKE_REFUSED_PORT": "19310",
    }
    out = run_smoke(env, 420, "--secure")
    assert "registered 2 SuperNode public keys" in out
    assert "refused as it must be: unregistered SuperNode" in out
    assert "refused as it must be: no-tls SuperNode" in out
    assert "deploy smoke OK (TLS + SuperNode authentication)" in out
    rows = [json.loads(x) for x in (tmp_path / "server-run" / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["round"] for r in rows] == [1, 2] and all(r["epsilon"] > 0 for r in rows)
    # diagnostics=true in the script: both rounds received both replies, none rejected
    assert all(r["non_private"]["received"] == 2 and r["non_private"]["rejected"] == 0 for r in rows)
    assert all(r["randomness"] == "os-entropy" for r in rows)

    # the same scenario and rounds simulated: the same ledger and certified epsilons (the noise values differ)
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    overrides = next(line for line in out.splitlines() if line.startswith("scenario overrides: "))
    sim = run_scenario(
        load_scenario("quickstart", overrides.split(": ", 1)[1].split()), tmp_path / "simulated"
    )
    deployed_ledger = json.loads((tmp_path / "server-run" / "ledger.json").read_text())
    assert deployed_ledger == json.loads((tmp_path / "simulated" / "ledger.json").read_text())
    assert [r["epsilon"] for r in rows] == [r["epsilon"] for r in sim.rows]

    # the deployment tutorial's last step: `fedsim report` reads the server's run directory and draws its plots
    from fedsim.cli import main

    assert main(["report", str(tmp_path / "server-run")]) == 0
    assert (tmp_path / "server-run" / "plots" / "epsilon.png").is_file()
