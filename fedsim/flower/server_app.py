"""The fedsim ServerApp: the scenario's DPFedAvg strategy on whatever Grid Flower gives it.

``flwr run .`` (Flower's Simulation Engine, or a real SuperLink with SuperNodes) starts it. The strategy is
the same object the Ray engine drives; each round's release is recorded in its ledger and the certified
epsilon is logged. With ``server-eval = true`` in the run config (simulation only: the server then reads the
scenario's data), the global model is evaluated on training and held-out clients after each round.

Other run-config keys: ``min-nodes`` (wait until that many SuperNodes are connected; default 1),
``population`` (the mechanism's population; default: the number of connected nodes), ``ledger-path``.
Nodes are addressed by the training client they hold (:class:`~fedsim.flower.grid.ClientIdGrid`), so the
strategy samples client ids with its seeded generator, as in fedsim's own engines.
"""

from __future__ import annotations

import json
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .apps import load_for_run, model_arrays
from .grid import ClientIdGrid

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fedsim.engine.runner import build_strategy
    from fedsim.engine.trainer import client_means, initial_weights

    scenario, data, trainer = load_for_run(context.run_config)
    population = int(context.run_config.get("population", 0)) or None
    strategy = build_strategy(scenario, population=population)
    strategy.population = population  # None: the number of connected nodes
    flat = initial_weights(trainer.settings, data.input_dim, data.num_classes)
    initial = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in model_arrays(trainer, flat).items()})

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or not bool(context.run_config.get("server-eval", True)):
            return None
        w = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
        tr = client_means(trainer.evaluate(np.asarray(data.train_clients), w))
        ho = client_means(trainer.evaluate(np.asarray(data.heldout_clients), w))
        eps = strategy.epsilon()
        log(INFO, "round %d: train acc %.3f, held-out acc %.3f, certified epsilon %.3f (delta=%g)",
            server_round, tr["accuracy"], ho["accuracy"], eps, strategy.delta)
        return MetricRecord({"train_accuracy": tr["accuracy"], "heldout_accuracy": ho["accuracy"],
                             "train_loss": tr["loss"], "heldout_loss": ho["loss"], "epsilon": eps})

    min_nodes = max(1, int(context.run_config.get("min-nodes", 1)))
    grid = ClientIdGrid(grid, min_nodes=min_nodes, connect_timeout=600.0)
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=scenario.rounds, evaluate_fn=evaluate_fn)
    if strategy.stopped_reason:
        log(INFO, "%s", strategy.stopped_reason)
    out = context.run_config.get("ledger-path", "")
    if out:
        strategy.ledger.save(str(out))
    log(INFO, "certified epsilon after %d rounds: %.4f at delta=%g; ledger: %s", strategy.ledger.rounds,
        strategy.epsilon(), strategy.delta, json.dumps({"releases": len(strategy.ledger)}))
