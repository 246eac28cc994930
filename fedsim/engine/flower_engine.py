"""Run a scenario through Flower's own Simulation Engine (``flwr.simulation.run_simulation``).

The strategy is the same :class:`~fedsim.strategies.DPFedAvg` object the other engines drive (built by
:func:`fedsim.engine.runner.build_strategy`); Flower's ServerApp calls its ``configure_train`` /
``aggregate_train``, which run the same ``begin_round`` / ``finish_round``. Clients are fedsim's ClientApp
(:func:`fedsim.flower.client_app.make_client_app`), one virtual SuperNode per training client: partition-id
``i`` holds ``data.train_clients[i]``.

Flower's node ids are random, so the ServerApp wraps its Grid in a :class:`~fedsim.flower.grid.ClientIdGrid`:
the strategy samples *client ids* with its seeded generator, exactly as in :func:`run_scenario`. With the same
seed the final model equals the one of ``run_scenario(..., engine=LocalEngine(...))`` up to float32 rounding
(Flower ships the global model as float32 arrays).

This engine exists for parity checks and as the baseline of the speed benchmarks; the rows it returns have the
keys of :func:`run_scenario`'s rows (train and held-out metrics come from a server-side ``evaluate_fn``).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedsim.privacy.aggregation import flatten


@dataclass
class FlowerRunResult:
    rows: list[dict[str, Any]]
    weights: np.ndarray
    strategy: Any
    stopped_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


class FlowerEngine:
    """Flower's Simulation Engine (Ray backend) as a fedsim engine.

    ``num_cpus_per_client`` / ``num_gpus_per_client`` size each virtual client (Flower's
    ``client_resources``); ``ray_init_args`` go to ``ray.init`` (default: the machine's CPUs, no dashboard).
    """

    name = "flower"

    def __init__(
        self,
        num_cpus_per_client: float = 1.0,
        num_gpus_per_client: float = 0.0,
        ray_init_args: dict[str, Any] | None = None,
        verbose: bool = False,
    ) -> None:
        self.num_cpus_per_client = num_cpus_per_client
        self.num_gpus_per_client = num_gpus_per_client
        self.ray_init_args = ray_init_args
        self.verbose = verbose

    def backend_config(self) -> dict[str, Any]:
        init_args = dict(self.ray_init_args or {"num_cpus": os.cpu_count() or 1})
        init_args.setdefault("include_dashboard", False)
        return {
            "client_resources": {"num_cpus": self.num_cpus_per_client, "num_gpus": self.num_gpus_per_client},
            "init_args": init_args,
        }

    def run(
        self, scenario: Any, *, on_row: Callable[[dict[str, Any]], None] | None = None
    ) -> FlowerRunResult:
        """Run ``scenario`` for ``scenario.rounds`` rounds; one row per completed round."""
        from flwr.app import Array, ArrayRecord, Context, MetricRecord
        from flwr.serverapp import Grid, ServerApp
        from flwr.simulation import run_simulation

        from fedsim.flower.apps import model_arrays
        from fedsim.flower.client_app import make_client_app
        from fedsim.flower.grid import ClientIdGrid
        from fedsim.scenarios import scenario_to_toml

        from fedsim.strategies.dpfedavg import NON_PRIVATE

        from .runner import (
            _paper_bounds,
            build_data,
            build_strategy,
            evaluation_columns,
            merge_columns,
            privacy_columns,
        )
        from .trainer import ClientTrainer, TrainSettings, initial_weights

        t0 = time.perf_counter()
        data = build_data(scenario)
        settings = TrainSettings.from_scenario(scenario)
        trainer = ClientTrainer(data, settings)  # server side: initial model layout and evaluation only
        train_ids = np.asarray(data.train_clients)
        heldout_ids = np.asarray(data.heldout_clients)
        population = int(train_ids.size)
        strategy = build_strategy(scenario, population, data)
        delta, rounds = scenario.privacy.delta, scenario.rounds
        accountant = scenario.privacy.accountant
        eval_every = max(1, int(getattr(scenario.engine, "eval_every", 1) or 1))
        bounds = _paper_bounds(strategy, population, rounds, delta)
        flat0 = initial_weights(settings, data.input_dim, data.num_classes)
        initial = ArrayRecord(
            array_dict={k: Array(np.ascontiguousarray(v)) for k, v in model_arrays(trainer, flat0).items()}
        )

        rows: list[dict[str, Any]] = []
        final: dict[str, Any] = {"weights": flat0}
        errors: list[BaseException] = []
        t_round = [time.perf_counter()]

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:
                t_round[0] = time.perf_counter()
                return None
            w = flatten(arrays.to_numpy_ndarrays())
            final["weights"] = w
            if not strategy.history or strategy.history[-1]["round"] != server_round:
                return None  # the round did not run (budget exhausted)
            row: dict[str, Any] = {**strategy.history[-1], "delta": delta, "accountant": accountant,
                                   "randomness": strategy.randomness}
            row[NON_PRIVATE] = dict(row[NON_PRIVATE])
            if server_round % eval_every == 0 or server_round == rounds:
                merge_columns(row, evaluation_columns(
                    data,
                    trainer.evaluate(train_ids, w),
                    trainer.evaluate(heldout_ids, w) if heldout_ids.size else None,
                ))
            row.update(privacy_columns(server_round, row["epsilon"], bounds, delta, population))
            now = time.perf_counter()
            row[NON_PRIVATE]["round_time_s"] = now - t_round[0]
            t_round[0] = now
            rows.append(row)
            if on_row:
                on_row(row)
            return MetricRecord({k: v for k, v in row.items() if isinstance(v, int | float) and v is not None})

        server_app = ServerApp()

        @server_app.main()
        def main(grid: Grid, context: Context) -> None:
            try:
                result = strategy.start(
                    grid=ClientIdGrid(grid, min_nodes=population), initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate_fn
                )
                final["weights"] = flatten(result.arrays.to_numpy_ndarrays())
            except BaseException as exc:  # Flower logs and swallows ServerApp errors: re-raise them below
                errors.append(exc)
                raise

        with tempfile.TemporaryDirectory(prefix="fedsim-flower-") as tmp:
            path = Path(tmp) / f"{scenario.name}.toml"
            path.write_text(scenario_to_toml(scenario))
            # a simulation: the clients' distributed-noise shares follow the strategy's randomness
            client_app = make_client_app({"scenario": str(path), "overrides": ""}, noise_seed=strategy.seed)
            t_sim = time.perf_counter()
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=population,
                backend_config=self.backend_config(),
                verbose_logging=self.verbose,
            )
            t_end = time.perf_counter()
        if errors:
            raise RuntimeError(f"the Flower ServerApp failed: {errors[0]!r}") from errors[0]
        timings = {"setup_s": t_sim - t0, "simulation_s": t_end - t_sim, "total_s": t_end - t0}
        return FlowerRunResult(rows, np.asarray(final["weights"], dtype=np.float64), strategy,
                               strategy.stopped_reason, timings)


def run_flower(scenario: Any, **kwargs: Any) -> FlowerRunResult:
    """``FlowerEngine(**kwargs).run(scenario)``."""
    return FlowerEngine(**kwargs).run(scenario)
