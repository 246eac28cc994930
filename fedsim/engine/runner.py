"""Run a scenario end to end: build the experiment, start the engine its ``engine.name`` names, run the one round
loop (:func:`fedsim.loop.run_rounds`), write the run directory; continue or extend a run (:func:`resume_run`).

The final model is written as ``model.npz`` (a flat vector) and ``model.pt`` (the ``state_dict`` of the scenario's
model, :func:`fedsim.load_model`). A seeded run with checkpoints on also leaves a checkpoint of its last round, so
that ``--resume --set rounds=M`` extends it from there.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.experiment import build_experiment, privacy_settings
from fedsim.labels import see_docs
from fedsim.loop import Engine, RunResult, run_rounds
from fedsim.privacy.settings import resume_refusal
from fedsim.registry import ENGINES, engine_entry
from fedsim.report.checkpoint import (
    CHECKPOINT,
    Checkpoint,
    CheckpointError,
    read_checkpoint,
    retarget_checkpoint,
    write_checkpoint,
)
from fedsim.report.rows import summary_stop
from fedsim.report.rundir import RunWriter, TorchWarnings, check_out, model_shape, new_run_dir, read_rows
from fedsim.report.trackers import check_trackers
from fedsim.scenarios import Scenario, ScenarioError, load_scenario, scenario_to_toml
from fedsim.training.trainer import TrainSettings, make_model


def build_engine(scenario: Scenario, data: Any, settings: Any) -> Engine:
    """Start the engine ``engine.name`` names (:mod:`fedsim.registry`), one the round loop drives: its factory
    ``start(scenario, data, settings)``."""
    entry = engine_entry(scenario.engine.name)
    if entry.drives_loop:
        raise ValueError(
            f"engine.name={entry.name!r} runs the round loop itself; allowed here: {_in_loop_engines()} "
            f"({see_docs('engine')})"
        )
    target = entry.resolve()
    return getattr(target, "start", target)(scenario, data, settings)


def _in_loop_engines(joiner: str = ", ") -> str:
    """The registered engines the round loop drives, quoted: ``'ray', 'local'``."""
    return joiner.join(repr(e.name) for e in ENGINES.values() if not e.drives_loop)


def run_scenario(
    scenario: Scenario,
    out: str | Path | None = None,
    *,
    write: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    runs_root: str | Path = "runs",
    engine: Engine | None = None,
    timings: dict[str, float] | None = None,
) -> RunResult:
    """Run ``scenario``; write its run directory (unless ``write=False``); call ``on_row`` after each round.

    ``timings``: what the caller measured before (``fedsim run``'s ``startup_s``), reported with the run's own.

    ``engine``: an engine object to reuse (not closed here); by default the engine the scenario's ``engine.name``
    names in :mod:`fedsim.registry` (``ray``, ``local``, ``flower``: Flower's own Simulation Engine, or one
    registered since) is started and closed. An engine that drives the round loop itself (``drives_loop``, such as
    ``flower``) runs the scenario through its ``run_scenario``.
    """
    t0 = time.perf_counter()
    # everything that can refuse the scenario runs before the run directory exists: the config must be writable
    # (a callable defined in __main__ is not), --out must be usable, the data, model and strategy must build
    config_toml = config_text(scenario) if write else None
    if write:
        check_trackers(scenario)  # a tracker that cannot start (package missing, bad URI): refused here
    if write and out is not None:
        check_out(out)
    drives_loop = engine is None and engine_entry(scenario.engine.name).drives_loop
    # what torch warns from here (the checks probe the training paths; the engine trains and evaluates) goes to
    # the run's run.log, with one line on the console saying how many
    with TorchWarnings(capture=write) as torch_warnings:
        exp = None if drives_loop else build_experiment(scenario)
        if write and exp is not None and scenario.privacy.target_epsilon is not None:
            config_toml = config_text(scenario)  # with the noise multiplier calibrated for the target
        run_dir = new_run_dir(scenario.name, out, runs_root) if write else None
        writer = RunWriter(run_dir) if run_dir else None
        if writer:
            writer.model_factory = (
                _factory_from_run_dir(scenario, writer.path)
                if exp is None
                else model_factory(exp.settings, exp.data.input_shape, exp.data.num_classes)
            )
        torch_warnings.attach(run_dir)
        try:
            if writer:
                writer.begin(config_toml)
            if exp is None:  # the engine builds the experiment and runs the rounds where it hosts them
                host = engine_entry(scenario.engine.name).resolve()
                return host.run_scenario(scenario, on_row=on_row, writer=writer)
            if writer:
                writer.write_data(exp.data.describe())  # its exact statistics under non_private
            result = _run_on_engine(exp, engine, writer, on_row, t0, timings=timings)
            final_checkpoint(writer, result, scenario)
            return result
        finally:
            if writer:
                writer.close()


def model_factory(settings: TrainSettings, input_shape: Any, num_classes: int) -> Callable[[], Any]:
    """Builds the run's model as every trainer does (:func:`fedsim.training.trainer.make_model`), untrained."""
    return functools.partial(make_model, settings, tuple(input_shape), int(num_classes))


def _factory_from_run_dir(scenario: Scenario, run_dir: Path) -> Callable[[], Any]:
    """:func:`model_factory` with the data's shape read from the run's ``data.json`` when the model is built (an
    engine that drives the loop, such as Flower's Simulation Engine, builds the data in its own process and writes
    it there)."""

    def factory() -> Any:
        shape = model_shape(run_dir)
        if shape is None:
            raise ValueError(f"{run_dir / 'data.json'} does not give the data's input_shape and num_classes")
        return model_factory(TrainSettings.from_scenario(scenario), *shape)()

    return factory


def final_checkpoint(writer: RunWriter | None, result: RunResult, scenario: Scenario) -> None:
    """After the last round of a seeded run with checkpoints on (``engine.checkpoint_every > 0``): a checkpoint of
    that round (the loop writes them only before the end), from which ``--resume --set rounds=M`` extends the run
    without running any of its rounds again. Nothing for a run stopped early, or one that draws from the operating
    system (it can never be resumed)."""
    if (
        writer is None
        or writer.config_toml is None
        or getattr(result.strategy, "randomness", None) != "seeded"
        or scenario.engine.checkpoint_every <= 0
        or result.stopped_by is not None
        or not result.rows
        or result.rows[-1].get("round") != scenario.rounds
    ):
        return
    write_checkpoint(
        writer.path, scenario.rounds, result.weights, result.strategy.state_dict(), writer.config_toml
    )


def config_text(scenario: Scenario) -> str:
    """The scenario as ``config.toml``; a ``ValueError`` saying why when it cannot be written (a callable given
    through the Python API that is not importable by reference, such as one defined in ``__main__``)."""
    from pydantic_core import PydanticSerializationError

    try:
        return scenario_to_toml(scenario)
    except PydanticSerializationError as exc:
        msg = str(exc)
        msg = msg.split("Error calling function", 1)[-1].split(": ", 1)[-1] if "Error calling" in msg else msg
        raise ValueError(
            f"the scenario cannot be written to the run directory's config.toml, so nothing was run: {msg}"
        ) from None


def _run_on_engine(
    exp: Any,
    engine: Engine | None,
    writer: RunWriter | None,
    on_row: Callable[[dict[str, Any]], None] | None,
    t0: float,
    timings: dict[str, float] | None = None,
    **kwargs: Any,
) -> RunResult:
    """Start the scenario's engine unless one is given, run the rounds, close the engine it started.

    The timings: ``setup_s`` (data, model, strategy), ``engine_start_s`` and, where the engine measures them, its
    parts (the Ray engine's ``ray_start_s`` and ``workers_start_s``), after the caller's ``timings``."""
    own = engine is None
    t_engine = time.perf_counter()
    try:
        engine = engine or build_engine(exp.scenario, exp.data, exp.settings)
        timings = {
            **(timings or {}),
            "setup_s": t_engine - t0,
            "engine_start_s": time.perf_counter() - t_engine,
            **(getattr(engine, "start_timings", None) or {} if own else {}),
        }
        return run_rounds(exp, engine, writer=writer, on_row=on_row, timings=timings, **kwargs)
    finally:
        if own and engine is not None:
            engine.close()


class AlreadyFinished(Exception):
    """``--resume`` of a run that ran all its rounds, with no more rounds asked for: nothing to do (not an error).
    The message says how to extend it."""


def resume_run(
    run_dir: str | Path,
    *,
    rounds: int | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    engine: Engine | None = None,
) -> RunResult:
    """Continue the run in ``run_dir`` from its checkpoint, to the same end as a run never interrupted; with
    ``rounds`` (more than its ``config.toml`` says), extend it to that many rounds.

    Everything is checked before anything is changed: the config, the checkpoint (readable, written for this
    config) and the rows it says were written. Then the rows after the checkpoint (rounds that ran after it and
    will run again) are dropped from ``metrics.jsonl``, and the rounds after it run with the same cohorts, noise
    and training as the first time; the ledger continues from the checkpoint's, so no round is counted twice.
    Only seeded runs can be resumed: with the operating system's entropy, rounds run again would be new releases.

    Extending (``rounds=M``): the number of rounds is the only setting that may change (nothing a round computes
    before the end depends on it), and only upwards. ``config.toml`` is rewritten with ``rounds = M`` (the
    checkpoint is first made valid for it too: :func:`fedsim.report.checkpoint.retarget_checkpoint`). A finished
    run continues from the checkpoint of its last round (:func:`final_checkpoint`); one without it (written by an
    older fedsim) runs its rounds after its last checkpoint again, with the same cohorts and noise, and its rows
    up to its old end are kept as they were written. Rounds 1..M of the extended run, its ledger and
    its model are then those of a run of M rounds from scratch, except that the old last row carries the
    evaluation every run does at its end (with ``engine.eval_every > 1``). Two kinds of run are not extended
    (:class:`CheckpointError`, nothing changed): one calibrated to ``privacy.target_epsilon`` (its noise multiplier
    reaches the target after its own rounds: more would spend more), and one whose mechanism optimised its noise
    for the planned rounds (``banded-mf``, ``blt``: :func:`fedsim.privacy.settings.resume_refusal`); tree
    aggregation extends.

    A finished run with no more rounds asked for raises :class:`AlreadyFinished` and changes nothing.
    """
    point = _check_resume(Path(run_dir), rounds)
    return _continue_run(point, on_row, engine)


@dataclass
class _ResumePoint:
    """What :func:`resume_run` found, and checked, in a run directory before it changes anything: the run's
    config (and the extended one), the checkpoint to continue from and the rows up to it."""

    path: Path
    config_toml: str
    #: the scenario to run: the run's own, or with ``rounds = M`` when extended (its ``config.toml`` text beside it)
    extended: Scenario
    extended_toml: str
    #: the rounds the run's ``config.toml`` planned
    old: int
    ckpt: Checkpoint
    #: every row of a run that ran all its ``old`` rounds, else None
    finished: list[dict[str, Any]] | None
    #: the rows up to the checkpoint, which the continued run keeps
    rows: list[dict[str, Any]]
    #: ``metrics.jsonl`` holds more than ``rows`` (or a line cut short): it is rewritten before the run continues
    rewrite: bool


def _check_resume(path: Path, rounds: int | None) -> _ResumePoint:
    """Every check :func:`resume_run` makes before anything changes, in order: the config, whether there is
    anything to do, the checkpoint, the rows it says were written and the extended config. Raises
    :class:`CheckpointError` (or :class:`AlreadyFinished`) with nothing changed."""
    scenario, config_toml, target = _resumable_config(path, rounds)
    old = scenario.rounds
    # a checkpoint that is there is checked first, finished run or not: a damaged one is an error either way
    ckpt = read_checkpoint(path, config_toml) if (path / CHECKPOINT).is_file() else None
    finished = finished_rows(path, old)
    if finished is not None and target == old:
        raise AlreadyFinished(
            f"{path} is already finished: {old} of {old} rounds; nothing to do; to extend it, "
            f"--set rounds=M (M > {old})"
        )
    if ckpt is None:
        ckpt = read_checkpoint(path, config_toml)  # raises: nothing to resume from
    if ckpt.round > old:
        raise CheckpointError(
            f"{path / CHECKPOINT} is of round {ckpt.round}, after the run's last ({old}); nothing was changed"
        )
    rows, rewrite = _rows_to_checkpoint(path, ckpt.round)
    extended, extended_toml = scenario, config_toml
    if target > old:
        try:
            extended = load_scenario(str(path / "config.toml"), [f"rounds={target}"])
        except ScenarioError as exc:
            raise CheckpointError(f"rounds={target}: {exc}") from None
        extended_toml = scenario_to_toml(extended)
    return _ResumePoint(path, config_toml, extended, extended_toml, old, ckpt, finished, rows, rewrite)


def _resumable_config(path: Path, rounds: int | None) -> tuple[Scenario, str, int]:
    """The run's scenario, its ``config.toml`` text and the rounds to run to, once the config allows continuing:
    it loads, its engine is one the round loop drives, the privacy rules of continuing a run allow it, the run
    is not shortened and its trackers can start."""
    config = path / "config.toml"
    if not config.is_file():
        raise CheckpointError(f"{path} is not a run directory (no config.toml)")
    config_toml = config.read_text()
    try:
        scenario = load_scenario(str(config))
    except ScenarioError as exc:
        raise CheckpointError(f"{config} no longer loads: {exc}") from None
    if engine_entry(scenario.engine.name).drives_loop:
        raise CheckpointError(
            f"--resume continues runs of engine.name {_in_loop_engines(' or ')}; "
            f"this run used {scenario.engine.name!r}"
        )
    old = scenario.rounds
    target = old if rounds is None else _rounds(rounds)
    # the privacy rules of continuing a run (fedsim.privacy.settings: canaries, OS entropy, a calibrated noise
    # multiplier, a mechanism optimised for the planned rounds); the run directory's own checks follow
    why = resume_refusal(privacy_settings(scenario), scenario.privacy.randomness, old, target)
    if why:
        raise CheckpointError(why)
    if target < old:
        raise CheckpointError(
            f"rounds={target}: this run has rounds = {old} in its config.toml; a run can be extended "
            f"(rounds > {old}), never shortened; nothing was changed"
        )
    check_trackers(scenario)
    return scenario, config_toml, target


def _rows_to_checkpoint(path: Path, ckpt_round: int) -> tuple[list[dict[str, Any]], bool]:
    """The rows of rounds ``1..ckpt_round`` from ``metrics.jsonl``, and whether the file must be rewritten (it
    holds rows after the checkpoint, or a line the kill cut short). A file that does not hold those rounds in
    order raises :class:`CheckpointError`."""
    metrics = path / "metrics.jsonl"
    clean = True
    try:
        rows = read_rows(path) if metrics.is_file() else []
    except ValueError as exc:  # a line cut short by the kill is after the checkpoint's rows, or it is corrupt
        clean = False
        lines = metrics.read_text().splitlines()
        try:
            rows = [json.loads(x) for x in lines[:ckpt_round]]
        except ValueError:
            raise CheckpointError(f"{metrics} is corrupt before round {ckpt_round} ({exc})") from None
    in_order = [r.get("round") for r in rows[:ckpt_round]] == list(range(1, ckpt_round + 1))
    if len(rows) < ckpt_round or not in_order:
        raise CheckpointError(
            f"{metrics} holds {len(rows)} rows but the checkpoint is of round {ckpt_round}; nothing was changed"
        )
    return rows[:ckpt_round], not clean or len(rows) != ckpt_round


def _continue_run(
    point: _ResumePoint,
    on_row: Callable[[dict[str, Any]], None] | None,
    engine: Engine | None,
) -> RunResult:
    """Run the rounds after the checkpoint :func:`_check_resume` found; from here on the run directory changes
    (the extended config, the rows after the checkpoint dropped, the new rounds written)."""
    path, old, ckpt, finished = point.path, point.old, point.ckpt, point.finished
    t0 = time.perf_counter()
    # what torch warns from here (the checks probe the training paths; the engine trains and evaluates) goes to
    # the run's run.log, with one line on the console saying how many
    with TorchWarnings(path):
        exp = build_experiment(point.extended)
        if ckpt.weights.shape != exp.initial_weights.shape:
            raise CheckpointError(
                f"the checkpoint's model has {ckpt.weights.size} parameters, "
                f"the scenario's {exp.initial_weights.size}"
            )
        # from here on the run directory changes: the config of an extended run, then the rows that will be
        # computed again are dropped
        if point.extended_toml != point.config_toml:
            # the checkpoint is valid for both configs until the next one is written
            retarget_checkpoint(path, point.config_toml, point.extended_toml)
            config = path / "config.toml"
            tmp = config.with_name(config.name + ".tmp")
            tmp.write_text(point.extended_toml)
            os.replace(tmp, config)
        emit = on_row
        # the old rounds run again are not news: not shown again
        if finished is not None and on_row is not None:

            def emit(row: dict[str, Any]) -> None:
                if row.get("round", 0) > old:
                    on_row(row)

        writer = RunWriter(path)
        writer.model_factory = model_factory(exp.settings, exp.data.input_shape, exp.data.num_classes)
        try:
            if point.rewrite:
                writer.replace_rows(point.rows)
            result = _run_on_engine(exp, engine, writer, emit, t0, resume=ckpt, prior_rows=point.rows)
        finally:
            writer.close()
    if finished is not None and ckpt.round < old and len(result.rows) >= old:
        # the rounds of the finished run after its last checkpoint ran again with the same cohorts and noise: their
        # rows stay as they were written (the old last one holds the evaluation every run does at its end)
        result.rows[:old] = finished
        writer = RunWriter(path)
        try:
            writer.replace_rows(result.rows)
        finally:
            writer.close()
        writer.write_plots()  # drawn from metrics.jsonl
    final_checkpoint(writer, result, point.extended)
    return result


def _rounds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"rounds={value!r}: give a whole number of rounds >= 1; nothing was changed")
    return int(value)


def finished_rows(run_dir: str | Path, rounds: int) -> list[dict[str, Any]] | None:
    """The rows of the run in ``run_dir`` if it ran all its ``rounds`` rounds and wrote its summary (a run that
    raised or was stopped early did not finish), else None."""
    path = Path(run_dir)
    try:
        summary = json.loads((path / "summary.json").read_text())
        rows = read_rows(path)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    stop = summary_stop(summary)
    done = stop["stopped_by"] is None and stop["rounds_completed"] == rounds == summary.get("rounds_planned")
    return rows if done and [r.get("round") for r in rows] == list(range(1, rounds + 1)) else None
