"""Run a scenario end to end: build the experiment, start the engine its ``engine.name`` names, run the one round
loop (:func:`fedsim.loop.run_rounds`), write the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsim.experiment import build_experiment
from fedsim.loop import Engine, RunResult, run_rounds
from fedsim.report.rundir import RunWriter, new_run_dir
from fedsim.scenarios import Scenario, scenario_to_toml

from .flower_engine import FlowerEngine
from .ray_engine import LocalEngine, RayEngine

#: ``engine.name`` -> what trains the cohort. ``flower`` is Flower's own Simulation Engine: the rounds then run
#: inside Flower's ServerApp (:func:`fedsim.apps.server_app.run_on_grid`), through the same loop.
ENGINES = ("ray", "local", "flower")


def build_engine(scenario: Scenario, data: Any, settings: Any) -> Engine:
    """The in-loop engine ``engine.name`` names (``ray`` or ``local``)."""
    e = scenario.engine
    if e.name == "local":
        return LocalEngine(data, settings)
    if e.name == "ray":
        return RayEngine(
            data,
            settings,
            num_workers=e.num_workers,
            num_cpus=e.num_cpus_per_worker,
            num_gpus=e.num_gpus_per_worker,
            address=e.ray_address,
        )
    raise ValueError(f"engine.name={e.name!r} has no in-loop engine; allowed here: 'ray', 'local'")


def run_scenario(
    scenario: Scenario,
    out: str | Path | None = None,
    *,
    write: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    runs_root: str | Path = "runs",
    engine: Engine | None = None,
) -> RunResult:
    """Run ``scenario``; write its run directory (unless ``write=False``); call ``on_row`` after each round.

    ``engine``: an engine object to reuse (not closed here); by default the scenario's ``engine.name``
    (``ray``, ``local`` or ``flower``: Flower's own Simulation Engine) is started and closed.
    """
    t0 = time.perf_counter()
    run_dir = new_run_dir(scenario.name, out, runs_root) if write else None  # refuse a used --out first
    writer = RunWriter(run_dir) if run_dir else None
    own_engine = engine is None
    try:
        if writer:
            writer.begin(scenario_to_toml(scenario))
        if own_engine and scenario.engine.name == "flower":
            flower = FlowerEngine(
                num_cpus_per_client=scenario.engine.num_cpus_per_worker,
                num_gpus_per_client=scenario.engine.num_gpus_per_worker,
            )
            return flower.run(scenario, on_row=on_row, writer=writer)
        exp = build_experiment(scenario)
        if writer:
            writer.write_json("data.json", exp.data.describe())
        t_engine = time.perf_counter()
        engine = engine or build_engine(scenario, exp.data, exp.settings)
        timings = {"setup_s": t_engine - t0, "engine_start_s": time.perf_counter() - t_engine}
        return run_rounds(exp, engine, writer=writer, on_row=on_row, timings=timings)
    finally:
        if own_engine and engine is not None:
            engine.close()
        if writer:
            writer.close()
