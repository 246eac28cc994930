"""The fedsim ServerApp: the scenario's strategy, on whatever Grid Flower gives it, through the one round loop.

``flwr run .`` (Flower's Simulation Engine, or a real SuperLink with SuperNodes) starts it. It runs the same
:func:`fedsim.loop.run_rounds` as ``fedsim run``, with the nodes as its engine
(:class:`fedsim.flower.grid_engine.GridEngine`), so a deployed run writes the same run directory (on the
server's disk) with the same per-round privacy columns. :class:`fedsim.engine.flower_engine.FlowerEngine` runs
this code too, under Flower's Simulation Engine.

Privacy in deployment:

* every random quantity that protects clients (the cohort, the central noise, the count noise of adaptive
  clipping, the agnostic loss noise) comes from the operating system's entropy: the scenario's ``seed`` is
  never used for them, whatever ``privacy.randomness`` says, and the run's config records
  ``privacy.randomness = "os-entropy"``;
* distributed noise runs only under secure aggregation (``[privacy.secagg]``: SecAgg+ with the ``ddgauss`` or
  ``skellam`` encoding, :mod:`fedsim.secagg`; the server learns only the survivors' noised sum, and the ledger's
  epsilon holds against it), or with ``distributed-without-secagg = true`` (the operator trusts the server);
* by default only private quantities are logged and written: the noised releases, the certified epsilon, and
  evaluation on data the server owns (the scenario's held-out clients, with ``server-eval = true``).
  ``diagnostics = true`` adds the non-private diagnostics (exact counts, un-noised norm statistics,
  training-client metrics), with a warning: epsilon does not cover them.

Run-config keys: ``scenario``, ``overrides``, ``min-nodes`` (wait until that many SuperNodes are connected;
default 1), ``population`` (the public population, fixed before the run: the aggregate's denominator and the
sampling probability come from it, never from how many nodes are connected; 0 = the scenario's training clients;
the accounting is over the connected nodes actually sampled from), ``server-eval``, ``diagnostics``, ``ledger-path`` (also write the ledger there), ``run-dir``
(the run directory; default ``runs/<time>-<scenario>``). Nodes are addressed by the training client they hold
(:class:`~fedsim.flower.grid.ClientIdGrid`).
"""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedsim.experiment import Experiment, build_experiment, privacy_settings
from fedsim.flower.grid import ClientIdGrid
from fedsim.flower.grid_engine import GridEngine
from fedsim.labels import NON_PRIVATE
from fedsim.loop import RunResult, run_rounds
from fedsim.privacy.settings import PrivacySettings
from fedsim.report.rows import PUBLIC_STOPS
from fedsim.report.rundir import RunWriter, new_run_dir
from fedsim.scenarios import scenario_to_toml
from fedsim.strategies.dpfedavg import check_distributed_noise

from .run_config import load_for_run, model_record

app = ServerApp()


#: run config key that accepts distributed noise without secure aggregation (see :func:`check_noise_placement`)
DISTRIBUTED_OPT_IN = "distributed-without-secagg"


def check_noise_placement(settings: PrivacySettings, opted_in: bool) -> None:
    """Refuse what cannot run on real Flower nodes (:func:`fedsim.privacy.settings.deployment_refusal`: canary
    clients, a simulated dropout rate; distributed noise without secure aggregation unless the run config opts in),
    the rule ``DPFedAvg.start`` asks too."""
    check_distributed_noise(settings, opted_in, f"the run config {DISTRIBUTED_OPT_IN} = true")


def _flag(run_config: dict[str, Any], key: str, default: bool) -> bool:
    value = run_config.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def run_on_grid(
    grid: Grid,
    exp: Experiment,
    trainer: Any,
    *,
    min_nodes: int,
    writer: RunWriter | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    diagnostics: bool = True,
    server_eval: bool = True,
    timings: dict[str, float] | None = None,
    connect_timeout: float = 600.0,
) -> RunResult:
    """The round loop with Flower nodes as the engine; ``trainer`` evaluates on the server's data."""
    ids_grid = ClientIdGrid(grid, min_nodes=min_nodes, connect_timeout=connect_timeout)
    engine = GridEngine(
        ids_grid,
        exp.strategy,
        model_record(trainer, exp.initial_weights),
        evaluator=trainer.evaluate,
        timeout=exp.scenario.engine.round_timeout_s,  # a node that has not replied by then: no_reply
    )
    return run_rounds(
        exp,
        engine,
        writer=writer,
        on_row=on_row,
        diagnostics=diagnostics,
        server_eval=server_eval,
        available=engine.available,
        timings=timings,
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    scenario, data, trainer = load_for_run(cfg)
    check_noise_placement(privacy_settings(scenario), _flag(cfg, DISTRIBUTED_OPT_IN, False))
    if scenario.privacy.randomness != "os-entropy":
        log(
            INFO,
            "deployment: privacy.randomness=%r replaced by 'os-entropy' (the seed never drives the "
            "cohort or the noise of a deployed run)",
            scenario.privacy.randomness,
        )
    scenario = scenario.model_copy(deep=True)
    scenario.privacy.randomness = "os-entropy"
    exp = build_experiment(scenario, data)
    strategy = exp.strategy
    if strategy.seed is not None:  # never: build_strategy seeds only privacy.randomness = "seeded"
        raise RuntimeError("a deployed strategy must draw from the operating system's entropy")
    # the public population (the denominator and q come from it, never from the connected nodes' number): the run
    # config's, else the scenario's training clients; the accounting is over the nodes actually sampled from
    strategy.population = int(cfg.get("population", 0)) or strategy.population
    diagnostics = _flag(cfg, "diagnostics", False)
    strategy.diagnostics = diagnostics
    if diagnostics:
        log(
            WARNING,
            "diagnostics=true: exact cohort and reply counts, un-noised update-norm statistics and "
            "training-client metrics will be logged and written; epsilon does NOT cover them",
        )

    writer = RunWriter(new_run_dir(scenario.name, str(cfg.get("run-dir", "") or "") or None))
    writer.begin(scenario_to_toml(scenario))
    if diagnostics:  # exact examples per client and label statistics: not covered by epsilon
        writer.write_json("data.json", data.describe())
    log(INFO, "run directory (on the server): %s", writer.path)

    def on_row(row: dict[str, Any]) -> None:
        log(
            INFO,
            "round %d: certified epsilon %.4f (delta=%g)%s",
            row["round"],
            row["epsilon"],
            row["delta"],
            f", held-out acc {row['heldout_accuracy']:.3f}"
            if row.get("heldout_accuracy") is not None
            else "",
        )
        if diagnostics:
            log(
                INFO,
                "round %d [non-private diagnostics]: %s",
                row["round"],
                {k: v for k, v in row.get(NON_PRIVATE, {}).items() if isinstance(v, int | float)},
            )

    try:
        result = run_on_grid(
            grid,
            exp,
            trainer,
            min_nodes=max(1, int(cfg.get("min-nodes", 1))),
            writer=writer,
            on_row=on_row,
            diagnostics=diagnostics,
            server_eval=_flag(cfg, "server-eval", True),
        )
    finally:
        if cfg.get("ledger-path", ""):
            strategy.ledger.save(str(cfg["ledger-path"]))
    if result.stopped_reason:
        # the budget is a function of public parameters and the accountant; anything else is not
        if result.stopped_by in PUBLIC_STOPS:
            log(INFO, "%s", result.stopped_reason)
        else:  # stopped by client failures: that it stopped, and where, is an exact fact about clients
            log(WARNING, "[non-private: not covered by epsilon] %s", result.stopped_reason)
    log(
        INFO,
        "certified epsilon after %d rounds: %.4f at delta=%g (%d releases in the ledger)",
        strategy.ledger.rounds,
        strategy.epsilon(),
        strategy.delta,
        len(strategy.ledger),
    )
