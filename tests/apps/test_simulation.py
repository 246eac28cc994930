"""The shipped ServerApp and ClientApp under Flower's Simulation Engine, with the agnostic strategy (4 supernodes,
2 rounds): what ``flwr run .`` runs in simulation, given the run config ``--run-config`` would pass.

``run_simulation`` gives the apps an empty run config, so the ClientApp reads the scenario from
``FEDSIM_SCENARIO`` / ``FEDSIM_OVERRIDES`` (Ray workers inherit the environment of the process that starts Ray);
the ServerApp's ``main`` is called with the run config itself.
"""

from __future__ import annotations

import json

NUM_SUPERNODES = 4
OVERRIDES = (
    "seed=3 rounds=2 data.num_clients=8 data.heldout_fraction=0.25 data.domains=2 client.local_epochs=1 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.noise_multiplier=0.5 agnostic.enabled=true "
    "engine.name=local"
)


def test_agnostic_strategy_runs_in_flower_simulation_through_the_shipped_apps(monkeypatch, tmp_path):
    import ray
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedsim.apps import server_app
    from fedsim.apps.client_app import app as client_app

    monkeypatch.setenv("FEDSIM_SCENARIO", "quickstart")
    monkeypatch.setenv("FEDSIM_OVERRIDES", OVERRIDES)
    if ray.is_initialized():  # workers of an earlier Ray instance would not see the variables above
        ray.shutdown()
    run_config = {
        "scenario": "quickstart",
        "overrides": OVERRIDES,
        "min-nodes": NUM_SUPERNODES,
        "diagnostics": True,
        "run-dir": str(tmp_path / "run"),
    }
    errors: list[BaseException] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            server_app.main(
                grid,
                Context(
                    run_id=context.run_id,
                    node_id=context.node_id,
                    node_config={},
                    state=context.state,
                    run_config=run_config,
                ),
            )
        except BaseException as exc:  # Flower swallows ServerApp errors
            errors.append(exc)
            raise

    run_simulation(
        server_app=app,
        client_app=client_app,
        num_supernodes=NUM_SUPERNODES,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    assert not errors, errors
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line
    ]
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        diag = r["non_private"]
        assert (
            diag["cohort"] == NUM_SUPERNODES and diag["received"] == NUM_SUPERNODES and diag["rejected"] == 0
        ), r
        assert len(r["lambda_used"]) == 2 and len(r["domain_loss_noised"]) == 2 and r["epsilon"] > 0
        assert r["randomness"] == "os-entropy"
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert [x["name"] for x in ledger["releases"]] == ["model", "domain-losses"] * 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["randomness"] == "os-entropy"
