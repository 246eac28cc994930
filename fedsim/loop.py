"""The one round loop: every engine, Flower's Simulation Engine and a deployed ServerApp run their rounds here.

One round (``docs/architecture.md``, section 2): the strategy samples the cohort and fixes the clip
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

import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedsim.experiment import Experiment
from fedsim.labels import NON_PRIVATE
from fedsim.privacy.canaries import CanaryClients
from fedsim.privacy.row_bounds import paper_bounds, privacy_columns
from fedsim.report.attack import attack_columns
from fedsim.report.checkpoint import Checkpoint, write_checkpoint
from fedsim.report.rows import evaluation_columns, ledger_private, merge_columns, summary
from fedsim.report.rundir import RunWriter
from fedsim.report.trackers import start_trackers
from fedsim.round import PartialSum
from fedsim.round.randomness import STREAM_SECAGG
from fedsim.run_checks import exp_warnings, log_start
from fedsim.secagg.simulated import simulate_round
from fedsim.strategies import BudgetExhausted, DPFedAvg, RoundPlan
from fedsim.training.precision import TF32
from fedsim.training.vectorized import check_vectorize

log = logging.getLogger(__name__)


class Engine(Protocol):
    """Where a round's cohort trains. Implemented by the in-process and Ray engines (:mod:`fedsim.engine`) and by
    :class:`fedsim.flower.grid_engine.GridEngine` (Flower's Simulation Engine, or a real SuperLink); chosen by
    ``engine.name`` through :mod:`fedsim.registry`, where a new engine is registered."""

    #: the engine's ``engine.name`` (its registry entry: :mod:`fedsim.registry`)
    name: str

    def train(self, plan: RoundPlan, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        """Train ``plan.cohort`` from ``weights``: the sum of their clipped updates and per-client metrics."""
        ...

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per client: ``[client, num_examples, loss_sum, correct]``."""
        ...

    def close(self) -> None:
        """Release what the engine holds (workers, processes, a Ray connection); the round loop does not call it:
        whoever started the engine does."""
        ...


@dataclass
class RunResult:
    """What a run gives back (:func:`fedsim.run`, :func:`run_rounds`): its rows, its final model, the strategy that
    released them and why it stopped. The run directory holds the same, written as the run went
    (``metrics.jsonl``, ``model.npz``, ``ledger.json``, ``summary.json``)."""

    #: the run directory (``None`` when nothing was written: ``fedsim.run(..., write=False)``)
    run_dir: Path | None
    #: one dict per round, as in ``metrics.jsonl``: ``round``, ``epsilon`` (certified, at ``delta``, by
    #: ``accountant``), ``heldout_accuracy`` and ``heldout_loss`` on clients never trained on (on evaluated
    #: rounds), the paper bounds (``paper_epsilon_igmm``, ...), ``generalization``, and under ``non_private`` the
    #: diagnostics epsilon does not cover (training-client metrics, exact counts, timings)
    rows: list[dict[str, Any]]
    #: the final model as a flat float64 vector (``model.npz``; :func:`fedsim.load_model` gives the module)
    weights: np.ndarray
    #: the strategy after the last round: its ``ledger`` (every release), ``epsilon()``, ``clip``
    strategy: DPFedAvg
    #: why the run stopped early, in words (``None`` when it ran every round)
    stopped_reason: str | None = None
    #: seconds per phase of the run (non-private)
    timings: dict[str, float] = field(default_factory=dict)
    #: why the run stopped early: ``"budget"`` (``privacy.max_epsilon``) or ``"failures"`` (more than
    #: ``engine.max_failed_fraction`` of a round's cohort failed); ``None`` when it ran every round
    stopped_by: str | None = None
    #: with diagnostics on, why exactly (failure counts, the first client error): non-private
    stopped_detail: str | None = None
    #: the engine that trained the rounds: ``{"name", "requested", "why"}`` (:func:`engine_description`)
    engine: dict[str, Any] | None = None
    #: what the run's settings do that they do not say (:func:`fedsim.run_checks.run_warnings`), as ``summary.json``
    #: records them: ``{"kind", "message", "values"}``
    warnings: list[dict[str, Any]] = field(default_factory=list)


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

    An error raised in a round (by the engine, the strategy, a row's consumer) leaves every earlier round's row
    written and the run directory finished (:meth:`RoundLoop.finish`) before it propagates.
    """
    t0 = time.perf_counter()
    loop = RoundLoop(
        exp,
        engine,
        writer=writer,
        on_row=on_row,
        diagnostics=diagnostics,
        server_eval=server_eval,
        available=available,
        timings=timings,
        resume=resume,
        prior_rows=prior_rows,
    )
    t_rounds = time.perf_counter()
    try:
        loop.run()
    finally:
        result = loop.finish(failed=sys.exc_info()[0] is not None, t0=t0, t_rounds=t_rounds)
    return result


class BackgroundEpsilon:
    """The certified epsilon of the last released round, computed in a background thread (one at a time).

    :meth:`submit` starts ``strategy.epsilon()`` for a round's row; :meth:`settle` waits for it, stores it in the
    row and in ``strategy.history``, and hands the row on to ``complete``. At most one row is pending: it must be
    settled before the next round's release enters the ledger. :meth:`close` settles what is pending (its error
    swallowed: the run is failing already) and shuts the thread down.
    """

    def __init__(self, strategy: Any, complete: Callable[[dict[str, Any]], None]) -> None:
        self.strategy = strategy
        self.complete = complete
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedsim-accountant")
        self._pending: tuple[dict[str, Any], Future] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def submit(self, row: dict[str, Any]) -> None:
        """Compute the epsilon after the strategy's last release for ``row`` (which holds its ``round_index``)."""
        self._pending = (row, self._pool.submit(self.strategy.epsilon))

    def settle(self) -> None:
        """Wait for the pending row's epsilon (if any) and complete the row."""
        if self._pending is None:
            return
        row, future = self._pending
        self._pending = None
        row["epsilon"] = self.strategy.history[row.pop("round_index")]["epsilon"] = float(future.result())
        self.complete(row)

    def close(self) -> None:
        if self._pending is not None:  # an error in round t+1 must not cost round t its row
            try:
                self.settle()
            except Exception:
                pass
        self._pool.shutdown(wait=True)


class RoundLoop:
    """One run of :func:`run_rounds`, in parts: :meth:`run` (each round: :meth:`step`, which trains and releases,
    :meth:`evaluate`, :meth:`checkpoint`), the rows completed in the background (:class:`BackgroundEpsilon`,
    :meth:`write_row`), and :meth:`finish` (the run directory and the trackers, whatever happened).

    Built with the arguments of :func:`run_rounds`; the trackers start here (one that cannot start raises before
    anything else is started)."""

    def __init__(
        self,
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
    ) -> None:
        self.exp, self.engine, self.writer, self.on_row = exp, engine, writer, on_row
        self.diagnostics, self.server_eval, self.available = diagnostics, server_eval, available
        scenario, strategy = self.scenario, self.strategy = exp.scenario, exp.strategy
        #: privacy.canaries: the canary clients inserted into the population (simulation only), else None
        self.canaries = make_canaries(exp)
        #: the clients with data, whom the generalization statement is about (canaries are not drawn from the data)
        self.data_clients = int(exp.train_ids.size)
        #: the public population (fixed before round 1: fedsim.experiment.public_population, which counts the
        #: canaries expected to be inserted): what the paper bounds and the audit are computed over, never the
        #: realised count (with canaries, how many were inserted is the audit's secret)
        self.population = int(
            strategy.population or self.data_clients + (self.canaries.inserted if self.canaries else 0)
        )
        self.delta, self.rounds = scenario.privacy.delta, scenario.rounds
        self.bounds = paper_bounds(strategy, self.population, self.rounds, self.delta)
        self.weights = exp.initial_weights
        self.rows: list[dict[str, Any]] = list(prior_rows or [])
        self.first = 1
        if resume is not None:
            strategy.load_state_dict(resume.strategy)
            self.weights, self.first = np.asarray(resume.weights, dtype=np.float64), resume.round + 1
        # only a seeded run can be continued (fedsim.engine.runner.resume_run): a checkpoint of one that draws from
        # the operating system (every deployment) could never be used
        resumable = writer is not None and writer.config_toml is not None and strategy.randomness == "seeded"
        self.every = int(scenario.engine.checkpoint_every) if resumable else 0
        self.timings = dict(timings or {})
        self.stopped: str | None = None
        self.stopped_by: str | None = None
        self.stopped_detail: str | None = None
        self.train_path = training_path(engine, exp)
        self.train_fallbacks = training_fallbacks(engine, exp)
        self.engine_info = engine_description(engine, scenario)
        # the clients evaluated in every evaluated round: all, or engine.eval_clients of each kind (a fixed sample)
        self.eval_train_ids, self.eval_heldout_ids = evaluation_clients(exp, scenario)
        # TensorBoard / MLflow ([report]; only with a run directory): off by default, and then nothing is imported.
        # One that cannot start is a ValueError here, before the first round; one that fails later only warns
        self.trackers = start_trackers(
            scenario,
            writer.path if writer else None,
            config_toml=writer.config_toml if writer else None,
            first_round=self.first,
            prior_rows=self.rows,
            private=_nominal_private(strategy, self.population),
        )
        self.accounting = BackgroundEpsilon(strategy, self.write_row)

    def run(self) -> None:
        """Every round from the first to ``rounds``, or until one stops the run; then the last row. Before the
        first: the one line saying why the engine trains on a slower path than it tried first, if it does."""
        fell_back = describe_training(self.train_path, self.train_fallbacks)
        if fell_back:
            log.warning("%s", fell_back)
        log_start(self.exp)  # the run's facts and its warnings (fedsim.run_checks), before the first round
        for t in range(self.first, self.rounds + 1):
            if not self.step(t):
                break
        self.accounting.settle()

    def step(self, t: int) -> bool:
        """Round ``t``: sample, train, release, evaluate, checkpoint. False when the run stops before releasing it
        (the budget, or too many failed clients)."""
        if self.scenario.privacy.max_epsilon is not None:
            self.accounting.settle()
        ids = self.exp.train_ids if self.available is None else self.available(t)
        if self.canaries is not None:  # sampled like every client, from the population the accountant counts
            ids = np.concatenate([np.asarray(ids, dtype=np.int64), self.canaries.ids])
        try:
            plan = self.strategy.begin_round(t, ids)
        except BudgetExhausted as exc:
            self.stopped, self.stopped_by = str(exc), "budget"
            return False
        t_round = time.perf_counter()
        partial, client_metrics = self.train(plan)
        self.accounting.settle()  # round t-1's epsilon, computed while this round trained
        if self.refuse(t, plan, partial, client_metrics):
            return False
        before = self.weights
        row = self.release(plan, partial, client_metrics, t_round)
        self.accounting.submit(row)
        evaluated = t % self.scenario.engine.eval_every == 0 or t == self.rounds
        if self.canaries is not None:
            self.canaries.observe(before, self.weights, self.exp.initial_weights)
            if evaluated:
                row["empirical_privacy"] = self.canaries.estimates()
        if evaluated:
            self.evaluate(t, row)
        row[NON_PRIVATE]["round_time_s"] = time.perf_counter() - t_round
        self.checkpoint(t)
        return True

    def train(self, plan: RoundPlan) -> tuple[PartialSum, list[dict[str, Any]]]:
        """The engine trains the round's real clients; the sampled canaries (:mod:`fedsim.privacy.canaries`)
        submit their directions, scaled to the round's clip, into the same clipped sum. With secure aggregation on an
        engine that does not run the protocol (every simulated one), the round is run as if under SecAgg+
        (:func:`fedsim.secagg.simulated.simulate_round`): the clients that drop after sharing their keys do not train
        and are counted as ``dropped``, and a round that could not be unmasked is marked aborted."""
        secagg = getattr(self.strategy.privacy, "secagg", None)
        if secagg is None or getattr(self.engine, "secure_aggregation", False):
            return self._train(plan)
        sim = simulate_round(plan.cohort, secagg, self.strategy.noise.rng(plan.round, STREAM_SECAGG))
        kept = plan.cohort[~np.isin(plan.cohort, sim.dropped)]
        partial, client_metrics = self._train(replace(plan, cohort=kept))
        partial.reject(int(sim.dropped.size), reason="dropped")
        failed = [m["client"] for m in client_metrics if "failed" in m and not m.get("canary")]
        partial.secure_abort = sim.aborted(failed)
        return partial, client_metrics

    def _train(self, plan: RoundPlan) -> tuple[PartialSum, list[dict[str, Any]]]:
        if self.canaries is None:
            return self.engine.train(plan, self.weights)
        is_canary = self.canaries.is_canary(plan.cohort)
        partial, client_metrics = self.engine.train(
            replace(plan, cohort=plan.cohort[~is_canary]), self.weights
        )
        cids = plan.cohort[is_canary]
        norms = self.canaries.submit(partial, cids, plan.clip)  # vectorised: thousands of canaries are cheap
        client_metrics.extend(
            {"client": c, "canary": True, "update_norm": n}
            for c, n in zip(cids.tolist(), norms.tolist(), strict=True)
        )
        return partial, client_metrics

    def refuse(
        self, t: int, plan: RoundPlan, partial: PartialSum, client_metrics: list[dict[str, Any]]
    ) -> bool:
        """Whether round ``t`` must not be released (:func:`too_many_failures`); if so, the run's stop is set.
        Nothing of such a round is released, so nothing is accounted."""
        if (
            partial.secure_abort is not None
        ):  # secure aggregation could not unmask the sum: there is nothing to release
            self.stopped, self.stopped_by = (
                f"stopping at round {t}: secure aggregation aborted the round (too few surviving clients to unmask "
                "the sum); the round was not released, earlier rounds are written",
                "secagg_aborted",
            )
            # which secret lacked shares, and how many, are exact facts about clients: diagnostics only
            self.stopped_detail = f"{self.stopped}: {partial.secure_abort}" if self.diagnostics else None
            return True
        floor = self.strategy.noise_floor_refusal(plan, partial)
        if (
            floor is not None
        ):  # the failure policy of a round that cannot be released: stop, keep what was written
            self.stopped, self.stopped_by = (
                f"stopping at round {t}: {floor}; the round was not released, earlier rounds are written",
                "noise_floor",
            )
            # how many arrived is an exact fact about clients: non-private, with diagnostics only
            self.stopped_detail = (
                f"{self.stopped}: {partial.noise_shares} of the {plan.cohort.size} sampled clients' shares arrived"
                if self.diagnostics
                else None
            )
            return True
        max_fraction = self.scenario.engine.max_failed_fraction
        too_many = too_many_failures(t, partial, int(plan.cohort.size), max_fraction)
        if too_many is None:
            return False
        # the counts and the client's error are exact facts about clients: non-private, never at the top
        self.stopped, self.stopped_by = (
            f"stopping at round {t}: more than engine.max_failed_fraction="
            f"{max_fraction:g} of its sampled clients failed; the round was not "
            "released, earlier rounds are written",
            "failures",
        )
        self.stopped_detail = _with_first_error(too_many, client_metrics) if self.diagnostics else None
        return True

    def release(
        self, plan: RoundPlan, partial: PartialSum, client_metrics: list[dict[str, Any]], t_round: float
    ) -> dict[str, Any]:
        """The strategy finishes the round (noise, average, step; the release enters the ledger); its row, without
        the epsilon (:class:`BackgroundEpsilon`) or the evaluation yet."""
        self.weights, m = self.strategy.finish_round(plan, self.weights, partial, account=False)
        row: dict[str, Any] = {
            **m,
            "delta": self.delta,
            "accountant": self.scenario.privacy.accountant,
            "randomness": self.strategy.randomness,
            "round_index": len(self.strategy.history) - 1,
        }
        # timings grow with the realised cohort: diagnostics, like the exact counts
        diag = row[NON_PRIVATE] = {**m[NON_PRIVATE], "train_time_s": time.perf_counter() - t_round}
        trained = [c for c in client_metrics if "train_loss" in c and "failed" not in c]
        used = sorted({str(c["trainer"]) for c in client_metrics if "trainer" in c})
        if trained:
            diag["client_train_loss"] = float(np.mean([c["train_loss"] for c in trained]))
        if used:  # what this round's clients ran on: a chunk that raised was retried on the loop (exact)
            diag["local_training_used"] = ",".join(used)
        if self.train_path is not None:  # the configured path, the same in every row whatever the cohort did
            row["local_training"] = self.train_path
        return row

    def evaluate(self, t: int, row: dict[str, Any]) -> None:
        """Evaluate the new global model into ``row``: the held-out clients (``server_eval``) and, with diagnostics,
        the training clients and the membership attack."""
        engine, exp = self.engine, self.exp
        heldout_ids = self.eval_heldout_ids
        held = engine.evaluate(heldout_ids, self.weights) if self.server_eval and heldout_ids.size else None
        if held is not None and heldout_ids.size < exp.heldout_ids.size:
            row["heldout_clients_evaluated"] = int(heldout_ids.size)  # engine.eval_clients: a fixed sample
        if self.diagnostics:
            trained_rows = engine.evaluate(self.eval_train_ids, self.weights)
            if self.eval_train_ids.size < exp.train_ids.size:
                row.setdefault(NON_PRIVATE, {})["train_clients_evaluated"] = int(self.eval_train_ids.size)
            merge_columns(row, evaluation_columns(exp.data, trained_rows, held))
            if self.scenario.report.membership_attack and held is not None:
                row[NON_PRIVATE]["attack"] = attack_columns(trained_rows, held, self.scenario.data_seed, t)
        elif held is not None:  # held-out clients only: data the server owns, never trained on
            merge_columns(row, evaluation_columns(exp.data, None, held))

    def checkpoint(self, t: int) -> None:
        """After every ``checkpoint_every``-th round but the last: the checkpoint, once round ``t``'s row is written."""
        if self.every and t % self.every == 0 and t < self.rounds:
            self.accounting.settle()  # row t is written before the checkpoint that says it is
            write_checkpoint(
                self.writer.path, t, self.weights, self.strategy.state_dict(), self.writer.config_toml
            )

    def write_row(self, row: dict[str, Any]) -> None:
        """Complete a row whose epsilon is known (privacy columns; the diagnostics dropped unless asked for) and
        hand it on: the rows, ``metrics.jsonl``, the trackers, ``on_row``."""
        fell_back = getattr(self.strategy.ledger, "fell_back", None)
        answered = fell_back(row["accountant"]) if fell_back else None
        if (
            answered
        ):  # the accountant would not fit in memory (PLD): the valid, looser epsilon of its fallback
            used, why = answered
            row["accountant_used"] = used
            row["accountant_note"] = f"{row['accountant']} impractical ({why}); epsilon from {used}"
        row.update(privacy_columns(row["round"], row["epsilon"], self.bounds, self.delta, self.data_clients))
        if not self.diagnostics:
            row.pop(NON_PRIVATE, None)
        self.rows.append(row)
        if self.writer:
            self.writer.append_row(row)
        if self.trackers:
            self.trackers.log_row(row)
        if self.on_row:
            self.on_row(row)

    def finish(self, *, failed: bool, t0: float, t_rounds: float) -> RunResult:
        """Whatever happened (``failed``: an error is propagating): the pending row written, the accountant thread
        shut down, the timings, the trackers closed, then the run directory (:meth:`write_run_dir`)."""
        self.accounting.close()
        timings = self.timings
        timings["rounds_s"] = time.perf_counter() - t_rounds
        timings.update(first_round_timings(self.rows[self.first - 1 :]))  # the rounds this run trained
        timings["total_s"] = (
            timings.get("setup_s", 0.0) + timings.get("engine_start_s", 0.0) + (time.perf_counter() - t0)
        )
        result = RunResult(
            self.writer.path if self.writer else None,
            self.rows,
            self.weights,
            self.strategy,
            self.stopped,
            timings,
            self.stopped_by,
            self.stopped_detail,
            self.engine_info,
            warnings=[w.to_dict() for w in exp_warnings(self.exp)],
        )
        if self.trackers:  # never raises
            private = _nominal_private(self.strategy, self.population, final=bool(self.rows))
            self.trackers.close(
                failed=failed, private=private, stopped_by=self.stopped_by, diagnostics=self.diagnostics
            )
        self.write_run_dir()
        return result

    def write_run_dir(self) -> None:
        """Close ``metrics.jsonl``; write ``model.npz``, ``ledger.json``, ``summary.json`` and the plots."""
        writer, strategy = self.writer, self.strategy
        if not writer:
            return
        writer.close()
        writer.write_weights("model.npz", self.weights)
        writer.write_json("ledger.json", strategy.ledger.to_dict())
        writer.write_json(
            "summary.json",
            summary(
                self.scenario,
                self.rows,
                strategy,
                self.stopped,
                self.timings,
                self.population,
                self.stopped_by,
                self.diagnostics,
                local_training=self.train_path,
                local_training_fallbacks=self.train_fallbacks,
                engine=self.engine_info,
            )
            | {"warnings": [w.to_dict() for w in exp_warnings(self.exp)]},  # fedsim.run_checks
        )
        writer.write_plots()


def make_canaries(exp: Experiment) -> CanaryClients | None:
    """The run's canary clients (``privacy.canaries``), their ids after every real client's; None without."""
    p = exp.scenario.privacy
    if not p.canaries:
        return None
    data = exp.data
    last_id = max(int(np.max(exp.train_ids, initial=-1)), int(np.max(exp.heldout_ids, initial=-1)))
    return CanaryClients(
        int(p.canaries),
        int(exp.initial_weights.size),
        int(exp.scenario.noise_seed),  # the privacy mechanism's side (scenarios.schema.SEEDS)
        max(last_id + 1, int(getattr(data, "num_clients", 0))),
        float(p.delta),
        float(p.canary_confidence),
    )


def engine_description(engine: Any, scenario: Any) -> dict[str, Any]:
    """Which engine trained the rounds (public): ``name`` (the engine's, ``None`` when it does not say),
    ``requested`` (``engine.name``) and, when ``auto`` picked it, ``why`` (:mod:`fedsim.engine.auto`); ``tf32``:
    whether CUDA training used TensorFloat-32 (never: :mod:`fedsim.training.precision`)."""
    choice = getattr(engine, "choice", None)
    return {
        "name": getattr(engine, "name", None),
        "requested": scenario.engine.name,
        "why": getattr(choice, "why", None),
        # torch's CPU threads where the cohort trained, and why (fedsim.engine.threads): None when not said
        "torch_threads": getattr(engine, "torch_threads", None),
        "torch_threads_why": getattr(engine, "torch_threads_why", None),
        # fedsim's trainer computes in full FP32 on CUDA, TF32 off (fedsim.training.precision)
        "tf32": TF32,
    }


def evaluation_clients(exp: Experiment, scenario: Any) -> tuple[np.ndarray, np.ndarray]:
    """The training and held-out clients every evaluated round evaluates: all of them, or with
    ``engine.eval_clients = k`` at most k of each, drawn once (seeded by the scenario's data seed, without replacement,
    sorted) and the same in every round, so an evaluated round's cost does not grow with the population. The
    sample is a function of the seed and the client ids only: it is the same on every engine and after a resume."""
    k = scenario.engine.eval_clients
    train, held = np.asarray(exp.train_ids), np.asarray(exp.heldout_ids)
    if k is None:
        return train, held
    rng = np.random.default_rng([int(scenario.data_seed), EVAL_SAMPLE_STREAM])
    return tuple(  # type: ignore[return-value]
        np.sort(rng.choice(ids, size=k, replace=False)) if ids.size > k else ids for ids in (train, held)
    )


#: the stream of :func:`evaluation_clients`' generator (its own: no other random quantity draws from it)
EVAL_SAMPLE_STREAM = 0xE7A1


def first_round_timings(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The first round this run trained, against the others: ``first_round_s`` (its training time) and
    ``first_round_extra_s`` (that, less the median of the later rounds': the one-off cost of the first round, such
    as compiling and warming up the training path). Empty with fewer than 2 rounds."""
    times = [r.get(NON_PRIVATE, {}).get("train_time_s") for r in rows]
    times = [float(t) for t in times if t is not None]
    if len(times) < 2:
        return {}
    return {"first_round_s": times[0], "first_round_extra_s": times[0] - float(np.median(times[1:]))}


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


def training_fallbacks(engine: Any, exp: Experiment) -> tuple[str, ...] | None:
    """Why the engine's trainers refused the paths faster than the one they took (``"per-layer: <reason>"``,
    ``"vmap: <ExcType>: <reason>"``; :func:`fedsim.training.vectorized.choose_path`): empty when the first path
    tried was taken or ``engine.vectorize`` names the path. Public, like :func:`training_path`.

    From the engine's ``training_fallbacks``, else its trainer's path, else ``()`` when ``engine.vectorize`` names
    a path (nothing is tried before it). ``None`` (unknown) for an engine that does not say, with ``auto``.
    """
    said = getattr(engine, "training_fallbacks", None)
    if isinstance(said, (tuple, list)) and all(isinstance(s, str) for s in said):
        return tuple(said)
    found = getattr(getattr(getattr(engine, "trainer", None), "path", None), "fallbacks", None)
    if isinstance(found, (tuple, list)) and all(isinstance(s, str) for s in found):
        return tuple(found)
    try:
        requested = check_vectorize(getattr(exp.settings, "vectorize", "auto"))
    except ValueError:
        return None
    return None if requested == "auto" else ()


def describe_training(path: str | None, fallbacks: tuple[str, ...] | None, width: int = 400) -> str | None:
    """The console's line for a run whose trainers fell back to a slower path, one line whatever the reasons
    hold: ``local training: vmap (per-layer: <reason>)``, each reason cut to ``width`` characters (the whole
    reasons are in ``summary.json``). ``None`` when nothing fell back, or the path is not known."""
    if not path or not fallbacks:
        return None
    reasons = []
    for reason in fallbacks:
        one = " ".join(str(reason).split())
        reasons.append(one if len(one) <= width else one[: width - 3] + "...")
    return f"local training: {path} ({'; '.join(reasons)})"


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
