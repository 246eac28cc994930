"""The one round loop: every engine, Flower's Simulation Engine and a deployed ServerApp run their rounds here.

One round (``shared/DESIGN.md``): the strategy samples the cohort and fixes the clip
(:meth:`~fedsim.strategies.DPFedAvg.begin_round`); the engine trains and clips (:class:`Engine`); the strategy
noises, averages, steps and records the releases in its ledger (:meth:`~fedsim.strategies.DPFedAvg.finish_round`);
the certified epsilon, the paper bounds beside it and the generalization statement are computed; the global
model is evaluated; one row is written. Rows, ``metrics.jsonl``, ``ledger.json`` and ``summary.json`` are the
same whatever the engine.

The certified epsilon of round t is computed in a background thread while round t+1 trains (the workers run in
other processes or release the GIL); row t is written once it is known, before round t+1's release enters the
ledger. With ``max_epsilon`` set, the budget check needs it first: no overlap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedsim.experiment import Experiment
from fedsim.report.attack import attack_columns
from fedsim.report.checkpoint import Checkpoint, write_checkpoint
from fedsim.report.rows import (
    NON_PRIVATE,
    evaluation_columns,
    ledger_private,
    merge_columns,
    paper_bounds,
    privacy_columns,
    summary,
)
from fedsim.report.rundir import RunWriter
from fedsim.report.trackers import start_trackers
from fedsim.round import PartialSum
from fedsim.strategies import BudgetExhausted, DPFedAvg, RoundPlan
from fedsim.training.vectorized import check_vectorize


class Engine(Protocol):
    """Where a round's cohort trains. Implemented by the in-process and Ray engines (:mod:`fedsim.engine`) and by
    :class:`fedsim.flower.grid_engine.GridEngine` (Flower's Simulation Engine, or a real SuperLink)."""

    name: str

    def train(self, plan: RoundPlan, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Train ``plan.cohort`` from ``weights``: the sum of their clipped updates and per-client metrics."""
        ...

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per client: ``[client, num_examples, loss_sum, correct]``."""
        ...

    def close(self) -> None: ...


@dataclass
class RunResult:
    run_dir: Path | None
    rows: list[dict[str, Any]]
    weights: np.ndarray
    strategy: DPFedAvg
    stopped_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: why the run stopped early: ``"budget"`` (``privacy.max_epsilon``) or ``"failures"`` (more than
    #: ``engine.max_failed_fraction`` of a round's cohort failed); ``None`` when it ran every round
    stopped_by: str | None = None
    #: with diagnostics on, why exactly (failure counts, the first client error): non-private
    stopped_detail: str | None = None


def run_rounds(
    exp: Experiment,
    engine: Engine,
    *,
    writer: RunWriter | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    diagnostics: bool = True,
    server_eval: bool = True,
    available: Callable[[int], Any] | None = None,
    timings: dict[str, float] | None = None,
    resume: Checkpoint | None = None,
    prior_rows: list[dict[str, Any]] | None = None,
) -> RunResult:
    """Run ``exp.scenario.rounds`` rounds of ``exp.strategy`` on ``engine``; write rows, the ledger and the summary.

    ``diagnostics``: also evaluate the training clients and keep the non-private diagnostics in the rows (on in
    simulation; a deployment asks for them explicitly). ``server_eval``: evaluate the held-out clients.
    ``available(t)``: the client ids round t samples from (default: the experiment's training clients).
    The engine is not closed here.

    With a writer, a seeded strategy and ``engine.checkpoint_every = k > 0``, a checkpoint
    (:mod:`fedsim.report.checkpoint`) is written after every k-th round, once that round's row is written; the
    final model goes to ``model.npz``.
    ``resume``: continue from a checkpoint (its strategy state is loaded, rounds start after its round);
    ``prior_rows``: the rows written up to it, which the summary counts.
    """
    t0 = time.perf_counter()
    scenario, strategy, data = exp.scenario, exp.strategy, exp.data
    train_ids, heldout_ids = exp.train_ids, exp.heldout_ids
    population = int(train_ids.size)
    delta, rounds = scenario.privacy.delta, scenario.rounds
    bounds = paper_bounds(strategy, population, rounds, delta)
    weights = exp.initial_weights
    rows: list[dict[str, Any]] = list(prior_rows or [])
    first = 1
    if resume is not None:
        strategy.load_state_dict(resume.strategy)
        weights, first = np.asarray(resume.weights, dtype=np.float64), resume.round + 1
    # only a seeded run can be continued (fedsim.engine.runner.resume_run): a checkpoint of one that draws from the
    # operating system (every deployment) could never be used
    resumable = writer is not None and writer.config_toml is not None and strategy.randomness == "seeded"
    every = int(scenario.engine.checkpoint_every) if resumable else 0
    timings = dict(timings or {})
    stopped: str | None = None
    stopped_by: str | None = None
    stopped_detail: str | None = None
    train_path = training_path(engine, exp)
    # TensorBoard / MLflow ([report]; only with a run directory): off by default, and then nothing is imported.
    # One that cannot start is a ValueError here, before the first round; one that fails later only warns
    trackers = start_trackers(
        scenario,
        writer.path if writer else None,
        config_toml=writer.config_toml if writer else None,
        first_round=first,
        prior_rows=rows,
        private=_nominal_private(strategy, population),
    )
    accountant = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedsim-accountant")
    pending: tuple[dict[str, Any], Future] | None = None

    def settle() -> None:
        nonlocal pending
        if pending is None:
            return
        row, future = pending
        pending = None
        row["epsilon"] = strategy.history[row.pop("round_index")]["epsilon"] = float(future.result())
        fallback = getattr(strategy.ledger, "pld_fallback", None)
        if (
            row["accountant"] == "pld" and fallback
        ):  # PLD would not fit in memory: a valid, looser RDP epsilon
            row["accountant_used"] = "rdp"
            row["accountant_note"] = f"pld impractical ({fallback}); epsilon from rdp"
        row.update(privacy_columns(row["round"], row["epsilon"], bounds, delta, population))
        if not diagnostics:
            row.pop(NON_PRIVATE, None)
        rows.append(row)
        if writer:
            writer.append_row(row)
        if trackers:
            trackers.log_row(row)
        if on_row:
            on_row(row)

    t_rounds = time.perf_counter()
    try:
        for t in range(first, rounds + 1):
            if scenario.privacy.max_epsilon is not None:
                settle()
            try:
                plan = strategy.begin_round(t, train_ids if available is None else available(t))
            except BudgetExhausted as exc:
                stopped, stopped_by = str(exc), "budget"
                break
            t_round = time.perf_counter()
            partial, client_metrics = engine.train(plan, weights)
            settle()  # round t-1's epsilon, computed while this round trained
            too_many = too_many_failures(
                t, partial, int(plan.cohort.size), scenario.engine.max_failed_fraction
            )
            if too_many is not None:  # nothing of this round is released, so nothing is accounted
                # the counts and the client's error are exact facts about clients: non-private, never at the top
                stopped, stopped_by = (
                    f"stopping at round {t}: more than engine.max_failed_fraction="
                    f"{scenario.engine.max_failed_fraction:g} of its sampled clients failed; the round was not "
                    "released, earlier rounds are written",
                    "failures",
                )
                stopped_detail = _with_first_error(too_many, client_metrics) if diagnostics else None
                break
            weights, m = strategy.finish_round(plan, weights, partial, account=False)
            row: dict[str, Any] = {
                **m,
                "delta": delta,
                "accountant": scenario.privacy.accountant,
                "randomness": strategy.randomness,
                "round_index": len(strategy.history) - 1,
            }
            # timings grow with the realised cohort: diagnostics, like the exact counts
            diag = row[NON_PRIVATE] = {**m[NON_PRIVATE], "train_time_s": time.perf_counter() - t_round}
            trained = [c for c in client_metrics if "train_loss" in c and "failed" not in c]
            used = sorted({str(c["trainer"]) for c in client_metrics if "trainer" in c})
            if trained:
                diag["client_train_loss"] = float(np.mean([c["train_loss"] for c in trained]))
            if used:  # what this round's clients ran on: a chunk that raised was retried on the loop (exact)
                diag["local_training_used"] = ",".join(used)
            if train_path is not None:  # the configured path, the same in every row whatever the cohort did
                row["local_training"] = train_path
            pending = (row, accountant.submit(strategy.epsilon))
            if t % scenario.engine.eval_every == 0 or t == rounds:
                held = engine.evaluate(heldout_ids, weights) if server_eval and heldout_ids.size else None
                if diagnostics:
                    trained_rows = engine.evaluate(train_ids, weights)
                    merge_columns(row, evaluation_columns(data, trained_rows, held))
                    if scenario.report.membership_attack and held is not None:
                        diag["attack"] = attack_columns(trained_rows, held, scenario.seed, t)
                elif held is not None:  # held-out clients only: data the server owns, never trained on
                    merge_columns(row, evaluation_columns(data, None, held))
            diag["round_time_s"] = time.perf_counter() - t_round
            if every and t % every == 0 and t < rounds:
                settle()  # row t is written before the checkpoint that says it is
                write_checkpoint(writer.path, t, weights, strategy.state_dict(), writer.config_toml)
        settle()
    finally:
        failed = sys.exc_info()[0] is not None
        if pending is not None:  # an error in round t+1 must not cost round t its row
            try:
                settle()
            except Exception:
                pass
        accountant.shutdown(wait=True)
        timings["rounds_s"] = time.perf_counter() - t_rounds
        timings["total_s"] = (
            timings.get("setup_s", 0.0) + timings.get("engine_start_s", 0.0) + (time.perf_counter() - t0)
        )
        result = RunResult(
            writer.path if writer else None,
            rows,
            weights,
            strategy,
            stopped,
            timings,
            stopped_by,
            stopped_detail,
        )
        if trackers:  # never raises
            private = _nominal_private(strategy, population, final=bool(rows))
            trackers.close(failed=failed, private=private, stopped_by=stopped_by, diagnostics=diagnostics)
        if writer:
            writer.close()
            writer.write_weights("model.npz", weights)
            writer.write_json("ledger.json", strategy.ledger.to_dict())
            writer.write_json(
                "summary.json",
                summary(scenario, rows, strategy, stopped, timings, population, stopped_by, diagnostics),
            )
            writer.write_plots()
    return result


def _nominal_private(strategy: Any, population: int, final: bool = False) -> bool | None:
    """The trackers' privacy status: whether the scenario's model release is noised at all (before round 1), or
    with ``final`` (at the end, some round released), whether every release in the ledger was, as
    ``summary.json`` says. ``None`` when the strategy cannot say."""
    try:
        if final:
            return ledger_private(strategy)
        return bool(strategy.mechanism(population).private)
    except Exception:
        return None


def training_path(engine: Any, exp: Experiment) -> str | None:
    """How the engine trains every cohort (``per-layer``, ``vmap`` or ``loop``): ``engine.vectorize`` as the
    engine's trainers resolved it, public (a function of the model and the settings), the same in every row.

    From the engine's ``training_path`` (a string), else its trainer's path (:class:`LocalEngine`), else the
    scenario's ``engine.vectorize`` when it names a path (a trainer takes that path or refuses to start). ``None``
    (no ``local_training`` in any row) for an engine that does not say, with ``auto``: never guessed from what a
    round's clients happened to use (``non_private.local_training_used``), which changes when a chunk raises.
    """
    said = getattr(engine, "training_path", None)
    if isinstance(said, str) and said:
        return said
    name = getattr(getattr(getattr(engine, "trainer", None), "path", None), "name", None)
    if isinstance(name, str) and name:
        return name
    try:
        requested = check_vectorize(getattr(exp.settings, "vectorize", "auto"))
    except ValueError:
        return None
    return None if requested == "auto" else requested


def too_many_failures(round_: int, partial: PartialSum, cohort: int, max_fraction: float) -> str | None:
    """Why round ``round_`` must not be released (more than ``max_fraction`` of its ``cohort`` sampled clients
    failed), or None. A failed client counts as a zero update, noise and accounting unchanged, so releasing such
    a round would be private; but a round of mostly noise is almost always a broken model, data function or
    deployment, which the operator should see rather than a run of noise. The stop itself depends on the
    clients' failures: it is an operator's diagnostic, like ``non_private``."""
    failed = partial.rejected - partial.failures.get("not_sampled", 0)
    if cohort == 0 or failed <= max_fraction * cohort:
        return None
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(partial.failures.items()) if k != "not_sampled")
    return (
        f"stopping at round {round_}: {failed} of its {cohort} sampled clients failed ({reasons}), more than "
        f"engine.max_failed_fraction={max_fraction:g}; the round was not released, earlier rounds are written"
    )


def _with_first_error(message: str, client_metrics: list[dict[str, Any]]) -> str:
    first = next((m for m in client_metrics if "error" in m), None)
    return message if first is None else f"{message}; client {first['client']}: {first['error']}"
