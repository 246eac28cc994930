"""Run a scenario end to end: build the experiment, start the engine its ``engine.name`` names, run the one round
loop (:func:`fedsim.loop.run_rounds`), write the run directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsim.experiment import build_experiment
from fedsim.loop import Engine, RunResult, run_rounds
from fedsim.report.checkpoint import CheckpointError, read_checkpoint
from fedsim.report.rundir import RunWriter, new_run_dir, read_rows
from fedsim.scenarios import Scenario, ScenarioError, load_scenario, scenario_to_toml

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
            round_timeout_s=e.round_timeout_s,
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
    try:
        if writer:
            writer.begin(scenario_to_toml(scenario))
        if engine is None and scenario.engine.name == "flower":
            flower = FlowerEngine(
                num_cpus_per_client=scenario.engine.num_cpus_per_worker,
                num_gpus_per_client=scenario.engine.num_gpus_per_worker,
            )
            return flower.run(scenario, on_row=on_row, writer=writer)
        exp = build_experiment(scenario)
        if writer:
            writer.write_json("data.json", exp.data.describe())
        return _run_on_engine(exp, engine, writer, on_row, t0)
    finally:
        if writer:
            writer.close()


def _run_on_engine(
    exp: Any,
    engine: Engine | None,
    writer: RunWriter | None,
    on_row: Callable[[dict[str, Any]], None] | None,
    t0: float,
    **kwargs: Any,
) -> RunResult:
    """Start the scenario's engine unless one is given, run the rounds, close the engine it started."""
    own = engine is None
    t_engine = time.perf_counter()
    try:
        engine = engine or build_engine(exp.scenario, exp.data, exp.settings)
        timings = {"setup_s": t_engine - t0, "engine_start_s": time.perf_counter() - t_engine}
        return run_rounds(exp, engine, writer=writer, on_row=on_row, timings=timings, **kwargs)
    finally:
        if own and engine is not None:
            engine.close()


def resume_run(
    run_dir: str | Path,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    engine: Engine | None = None,
) -> RunResult:
    """Continue the run in ``run_dir`` from its checkpoint, to the same end as a run never interrupted.

    Everything is checked before anything is changed: the config, the checkpoint (readable, written for this
    config) and the rows it says were written. Then the rows after the checkpoint (rounds that ran after it and
    will run again) are dropped from ``metrics.jsonl``, and the rounds after it run with the same cohorts, noise
    and training as the first time; the ledger continues from the checkpoint's, so no round is counted twice.
    Only seeded runs can be resumed: with the operating system's entropy, rounds run again would be new releases.
    """
    path = Path(run_dir)
    config = path / "config.toml"
    if not config.is_file():
        raise CheckpointError(f"{path} is not a run directory (no config.toml)")
    config_toml = config.read_text()
    try:
        scenario = load_scenario(str(config))
    except ScenarioError as exc:
        raise CheckpointError(f"{config} no longer loads: {exc}") from None
    if scenario.engine.name == "flower":
        raise CheckpointError(
            "--resume continues runs of engine.name 'ray' or 'local'; this run used 'flower'"
        )
    if scenario.privacy.randomness != "seeded":
        # the rounds after the checkpoint were released already, with noise that cannot be drawn again: running
        # them again would release a second, independent noising of the same clients that the ledger, which
        # counts each round once, would not account
        raise CheckpointError(
            f"--resume needs privacy.randomness = 'seeded'; this run drew its cohorts and noise from "
            f"{scenario.privacy.randomness!r}, so the rounds after the checkpoint cannot be run again with the "
            "same noise, and new noise would release more than the ledger accounts; nothing was changed"
        )
    ckpt = read_checkpoint(path, config_toml)
    metrics = path / "metrics.jsonl"
    try:
        rows = read_rows(path) if metrics.is_file() else []
    except ValueError as exc:  # a line cut short by the kill is after the checkpoint's rows, or it is corrupt
        lines = metrics.read_text().splitlines()
        try:
            rows = [json.loads(x) for x in lines[: ckpt.round]]
        except ValueError:
            raise CheckpointError(f"{metrics} is corrupt before round {ckpt.round} ({exc})") from None
    if len(rows) < ckpt.round or [r.get("round") for r in rows[: ckpt.round]] != list(
        range(1, ckpt.round + 1)
    ):
        raise CheckpointError(
            f"{metrics} holds {len(rows)} rows but the checkpoint is of round {ckpt.round}; nothing was changed"
        )
    rows = rows[: ckpt.round]
    t0 = time.perf_counter()
    exp = build_experiment(scenario)
    if ckpt.weights.shape != exp.initial_weights.shape:
        raise CheckpointError(
            f"the checkpoint's model has {ckpt.weights.size} parameters, the scenario's {exp.initial_weights.size}"
        )
    # from here on the run directory changes: drop the rows that will be computed again
    writer = RunWriter(path)
    try:
        writer.replace_rows(rows)
        return _run_on_engine(exp, engine, writer, on_row, t0, resume=ckpt, prior_rows=rows)
    finally:
        writer.close()
