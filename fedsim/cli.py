"""The ``fedsim`` command.

``fedsim run NAME|PATH [--set key=value ...] [--out DIR]``: run a scenario end to end.
``fedsim scenarios``: list the shipped scenarios.
``fedsim privacy ...``: the central accountant on its own (see ``fedsim privacy --help``).
``fedsim sweep NAME|PATH [--grid key=v1,v2 ...] [--seeds N]``: compare settings (:mod:`fedsim.sweep`).
``fedsim report RUN_DIR ...``: redraw a run's plots, print its summary, overlay several runs.

Exit codes: 0 done; 2 bad input, with a one-line (or one-block) message naming what was wrong and no traceback;
3 stopped by the privacy budget (``privacy.max_epsilon``) before the round that would have exceeded it, every
finished round written; 4 stopped because more than ``engine.max_failed_fraction`` of a round's sampled clients
failed (that round not released, every earlier round written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.env import set_offline_defaults
from fedsim.labels import NON_PRIVATE
from fedsim.report.privacy import add_parser as add_privacy

EXIT_USAGE = 2
EXIT_BUDGET = (
    3  # privacy.max_epsilon stopped the run before a round would exceed it (rows so far are written)
)
#: more than engine.max_failed_fraction of a round's cohort failed: that round was not released (rows so far written)
EXIT_FAILURES = 4
#: the start of the last line of a run stopped by client failures (exit 4): it names exact failure counts
FAILURES_LABEL = "failures (non-private: exact counts about clients, not covered by epsilon)"


def _fail(message: str) -> int:
    print(f"fedsim: error: {message}", file=sys.stderr)
    return EXIT_USAGE


# Each command imports what it needs when it runs: torch, Ray and Flower are heavy, and `fedsim --help` or a
# bad argument must answer at once.


def cmd_scenarios(args: argparse.Namespace) -> int:
    from fedsim.scenarios import available_scenarios, load_scenario

    for name in available_scenarios():
        print(f"{name:<24} {load_scenario(name).description}")
    return 0


def noise_line(scenario: Any) -> str:
    """``privacy: noise multiplier 2.81 (calibrated to target epsilon 4 over 20 rounds (delta 1e-05, pld)), clip 1``:
    the noise multiplier the run uses and where it came from (a run calibrated to ``privacy.target_epsilon`` holds
    the calibrated value once it is built; a resumed run's config.toml holds it already)."""
    p = scenario.privacy
    z = p.noise_multiplier
    if p.target_epsilon is not None:
        why = (
            f"calibrated to target epsilon {p.target_epsilon:g} over {scenario.rounds} rounds "
            f"(delta {p.delta:g}, {p.accountant})"
        )
    elif z == 0:
        why = "not private: no noise, epsilon infinite"
    else:
        why = "as set"
    return f"privacy: noise multiplier {z:.4g} ({why}), clip {p.clip:g}"


class _UsageError(Exception):
    """A bad command line, found by a command's helper: the command prints the message through :func:`_fail`
    (exit 2)."""


def cmd_run(args: argparse.Namespace) -> int:
    """``fedsim run``: load the scenario (or the run to resume), run it with a line per round, print its
    summary; the exit code says how it ended (see the module docstring)."""
    from rich.console import Console

    try:
        scenario, rounds = _scenario_to_run(args)
    except _UsageError as exc:
        return _fail(str(exc))
    from fedsim.engine.base import EngineError
    from fedsim.engine.runner import AlreadyFinished, resume_run, run_scenario
    from fedsim.env import process_age_s
    from fedsim.run_checks import printed

    # the interpreter, the imports (torch, pydantic, dp-accounting, fedsim's run stack) and the scenario's loading
    startup = process_age_s()

    console = Console(highlight=False, soft_wrap=True)
    noise_shown = _print_run_header(console, scenario)
    progress, on_row = _round_progress(console, scenario, noise_shown, disable=args.no_progress)

    # the run's facts and warnings (fedsim.run_checks) where it starts
    def show(text: str, warning: bool) -> None:
        progress.console.print(text, markup=False, style="yellow" if warning else None)

    try:
        with progress, printed(show):
            if args.resume is not None:
                result = resume_run(args.resume, rounds=rounds, on_row=on_row)
            else:
                result = run_scenario(
                    scenario,
                    args.out,
                    on_row=on_row,
                    timings={} if startup is None else {"startup_s": startup},
                )
    except AlreadyFinished as exc:  # nothing to do, and nothing was changed: not an error
        console.print(str(exc), markup=False)
        return 0
    except ValueError as exc:  # invalid combination found while building data, model or strategy
        return _fail(str(exc))
    except EngineError as exc:  # the engine cannot go on: every finished round is written
        print(f"fedsim: engine error: {exc}", file=sys.stderr)
        return 1
    return _run_outcome(console, result)


def _scenario_to_run(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The scenario ``fedsim run`` runs, and with ``--resume``, the rounds to extend the run to (``--set
    rounds=M``; None to finish it as planned). A bad command line raises :class:`_UsageError`."""
    from fedsim.scenarios import ScenarioError, load_scenario

    if args.resume is None:
        if args.scenario is None:
            raise _UsageError(
                "fedsim run needs a scenario (a shipped name or a .toml path), or --resume RUN_DIR"
            )
        try:
            return load_scenario(args.scenario, args.set), None
        except ScenarioError as exc:
            raise _UsageError(str(exc)) from None
    if args.scenario is not None or args.out is not None:
        raise _UsageError(
            "--resume RUN_DIR continues that run with its own config.toml: give no scenario or --out "
            "(--set rounds=M extends it to M rounds; nothing else may change)"
        )
    from fedsim.scenarios.loader import parse_override

    rounds: int | None = None  # --resume --set rounds=M: extend the run to M rounds
    try:
        for item in args.set:
            keys, value = parse_override(item)
            if keys != ["rounds"]:
                raise ScenarioError(
                    f"--set {item}: with --resume only rounds may be changed (--set rounds=M extends the run "
                    "to M rounds); every other setting is the run's own config.toml"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"--set {item}: rounds must be a whole number >= 1")
            rounds = value
        scenario = load_scenario(
            str(Path(args.resume) / "config.toml"), None if rounds is None else [f"rounds={rounds}"]
        )
    except ScenarioError as exc:
        raise _UsageError(f"--resume {args.resume}: {exc}") from None
    return scenario, rounds


def _print_run_header(console: Any, scenario: Any) -> bool:
    """The lines a run starts with: its name and description, how replacing settings were merged, and the noise
    multiplier where it is known before the run is built. Returns whether that noise line was printed."""
    console.print(f"[bold]fedsim run {scenario.name}[/bold]: {scenario.description}")
    # how settings that replace each other were merged (also in config.toml)
    for rule in scenario.privacy.rules:
        console.print(f"settings: {rule}", markup=False)
    noise_shown = scenario.privacy.target_epsilon is None  # a calibrated value is known once the run is built
    if noise_shown:
        console.print(noise_line(scenario), markup=False)
    return noise_shown


def _round_progress(
    console: Any, scenario: Any, noise_shown: bool, *, disable: bool
) -> tuple[Any, Callable[[dict[str, Any]], None]]:
    """The run's progress bar, and the ``on_row`` that prints each round's line above it (after the calibrated
    noise multiplier, before the first round, when the header could not print it)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fedsim.report.rows import format_row

    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=disable,
    )
    task = progress.add_task("starting engine", total=scenario.rounds)

    def on_row(row: dict[str, Any]) -> None:
        nonlocal noise_shown
        # before the first round's line: the noise multiplier calibrated when the run was built
        if not noise_shown:
            progress.console.print(noise_line(scenario), markup=False)
            noise_shown = True
        # no markup: the row's "[non-private: ...]" group is text, not a rich tag
        progress.console.print(format_row(row, scenario.rounds), markup=False)
        progress.update(task, completed=row["round"], description=f"round {row['round']}")

    return progress, on_row


def _run_outcome(console: Any, result: Any) -> int:
    """After a run: its summary and warnings, the line saying why it stopped early, and the exit code (0, or
    :data:`EXIT_BUDGET` / :data:`EXIT_FAILURES`)."""
    from fedsim.run_checks import format_warning

    _print_summary(console, result)
    for warning in result.warnings:  # again beside the results they qualify (summary.json: warnings)
        console.print(format_warning(warning), markup=False, style="yellow")
    if result.stopped_by == "budget":  # the last line says why the run ended early
        console.print(f"[yellow]budget: {result.stopped_reason}[/yellow]")
        return EXIT_BUDGET
    if result.stopped_by in ("failures", "noise_floor"):  # both depend on how many clients replied
        from rich.markup import escape

        # exact failure counts and a client's error: labelled, like non_private in the rows (see privacy_scope)
        why = escape(result.stopped_detail or result.stopped_reason or "")
        console.print(f"[red]{FAILURES_LABEL}: {why}[/red]")
        return EXIT_FAILURES
    return 0


def describe_statement(gen: dict[str, Any]) -> str:
    status = gen.get("status", "n/a")
    if status == "ok":
        return f"P(|gen gap| > {gen['a']:.3g}) < {gen['b']:.3g} (using epsilon {gen['eps_used']:.3g})"
    n_min = gen.get("n_min")
    need = f"; the statement needs at least {n_min:,} clients" if n_min else ""
    return f"{status}{need}"


def print_empirical(console: Any, last: dict[str, Any]) -> None:
    """A run's canary estimates (``privacy.canaries``) and what they mean, from its last row (nothing without)."""
    emp = last.get("empirical_privacy")
    if not emp:
        return
    from fedsim.privacy.canaries import interpret

    console.print(describe_empirical(emp), markup=False)
    for line in interpret(last.get("epsilon"), last.get("paper_epsilon_igmm"), emp):
        console.print(f"  {line}", markup=False)


def describe_empirical(emp: dict[str, Any]) -> str:
    """One line on a run's canary estimates (``privacy.canaries``), labelled as estimates."""

    def fmt(v: Any) -> str:
        return "none" if v is None else f"{v:.3g}"

    conf = emp["confidence"]

    def andrew(stat: str) -> str:
        # the estimate, its confidence interval and its resolution at this canary count (rows written before these
        # were measured have none: the estimate alone)
        text = fmt(emp.get(f"andrew_epsilon_{stat}"))
        if f"andrew_epsilon_{stat}_ci_low" in emp:
            text += (
                f" [{conf:.0%} CI {fmt(emp.get(f'andrew_epsilon_{stat}_ci_low'))}, "
                f"{fmt(emp.get(f'andrew_epsilon_{stat}_ci_high'))}; resolution "
                f"{fmt(emp.get(f'andrew_resolution_{stat}'))}]"
            )
        return text

    ceiling = emp.get("steinke_epsilon_ceiling")
    m = emp["canaries_inserted"] + emp["canaries_held_out"]
    most = "" if ceiling is None else f" (ceiling {fmt(ceiling)}: the most {m} canary directions can show)"
    return (
        f"empirical (canaries, {emp['canaries_inserted']} inserted, {emp['canaries_held_out']} held out; estimates, "
        f"not certificates): Andrew et al. epsilon estimate {andrew('all_rounds')} (all rounds), "
        f"{andrew('final')} (final model); Steinke et al. lower bound "
        f"{fmt(emp.get('steinke_epsilon_lower_bound'))} at {conf:.0%} confidence{most}"
    )


def _print_summary(console: Any, result: Any) -> None:
    from fedsim.report.rows import format_epsilon

    rows = result.rows
    if not rows:
        console.print("no round was run")
        return
    last = rows[-1]
    gen = last.get("generalization", {})
    t = result.timings
    parts = ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f} s" for k, v in t.items() if k != "total_s"
    )
    console.print(
        f"done: {len(rows)} rounds in {t.get('total_s', 0):.1f} s ({parts}; timings are non-private: they grow "
        "with the realised cohort)"
    )
    engine = result.engine or {}
    if engine.get("why"):  # engine.name = "auto": which engine it picked, and why
        console.print(
            f"engine: {engine['name']} (picked by engine.name='auto': {engine['why']})", markup=False
        )
    diag = last.get(NON_PRIVATE, {})
    if last.get("heldout_accuracy") is not None:
        ppl = last.get("heldout_perplexity")
        console.print(
            f"final: held-out acc {last['heldout_accuracy']:.3f}"
            f"{'' if ppl is None else f', perplexity {ppl:.2f}'}; train acc {diag['train_accuracy']:.3f}, "
            f"gap {diag['gap_accuracy']:+.3f} (non-private diagnostics: epsilon does not cover them)"
        )
    igmm = last.get("paper_epsilon_igmm")
    console.print(
        f"privacy: certified epsilon {format_epsilon(last)} at delta {last['delta']:g} ({last['accountant']}); "
        f"IGMM Theorem 7 as printed: {'undefined' if igmm is None else f'{igmm:.3f}'} (paper bound, not a "
        "certificate)"
    )
    print_empirical(console, last)
    if result.run_dir:
        audit = json.loads((result.run_dir / "summary.json").read_text()).get("paper_bounds_audit", {})
        for method, verdict in audit.get("verdicts", {}).items():
            console.print(f"audit {method}: {verdict}")
        if audit.get("error"):
            console.print(f"paper bounds: none for {audit['error']}")
    console.print(
        f"generalization (UAI Theorem 1 over {gen.get('population')} training clients): {describe_statement(gen)}"
    )
    if result.run_dir:
        console.print(f"run directory: {result.run_dir}")


@dataclass
class _SweepPlan:
    """A sweep as ``fedsim sweep`` resolved it before anything runs: the base scenario and its runs, the setting
    the plot draws as lines, the reference (as asked for, and the setting it resolved to), the rounds the
    statistic averages, the output directory and how many runs go at a time."""

    base: Any
    runs: list[Any]
    line: str | None
    reference: str | None
    ref: dict[str, Any] | None
    last: int
    out: Path
    parallel: int


def cmd_sweep(args: argparse.Namespace) -> int:
    """``fedsim sweep``: plan the runs, check every existing run directory, run them, then write and print the
    tables (per run, per setting, paired with the reference) and the privacy-utility plot. Exit 1 when a run
    failed (the others are written)."""
    from rich.console import Console

    from fedsim import sweep

    try:
        plan = _plan_sweep(args)
    except _UsageError as exc:
        return _fail(str(exc))
    runs = plan.runs
    # a file or a pipe has no width: rich would cut the tables at 80 columns
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    _print_sweep_header(console, plan)
    sweep.run_sweep(
        args.scenario, runs, parallel=plan.parallel, on_result=_sweep_progress(console, len(runs))
    )
    return _report_sweep(console, plan)


def _plan_sweep(args: argparse.Namespace) -> _SweepPlan:
    """Resolve ``fedsim sweep``'s arguments into its runs and check every existing run directory
    (:func:`fedsim.sweep.prepare_runs`), all before anything runs. A bad command line raises
    :class:`_UsageError`."""
    from fedsim import sweep
    from fedsim.report import sweep_figure, sweep_table
    from fedsim.scenarios import ScenarioError

    if args.parallel is not None and args.parallel < 1:
        raise _UsageError(f"--parallel must be >= 1, got {args.parallel}")
    if args.last is not None and args.last < 1:
        raise _UsageError(f"--last must be >= 1, got {args.last}")
    try:
        grid = sweep.parse_grid(args.grid) if args.grid else None
        base, runs = sweep.plan_sweep(args.scenario, sets=args.set, grid=grid, seeds=args.seeds, out=args.out)
        line = sweep_figure.line_key(runs, args.line)
        # the setting every other is compared with, paired by seed: resolved before anything runs
        reference = args.reference if args.reference is not None else base.sweep.reference
        ref = sweep_table.reference_setting(runs, reference)
    except ScenarioError as exc:
        raise _UsageError(str(exc)) from None
    last = args.last or base.sweep.last
    out = runs[0].out.parent.parent
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {out} is a file; a sweep writes a directory of run directories there")
    try:  # every existing run directory is checked before anything runs (fedsim.sweep.prepare_runs)
        sweep.prepare_runs(args.scenario, runs, new_run_dirs=args.new_run_dirs)
    except ScenarioError as exc:
        raise _UsageError(str(exc)) from None
    parallel = min(args.parallel or sweep.default_parallel(), len(runs))
    return _SweepPlan(base, runs, line, reference, ref, last, out, parallel)


def _print_sweep_header(console: Any, plan: _SweepPlan) -> None:
    """The lines a sweep starts with: its runs, what its seeds vary, the reference setting, how replacing
    settings were merged, and each run directory that could not be reused."""
    from fedsim import sweep
    from fedsim.report import sweep_table

    base, runs, line, ref = plan.base, plan.runs, plan.line, plan.ref
    console.print(
        f"[bold]fedsim sweep {base.name}[/bold]: {len(runs)} runs ({len({sweep_table._slug(r.setting) for r in runs})} "
        f"settings x {len({r.seed for r in runs})} seeds), {plan.parallel} at a time, into {plan.out}"
    )
    console.print(_seeds_line(base, sorted({r.seed for r in runs}), sweep.fixed_seeds(base)), markup=False)
    if ref is not None:
        console.print(
            f"reference: {sweep_table.setting_text(ref)} ("
            + (
                f"each setting is compared seed by seed with the setting of {line} = {ref[line]} that shares its "
                "other values"
                if line and line in ref
                else "every other setting is compared with it seed by seed"
            )
            + "; --reference or sweep.reference picks another)",
            markup=False,
        )
    for rule in sweep.planned_rules(runs):  # a later layer replacing an earlier one (scenarios.loader)
        console.print(f"settings: {rule}", markup=False)
    for r in runs:
        if r.replaced is not None:
            console.print(
                f"{r.replaced} holds a run of other settings (kept as it is): this run goes to {r.out}"
            )
        if r.uncomposed is not None:  # the replaced run trained the same clients: its releases stand apart
            console.print(
                f"[bold yellow]warning[/bold yellow]: {r.uncomposed}; the epsilon of {r.out} covers its own rounds "
                "only (sweep.csv: uncomposed_releases)"
            )


def _sweep_progress(console: Any, total: int) -> Callable[[Any], None]:
    """The ``on_result`` of :func:`fedsim.sweep.run_sweep`: a line per finished run (``[done/total]``), and each
    distinct warning once per sweep."""
    from fedsim.report import sweep_table

    done = 0
    warned: set[str] = set()

    def on_result(r: Any) -> None:
        nonlocal done
        done += 1
        res = r.result
        acc, eps = res.get("heldout_accuracy_final"), res.get("epsilon")
        what = (
            f"final held-out acc {acc:.3f}, epsilon {sweep_table.shown('epsilon', eps, res)}"
            if acc is not None and eps is not None
            else ""
        )
        console.print(
            f"[{done}/{total}] {sweep_table._slug(r.setting)} seed {r.seed}: {res.get('status')} {what}"
        )
        for message in res.get("warning_messages") or []:  # each distinct warning once per sweep
            if message not in warned:
                warned.add(message)
                console.print(f"warning ({sweep_table._slug(r.setting)}): {message}", markup=False)

    return on_result


def _report_sweep(console: Any, plan: _SweepPlan) -> int:
    """After the runs: write the CSVs and the plot, print the per-run and per-setting tables and what they mean,
    the files written and the runs that failed. Returns the exit code (1 when a run failed)."""
    from fedsim.report import sweep_figure, sweep_table

    runs, last, out, line, ref = plan.runs, plan.last, plan.out, plan.line, plan.ref
    sweep_table.add_statistics(runs, last)
    csv_path = sweep_table.write_csv(runs, out / "sweep.csv", last=last)
    summary_path = sweep_table.write_summary_csv(
        runs, out / "sweep_summary.csv", last=last, reference=plan.reference, line=line
    )
    paired_path = sweep_table.write_paired_csv(
        runs, out / "sweep_paired.csv", last=last, reference=plan.reference, line=line
    )
    plot = sweep_figure.plot_privacy_utility(
        runs,
        out / "privacy_utility.png",
        line=line,
        title=plan.base.name,
        last=last,
        reference=plan.reference,
    )
    stat = sweep_table.statistic(last)
    columns, rows = sweep_table.table_rows(runs)
    console.print(_runs_table(plan, columns, rows, stat))
    per, spread = _settings_table(plan, columns, stat)
    console.print(per)
    if ref is not None:
        console.print(
            f"minus reference: each setting's {stat} minus that of the reference ({sweep_table.setting_text(ref)}"
            f"{f'; with the same values but {line}' if line and line in ref else ''}) in the same seed, the mean over seeds +- 95% Student t interval over those differences, the pairs, "
            "and in how many seeds it was above or below (sweep_paired.csv: every pair)",
            markup=False,
        )
    if spread:
        console.print(
            f"epsilon differs between the seeds of {', '.join(spread)} (min-max shown): their runs released "
            "different numbers of rounds (a stop, or a run resumed with more rounds)"
        )
    console.print(
        f"table: {csv_path}; per setting: {summary_path}; paired by seed: {paired_path}"
        + (f"; privacy-utility plot: {plot}" if plot else "")
    )
    failed = [r for r in runs if sweep_table.run_failed(r.result)]
    if failed:
        console.print(
            f"[red]{len(failed)} of {len(runs)} runs failed; the others are written (run again to retry the runs "
            "that raised or were lost; a run stopped by failures is kept as it ended)[/red]"
        )
        for r in failed:
            console.print(f"  {r.result.get('run_dir', r.out)}: {r.result.get('status')}", markup=False)
        return 1
    return 0


def _runs_table(plan: _SweepPlan, columns: list[str], rows: list[dict[str, Any]], stat: str) -> Any:
    """The sweep's table of runs: a row per run, its settings and results (``sweep.csv``'s columns, less the run
    directory, and less the data and noise seeds where every run's equal its seed)."""
    from rich.table import Table

    from fedsim.report import sweep_table

    table = Table(
        title=f"{plan.base.name}: {len(plan.runs)} runs; held-out accuracy: {stat} (fewer where a run evaluated fewer: "
        "rounds averaged) and the final round (non-private: diagnostics that epsilon does not cover)"
    )
    # a run's data_seed and noise_seed are shown where one differs from its seed (the scenario fixed it)
    same_seeds = all(row.get(k) in (None, row["seed"]) for row in rows for k in ("data_seed", "noise_seed"))
    hidden = ("run_dir", "private", *(("data_seed", "noise_seed") if same_seeds else ()))
    shown = [c for c in columns if c not in hidden]
    for c in shown:
        header = sweep_table.short_header(c, plan.last)
        # a non-private column's label must never be cut short: it is part of what the value means
        table.add_column(header, no_wrap=c != "status", min_width=max(map(len, header.splitlines())))
    for row in rows:
        table.add_row(*[sweep_table.shown(c, row.get(c), row) for c in shown])
    return table


def _settings_table(plan: _SweepPlan, columns: list[str], stat: str) -> tuple[Any, list[str]]:
    """The sweep's table of settings: mean and interval over seeds, the paired difference from the reference,
    the final round, noise multiplier, epsilon and failures. Also returns the settings whose seeds released
    different epsilons (shown as a min-max range)."""
    from rich.table import Table

    from fedsim.report import sweep_table

    runs, ref, line = plan.runs, plan.ref, plan.line
    keys = [k for k in columns if k not in sweep_table.RESULT_COLUMNS]
    per = Table(
        title=f"{plan.base.name}: per setting, held-out accuracy = {stat}, mean over seeds +- 95% Student t interval "
        "(one seed: n=1, no interval); epsilon: certified after the final round"
    )
    for k in keys:
        per.add_column(k.rsplit(".", 1)[-1], no_wrap=True)
    headers = ("n", f"held-out acc\n{stat}", "minus reference\n(paired by seed)", "final round\n(mean)")
    for header in (*headers, "noise\nmultiplier", "epsilon", "failed"):
        per.add_column(header, no_wrap=True, min_width=max(map(len, header.splitlines())))
    pairs = sweep_table.paired_to_reference(runs, ref, line)
    paired, references = (
        {sweep_table._slug(d.setting): d for d in pairs},
        sweep_table.reference_slugs(ref, pairs),
    )
    spread = []
    for s in sweep_table.summarise_settings(runs):
        acc = "n/a" if s.mean is None else f"{s.mean:.3f}"
        if s.half is not None:
            acc += f" +- {s.half:.3f}"
        elif s.mean is not None:
            acc += f" ({sweep_table.interval_text(s.n)})"
        lo, hi = s.eps_min, s.eps_max
        if s.private is False:
            eps = "inf (not private)"
        elif lo is None:
            eps = "n/a"
        elif lo == hi:
            eps = sweep_table.shown("epsilon", lo)
        else:
            eps = f"{lo:.3f}-{hi:.3f}"
            spread.append(sweep_table._slug(s.setting))
        d = paired.get(sweep_table._slug(s.setting))
        per.add_row(
            *[sweep_table.shown(k, s.setting.get(k)) for k in keys],
            str(s.n),
            acc,
            "reference" if sweep_table._slug(s.setting) in references else d.text() if d is not None else "",
            "n/a" if s.final_mean is None else f"{s.final_mean:.3f}",
            sweep_table.noise_multiplier_text(s),
            eps,
            str(s.failed),
        )
    return per, spread


def _seeds_line(base: Any, seeds: list[int], fixed: dict[str, int]) -> str:
    """Where a sweep starts: what its seeds vary (scenarios.schema.SEEDS), and what the scenario fixed."""
    listed = ", ".join(map(str, seeds))
    if not fixed:
        return (
            f"seeds {listed}: each run's data_seed and noise_seed (its data, initial model and batch order, and its "
            "cohorts and noise); the settings of one seed share all of them, so differences are paired by seed"
        )
    held = " and ".join(f"{k} = {v}" for k, v in fixed.items())
    varied = [k for k in ("data_seed", "noise_seed") if k not in fixed]
    if not varied:
        return f"{held}, fixed by the scenario: one seed ({listed}), every run on the same data and noise"
    same = "trains on the same data" if "data_seed" in fixed else "draws the same cohorts and noise"
    return f"seeds {listed}: vary {varied[0]} alone; {held} is fixed by the scenario, so every run {same}"


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fedsim.report.plots import overlay, read_run, run_plots

    console = Console(highlight=False, soft_wrap=True)
    runs = []
    for d in args.run_dirs:
        try:
            runs.append(read_run(d))
        except ValueError as exc:
            return _fail(str(exc))
    for run in runs:
        written = run_plots(run["path"])
        print_run_summary(console, run)
        console.print(f"plots: {', '.join(str(p) for p in written) or 'none (no rounds)'}")
    if len(runs) > 1:
        out = (
            Path(args.out)
            if args.out
            else Path(os.path.commonpath([str(r["path"].resolve()) for r in runs])) / "overlay"
        )
        written = overlay([r["path"] for r in runs], out)
        console.print(f"overlays of {len(runs)} runs: {', '.join(str(p) for p in written)}")
    return 0


def print_run_summary(console: Any, run: dict[str, Any]) -> None:
    """One screen about a finished (or stopped) run, from its files."""
    from rich.markup import escape

    from fedsim.report.rows import format_epsilon, summary_stop

    rows, summary = run["rows"], run["summary"]
    console.print(f"[bold]{run['path']}[/bold]: scenario {summary.get('scenario', '?')}")
    if not rows:
        console.print("no round was written")
        return
    last = rows[-1]
    planned = summary.get("rounds_planned", "?")
    stopped = summary_stop(summary)
    stop = ""
    if stopped["stopped_reason"]:  # a stop by client failures is an exact fact about clients: labelled
        label = " (non-private: exact facts about clients, not covered by epsilon)"
        label = label if stopped[NON_PRIVATE] else ""
        stop = f"; stopped{label}: {escape(str(stopped['stopped_reason']))}"
    console.print(f"rounds: {len(rows)} of {planned}{stop}")
    diag = last.get(NON_PRIVATE) or {}
    if last.get("heldout_accuracy") is not None:
        gap = diag.get("gap_accuracy")
        train = diag.get("train_accuracy")
        extra = (
            f"; train acc {train:.3f}, gap {gap:+.3f} (non-private diagnostics)"
            if train is not None and gap is not None
            else ""
        )
        console.print(f"final: held-out acc {last['heldout_accuracy']:.3f}{extra}")
    igmm = last.get("paper_epsilon_igmm")
    corrected = last.get("paper_epsilon_igmm-corrected")
    console.print(
        f"privacy: certified epsilon {format_epsilon(last)} at delta {last['delta']:g} ({last['accountant']}); "
        f"IGMM Theorem 7 as printed {'undefined' if igmm is None else f'{igmm:.3f}'} (not a certificate); "
        f"corrected closed form {'undefined' if corrected is None else f'{corrected:.3f}'}"
    )
    print_empirical(console, last)
    for method, verdict in (summary.get("paper_bounds_audit") or {}).get("verdicts", {}).items():
        console.print(f"audit {method}: {verdict}")
    if (summary.get("paper_bounds_audit") or {}).get("error"):
        console.print(f"paper bounds: none for {summary['paper_bounds_audit']['error']}")
    gen = last.get("generalization", {})
    console.print(
        f"generalization (UAI Theorem 1 over {gen.get('population')} training clients): {describe_statement(gen)}"
    )
    failed = summary.get("non_private_failed_clients") or {}
    if failed:
        console.print("failed clients (non-private): " + ", ".join(f"{k} {v}" for k, v in failed.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsim", description="Federated learning with client-level differential privacy."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a scenario end to end",
        epilog="exit codes: 0 done; 1 the engine could not go on (finished rounds are written); 2 bad input; 3 stopped by privacy.max_epsilon before the round that would "
        "exceed it (finished rounds are written); 4 stopped because more than engine.max_failed_fraction of a "
        "round's clients failed (that round is not released; earlier rounds are written); 130 interrupted",
    )
    run.add_argument(
        "scenario", nargs="?", help="a shipped scenario name (see `fedsim scenarios`) or a .toml path"
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario value, e.g. --set rounds=5 --set privacy.noise_multiplier=0.8",
    )
    run.add_argument("--out", default=None, help="run directory (default: a fresh runs/<time>-<name>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue a killed run from its checkpoint (engine.checkpoint_every), to the same result; with "
        "--set rounds=M, extend a seeded run to M rounds (the only setting that may change; a finished run with "
        "no more rounds is left as it is)",
    )
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser(
        "sweep",
        help="run a scenario over a grid of settings and seeds; compare them in a table and a plot",
        epilog="A run directory is reused (a finished run skipped, a killed seeded run resumed or run again) only when "
        "its config.toml is the run's planned config; otherwise the sweep refuses before running anything (exit 2), "
        "naming the directory and the differing keys, unless --new-run-dirs. A killed run that drew from the "
        "operating system (privacy.randomness = os-entropy) is never run again. exit codes: 0 every run finished "
        "(a stop by privacy.max_epsilon is a finish); 1 some runs failed: raised, lost with their Ray task, or "
        "stopped because too many of a round's clients failed (the others are written; run the same command again "
        "to retry the runs that raised or were lost: finished runs are skipped); 2 bad input, or an existing run "
        "directory whose config differs (nothing is run)",
    )
    sw.add_argument(
        "scenario", help="a shipped scenario name or a .toml path; its [sweep] table is the default grid"
    )
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="values of one key to compare, e.g. --grid privacy.noise_multiplier=0.5,1.0 (replaces the scenario's grid)",
    )
    sw.add_argument(
        "--seeds", type=int, default=None, help="runs per setting (default: the scenario's sweep.seeds)"
    )
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    sw.add_argument("--out", default=None, help="sweep directory (default: runs/sweep-<time>-<name>)")
    sw.add_argument(
        "--parallel", type=int, default=None, help="runs at a time on Ray (default: the CPUs here)"
    )
    sw.add_argument("--line", default=None, help="grid key drawn as one line per value in the plot")
    sw.add_argument(
        "--reference",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="the setting every other is compared with, paired by seed (the held-out accuracy difference in each "
        "seed, its mean, 95%% t interval and sign count), e.g. --reference variant=dp-fedavg or "
        "--reference privacy.noise_multiplier=0 (default: the scenario's sweep.reference, else the first setting)",
    )
    sw.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="K",
        help="compare held-out accuracy as each run's mean over its last K evaluated rounds, and per setting the "
        "mean over seeds with a 95%% Student t interval (default: the scenario's sweep.last, 5); sweep.csv keeps "
        "the final round's too",
    )
    sw.add_argument(
        "--new-run-dirs",
        action="store_true",
        help="when a run's directory holds a run whose config.toml differs from the planned one, start the run in "
        "a new directory beside it (seed0.2, seed0.3, ...; the old one is kept as it is) instead of refusing",
    )
    sw.set_defaults(func=cmd_sweep)

    rep = sub.add_parser(
        "report",
        help="redraw a run's plots (all certified accountants), print its summary; overlay several runs",
    )
    rep.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (fedsim run --out, fedsim sweep)"
    )
    rep.add_argument(
        "--out", default=None, help="where overlays of several runs go (default: <common parent>/overlay)"
    )
    rep.set_defaults(func=cmd_report)

    sc = sub.add_parser("scenarios", help="list the shipped scenarios")
    sc.set_defaults(func=cmd_scenarios)

    add_privacy(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    set_offline_defaults()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("fedsim: interrupted; finished rounds are in the run directory", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
