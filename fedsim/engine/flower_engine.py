"""Run a scenario through Flower's own Simulation Engine (``flwr.simulation.run_simulation``).

The ServerApp is fedsim's own round loop on the Flower Grid (:func:`fedsim.apps.server_app.run_on_grid`, the code
a deployed ServerApp runs), so the rows, ``metrics.jsonl``, ``ledger.json`` and ``summary.json`` are those of
every other engine. Clients are fedsim's ClientApp (:func:`fedsim.apps.client_app.make_client_app`), one virtual
SuperNode per training client: partition-id ``i`` holds ``data.train_clients[i]``. Flower's node ids are random,
so the Grid is wrapped in a :class:`~fedsim.flower.grid.ClientIdGrid` and the strategy samples *client ids* with
its seeded generator: with the same seed the final model equals the in-process engine's up to float32 rounding
(Flower ships the global model as float32 arrays).

This engine exists for parity checks and as the baseline of the speed benchmarks.

Unlike the engines the round loop drives, it drives the loop itself (registered with ``drives_loop=True`` in
:mod:`fedsim.registry`): :meth:`FlowerEngine.run_scenario` is what ``engine.name = "flower"`` runs. Of
:class:`fedsim.loop.Engine` it has ``name`` and ``close``; a round's ``train`` and ``evaluate`` are those of
:class:`fedsim.flower.grid_engine.GridEngine`, which the loop drives inside the ServerApp.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedsim.apps.client_app import make_client_app
from fedsim.apps.run_config import load_for_run
from fedsim.apps.server_app import run_on_grid
from fedsim.experiment import build_experiment
from fedsim.loop import RunResult
from fedsim.report.rundir import RunWriter
from fedsim.scenarios import scenario_to_toml


class FlowerEngine:
    """Flower's Simulation Engine (Ray backend) running a scenario.

    ``num_cpus_per_client`` / ``num_gpus_per_client`` size each virtual client (Flower's
    ``client_resources``); ``ray_init_args`` go to ``ray.init`` (default: the machine's CPUs, no dashboard).
    Each :meth:`run` starts and ends its own simulation: nothing is held between runs, so :meth:`close` has
    nothing to release.
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

    @classmethod
    def from_scenario(cls, scenario: Any) -> FlowerEngine:
        """Sized by ``scenario.engine``: each virtual client gets ``num_cpus_per_worker`` CPUs and
        ``num_gpus_per_worker`` GPUs."""
        return cls(
            num_cpus_per_client=scenario.engine.num_cpus_per_worker,
            num_gpus_per_client=scenario.engine.num_gpus_per_worker,
        )

    @classmethod
    def run_scenario(
        cls,
        scenario: Any,
        *,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        writer: RunWriter | None = None,
    ) -> RunResult:
        """The registry's hook (``engine.name = "flower"``): :meth:`run` on an engine :meth:`from_scenario`."""
        engine = cls.from_scenario(scenario)
        try:
            return engine.run(scenario, on_row=on_row, writer=writer)
        finally:
            engine.close()

    def close(self) -> None:
        """Nothing to release: each :meth:`run` shuts its simulation down before it returns."""

    def backend_config(self) -> dict[str, Any]:
        init_args = dict(self.ray_init_args or {"num_cpus": os.cpu_count() or 1})
        init_args.setdefault("include_dashboard", False)
        return {
            "client_resources": {"num_cpus": self.num_cpus_per_client, "num_gpus": self.num_gpus_per_client},
            "init_args": init_args,
        }

    def run(
        self,
        scenario: Any,
        *,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        writer: RunWriter | None = None,
    ) -> RunResult:
        """Run ``scenario`` for ``scenario.rounds`` rounds; one row per completed round."""
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="fedsim-flower-") as tmp:
            path = Path(tmp) / f"{scenario.name}.toml"
            path.write_text(scenario_to_toml(scenario))
            run_config = {"scenario": str(path), "overrides": ""}
            _, data, trainer = load_for_run(run_config)  # the server side's data and evaluator (cached)
            exp = build_experiment(scenario, data)
            if writer:
                writer.write_data(data.describe())  # its exact statistics under non_private
            population = int(exp.train_ids.size)
            outcome: dict[str, Any] = {}
            t_sim = time.perf_counter()

            server_app = ServerApp()

            @server_app.main()
            def main(grid: Grid, context: Context) -> None:
                try:
                    outcome["result"] = run_on_grid(
                        grid,
                        exp,
                        trainer,
                        min_nodes=population,
                        writer=writer,
                        on_row=on_row,
                        timings={"setup_s": t_sim - t0},
                        connect_timeout=120.0,
                    )
                except BaseException as exc:  # Flower logs and swallows ServerApp errors: re-raised below
                    outcome["error"] = exc
                    raise

            # a simulation: the clients' distributed-noise shares follow the strategy's randomness
            client_app = make_client_app(run_config, noise_seed=exp.strategy.seed)
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=population,
                backend_config=self.backend_config(),
                verbose_logging=self.verbose,
            )
        if "error" in outcome:
            raise RuntimeError(f"the Flower ServerApp failed: {outcome['error']!r}") from outcome["error"]
        if "result" not in outcome:
            raise RuntimeError("Flower's Simulation Engine ended without running the ServerApp")
        result: RunResult = outcome["result"]
        result.timings.update(simulation_s=time.perf_counter() - t_sim, total_s=time.perf_counter() - t0)
        return result


def run_flower(scenario: Any, **kwargs: Any) -> RunResult:
    """``FlowerEngine(**kwargs).run(scenario)``."""
    return FlowerEngine(**kwargs).run(scenario)
