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
from pathlib import Path
from typing import Any

from fedsim.env import set_offline_defaults
from fedsim.report.privacy import add_parser as add_privacy

EXIT_USAGE = 2
EXIT_BUDGET = (
    3  # privacy.max_epsilon stopped the run before a round would exceed it (rows so far are written)
)
#: more than engine.max_failed_fraction of a round's cohort failed: that round was not released (rows so far written)
EXIT_FAILURES = 4


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


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fedsim.scenarios import ScenarioError, load_scenario

    if args.resume is not None:
        if args.scenario is not None or args.set or args.out is not None:
            return _fail(
                "--resume RUN_DIR continues that run with its own config.toml: give no scenario, --set or --out"
            )
        try:
            scenario = load_scenario(str(Path(args.resume) / "config.toml"))
        except ScenarioError as exc:
            return _fail(f"--resume {args.resume}: {exc}")
    elif args.scenario is None:
        return _fail("fedsim run needs a scenario (a shipped name or a .toml path), or --resume RUN_DIR")
    else:
        try:
            scenario = load_scenario(args.scenario, args.set)
        except ScenarioError as exc:
            return _fail(str(exc))
    from fedsim.engine.runner import resume_run, run_scenario
    from fedsim.report.rows import format_row

    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]fedsim run {scenario.name}[/bold]: {scenario.description}")
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.no_progress,
    )
    task = progress.add_task("starting engine", total=scenario.rounds)

    def on_row(row: dict[str, Any]) -> None:
        progress.console.print(format_row(row, scenario.rounds))
        progress.update(task, completed=row["round"], description=f"round {row['round']}")

    try:
        with progress:
            if args.resume is not None:
                result = resume_run(args.resume, on_row=on_row)
            else:
                result = run_scenario(scenario, args.out, on_row=on_row)
    except ValueError as exc:  # invalid combination found while building data, model or strategy
        return _fail(str(exc))
    _print_summary(console, result)
    if result.stopped_by == "budget":  # the last line says why the run ended early
        console.print(f"[yellow]budget: {result.stopped_reason}[/yellow]")
        return EXIT_BUDGET
    if result.stopped_by == "failures":
        console.print(f"[red]failures: {result.stopped_detail or result.stopped_reason}[/red]")
        return EXIT_FAILURES
    return 0


def describe_statement(gen: dict[str, Any]) -> str:
    status = gen.get("status", "n/a")
    if status == "ok":
        return f"P(|gen gap| > {gen['a']:.3g}) < {gen['b']:.3g} (using epsilon {gen['eps_used']:.3g})"
    n_min = gen.get("n_min")
    need = f"; the statement needs at least {n_min:,} clients" if n_min else ""
    return f"{status}{need}"


def _print_summary(console: Any, result: Any) -> None:
    rows = result.rows
    if not rows:
        console.print("no round was run")
        return
    last = rows[-1]
    gen = last.get("generalization", {})
    t = result.timings
    parts = ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in t.items() if k != "total_s"
    )
    console.print(f"done: {len(rows)} rounds in {t.get('total_s', 0):.1f} s ({parts})")
    diag = last.get("non_private", {})
    if last.get("heldout_accuracy") is not None:
        console.print(
            f"final: held-out acc {last['heldout_accuracy']:.3f}; train acc {diag['train_accuracy']:.3f}, "
            f"gap {diag['gap_accuracy']:+.3f} (non-private diagnostics: epsilon does not cover them)"
        )
    igmm = last.get("paper_epsilon_igmm")
    console.print(
        f"privacy: certified epsilon {last['epsilon']:.3f} at delta {last['delta']:g} ({last['accountant']}); "
        f"IGMM Theorem 7 as printed: {'undefined' if igmm is None else f'{igmm:.3f}'} (paper bound, not a "
        "certificate)"
    )
    if result.run_dir:
        audit = json.loads((result.run_dir / "summary.json").read_text()).get("paper_bounds_audit", {})
        for method, verdict in audit.get("verdicts", {}).items():
            console.print(f"audit {method}: {verdict}")
    console.print(
        f"generalization (UAI Theorem 1 over {gen.get('population')} training clients): {describe_statement(gen)}"
    )
    if result.run_dir:
        console.print(f"run directory: {result.run_dir}")


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fedsim import sweep
    from fedsim.scenarios import ScenarioError

    if args.parallel is not None and args.parallel < 1:
        return _fail(f"--parallel must be >= 1, got {args.parallel}")
    try:
        grid = sweep.parse_grid(args.grid) if args.grid else None
        base, runs = sweep.plan_sweep(args.scenario, sets=args.set, grid=grid, seeds=args.seeds, out=args.out)
        line = sweep.line_key(runs, args.line)
    except ScenarioError as exc:
        return _fail(str(exc))
    out = runs[0].out.parent.parent
    parallel = min(args.parallel or sweep.default_parallel(), len(runs))
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"[bold]fedsim sweep {base.name}[/bold]: {len(runs)} runs ({len({sweep._slug(r.setting) for r in runs})} "
        f"settings x {len({r.seed for r in runs})} seeds), {parallel} at a time, into {out}"
    )
    done = 0

    def on_result(r: Any) -> None:
        nonlocal done
        done += 1
        res = r.result
        acc, eps = res.get("heldout_accuracy"), res.get("epsilon")
        what = f"held-out acc {acc:.3f}, epsilon {eps:.3f}" if acc is not None and eps is not None else ""
        console.print(
            f"[{done}/{len(runs)}] {sweep._slug(r.setting)} seed {r.seed}: {res.get('status')} {what}"
        )

    sweep.run_sweep(args.scenario, runs, parallel=parallel, on_result=on_result)
    csv_path = sweep.write_csv(runs, out / "sweep.csv")
    plot = sweep.plot_privacy_utility(runs, out / "privacy_utility.png", line=line, title=base.name)
    columns, rows = sweep.table_rows(runs)
    table = Table(title=f"{base.name}: {len(runs)} runs (train acc and gap: non-private diagnostics)")
    shown = [c for c in columns if c != "run_dir"]
    for c in shown:
        table.add_column(sweep.SHORT_HEADERS.get(c, c.rsplit(".", 1)[-1]), no_wrap=c != "status")
    for row in rows:
        table.add_row(*[sweep.shown(c, row.get(c)) for c in shown])
    console.print(table)
    console.print(f"table: {csv_path}" + (f"; privacy-utility plot: {plot}" if plot else ""))
    failed = [r for r in runs if str(r.result.get("status", "")).startswith("error")]
    if failed:
        console.print(
            f"[red]{len(failed)} of {len(runs)} runs failed; the others are written (run again to retry)[/red]"
        )
        return 1
    return 0


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
    rows, summary = run["rows"], run["summary"]
    console.print(f"[bold]{run['path']}[/bold]: scenario {summary.get('scenario', '?')}")
    if not rows:
        console.print("no round was written")
        return
    last = rows[-1]
    planned = summary.get("rounds_planned", "?")
    stop = f"; stopped: {summary['stopped_reason']}" if summary.get("stopped_reason") else ""
    console.print(f"rounds: {len(rows)} of {planned}{stop}")
    diag = last.get("non_private") or {}
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
        f"privacy: certified epsilon {last['epsilon']:.3f} at delta {last['delta']:g} ({last['accountant']}); "
        f"IGMM Theorem 7 as printed {'undefined' if igmm is None else f'{igmm:.3f}'} (not a certificate); "
        f"corrected closed form {'undefined' if corrected is None else f'{corrected:.3f}'}"
    )
    for method, verdict in (summary.get("paper_bounds_audit") or {}).get("verdicts", {}).items():
        console.print(f"audit {method}: {verdict}")
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
        epilog="exit codes: 0 done; 2 bad input; 3 stopped by privacy.max_epsilon before the round that would "
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
        help="continue a killed run from its checkpoint (engine.checkpoint_every), to the same result",
    )
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser(
        "sweep",
        help="run a scenario over a grid of settings and seeds; compare them in a table and a plot",
        epilog="exit codes: 0 every run finished; 1 some runs failed (the others are written; run the same command "
        "again to retry them: finished runs are skipped); 2 bad input",
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
