"""The ``fedsim`` command.

``fedsim run NAME|PATH [--set key=value ...] [--out DIR]``: run a scenario end to end.
``fedsim scenarios``: list the shipped scenarios.
``fedsim privacy ...``: the central accountant on its own (see ``fedsim privacy --help``).

Exit codes: 0 done; 2 bad input, with a one-line (or one-block) message naming what was wrong and no traceback;
3 stopped by the privacy budget (``privacy.max_epsilon``) before the round that would have exceeded it, every
finished round written; 4 stopped because more than ``engine.max_failed_fraction`` of a round's sampled clients
failed (that round not released, every earlier round written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
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
        console.print(f"[red]failures: {result.stopped_reason}[/red]")
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
