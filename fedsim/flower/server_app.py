"""The fedsim ServerApp: the scenario's DPFedAvg strategy on whatever Grid Flower gives it.

``flwr run .`` (Flower's Simulation Engine, or a real SuperLink with SuperNodes) starts it. The strategy is
the same object the Ray engine drives; each round's release is recorded in its ledger and the certified
epsilon is logged.

Privacy in deployment:

* every random quantity that protects clients (the cohort, the central noise, the count noise of adaptive
  clipping, the agnostic loss noise) comes from the operating system's entropy: the scenario's ``seed`` is
  never used for them, whatever ``privacy.randomness`` says, and the run's config records
  ``privacy.randomness = "os-entropy"``;
* by default only private quantities are logged and written: the noised releases, the certified epsilon, and
  evaluation on data the server owns (the scenario's held-out clients, with ``server-eval = true``).
  ``diagnostics = true`` adds the non-private diagnostics (exact counts, un-noised norm statistics,
  training-client metrics), with a warning: epsilon does not cover them.

Run-config keys: ``min-nodes`` (wait until that many SuperNodes are connected; default 1), ``population``
(a check: the number of clients sampled from; 0 = the connected nodes, which is what is accounted),
``server-eval``, ``diagnostics``, ``ledger-path`` (write the ledger there), ``run-dir`` (write the run's
``config.toml``, ``metrics.jsonl`` and ``ledger.json`` there, on the server's disk).
Nodes are addressed by the training client they hold (:class:`~fedsim.flower.grid.ClientIdGrid`).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .apps import load_for_run, model_arrays
from .grid import ClientIdGrid

app = ServerApp()


def _flag(run_config: dict[str, Any], key: str, default: bool) -> bool:
    value = run_config.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fedsim.engine.runner import build_strategy
    from fedsim.engine.trainer import client_means, initial_weights
    from fedsim.report.rundir import RunWriter, new_run_dir
    from fedsim.scenarios import scenario_to_toml

    cfg = dict(context.run_config)
    scenario, data, trainer = load_for_run(cfg)
    if scenario.privacy.randomness != "os-entropy":
        log(INFO, "deployment: privacy.randomness=%r replaced by 'os-entropy' (the seed never drives the "
            "cohort or the noise of a deployed run)", scenario.privacy.randomness)
    scenario = scenario.model_copy(deep=True)
    scenario.privacy.randomness = "os-entropy"
    diagnostics = _flag(cfg, "diagnostics", False)
    if diagnostics:
        log(WARNING, "diagnostics=true: exact cohort and reply counts, un-noised update-norm statistics and "
            "training-client metrics will be logged and written; epsilon does NOT cover them")
    population = int(cfg.get("population", 0)) or None
    strategy = build_strategy(scenario, population=population, data=data)
    assert strategy.seed is None, "a deployed strategy must draw from the operating system's entropy"
    strategy.diagnostics = diagnostics
    flat = initial_weights(trainer.settings, data.input_dim, data.num_classes)
    initial = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in model_arrays(trainer, flat).items()})

    run_dir = str(cfg.get("run-dir", "") or "")
    writer = RunWriter(new_run_dir(scenario.name, run_dir)) if run_dir else None
    if writer:
        writer.write_text("config.toml", scenario_to_toml(scenario))
    server_eval = _flag(cfg, "server-eval", True)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or not strategy.history or strategy.history[-1]["round"] != server_round:
            return None
        row = {k: v for k, v in strategy.history[-1].items() if k != "non_private"}
        row.update(epsilon=strategy.epsilon(), delta=strategy.delta, accountant=strategy.accountant)
        if diagnostics:
            row["non_private"] = dict(strategy.history[-1].get("non_private", {}))
        if server_eval:
            w = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
            if len(data.heldout_clients):  # data the server owns: never trained on
                ho = client_means(trainer.evaluate(np.asarray(data.heldout_clients), w))
                row.update(heldout_loss=ho["loss"], heldout_accuracy=ho["accuracy"])
            if diagnostics:
                tr = client_means(trainer.evaluate(np.asarray(data.train_clients), w))
                row["non_private"].update(train_loss=tr["loss"], train_accuracy=tr["accuracy"])
        log(INFO, "round %d: certified epsilon %.4f (delta=%g)%s", server_round, row["epsilon"], strategy.delta,
            f", held-out acc {row['heldout_accuracy']:.3f}" if "heldout_accuracy" in row else "")
        if writer:
            writer.append_row(row)
        flat_row = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        flat_row.update({f"non_private.{k}": v for k, v in row.get("non_private", {}).items()
                         if isinstance(v, int | float) and not isinstance(v, bool)})
        return MetricRecord(flat_row)

    min_nodes = max(1, int(cfg.get("min-nodes", 1)))
    grid = ClientIdGrid(grid, min_nodes=min_nodes, connect_timeout=600.0)
    try:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=scenario.rounds, evaluate_fn=evaluate_fn)
    finally:
        if strategy.stopped_reason:
            log(INFO, "%s", strategy.stopped_reason)
        out = cfg.get("ledger-path", "")
        if out:
            strategy.ledger.save(str(out))
        if writer:
            writer.write_json("ledger.json", strategy.ledger.to_dict())
            writer.close()
    log(INFO, "certified epsilon after %d rounds: %.4f at delta=%g (%d releases in the ledger)",
        strategy.ledger.rounds, strategy.epsilon(), strategy.delta, len(strategy.ledger))
