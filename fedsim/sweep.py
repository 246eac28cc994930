"""``fedsim sweep``: run a scenario over a grid of settings and seeds, compare the runs in a table and a plot.

A sweep is the scenario's own ``[sweep]`` table (``grid``, ``variants``, ``seeds``, ``line``), or ``--grid`` and
``--seeds`` on the command line, which replace it. Every combination of the grid's values, crossed with every
variant (a named set of linked values, e.g. a sampling scheme with the cohort that gives the same expected size)
and every seed, is one run with its own run directory ``OUT/<setting>/seed<k>``, exactly what ``fedsim run``
writes. Every run's scenario is built and validated before the first one starts, so a bad value costs nothing.

Runs go to Ray tasks, ``parallel`` at a time (each then trains on the in-process engine: a Ray task cannot hold
a pool of Ray actors of its own without starving the others, and the engine does not change a seeded run's
results beyond float rounding); with ``parallel = 1`` they run one after the other here, on the scenario's engine.

A sweep started again skips the runs that finished (their ``summary.json`` says so); a run that was killed is
resumed from its checkpoint when it has one, or else moved aside (``<dir>.incomplete-N``, never deleted) and run
again. The comparison is printed and written as ``sweep.csv``; ``privacy_utility.png`` plots the final held-out
accuracy against the certified epsilon, one line per value of the ``line`` key, mean and spread over seeds.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.scenarios import Scenario, ScenarioError, load_scenario, parse_override

#: the columns of the comparison table after the grid's own
RESULT_COLUMNS = (
    "seed",
    "heldout_accuracy",
    "train_accuracy",
    "gap_accuracy",
    "epsilon",
    "rounds",
    "wall_s",
    "status",
    "run_dir",
)


@dataclass
class SweepRun:
    """One run of a sweep: its setting (grid key -> value, plus ``variant``), seed, ``--set`` items and directory."""

    setting: dict[str, Any]
    seed: int
    overrides: list[str]
    out: Path
    result: dict[str, Any] = field(default_factory=dict)


def split_values(text: str) -> list[str]:
    """``"0.5,1.0"`` -> ``["0.5", "1.0"]``; commas inside brackets, braces or quotes do not split (``[32,32]``)."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["privacy.noise_multiplier=0.5,1.0"]`` -> ``{"privacy.noise_multiplier": [0.5, 1.0]}`` (values read as
    TOML, as ``--set`` reads them)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ScenarioError(
                f"--grid expects key=v1,v2,... (e.g. privacy.noise_multiplier=0.5,1.0), got {item!r}"
            )
        if key in grid:
            raise ScenarioError(f"--grid {key} is given twice")
        values = [parse_override(f"{key}={v}")[1] for v in split_values(raw)]
        if any(v == "" for v in values):
            raise ScenarioError(f"--grid {item!r} has an empty value")
        grid[key] = values
    return grid


def toml_value(value: Any) -> str:
    """A value as ``--set`` reads it back (a TOML literal); None, or the string ``"none"`` (TOML has no null, so a
    ``[sweep]`` table writes it so), removes the key, as ``--set key=none`` does."""
    import tomli_w

    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        return "none"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _slug(setting: dict[str, Any]) -> str:
    parts = []
    for key, value in setting.items():
        short = key.rsplit(".", 1)[-1]
        text = value if isinstance(value, str) else toml_value(value)
        parts.append(f"{short}={text}")
    slug = re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)).strip("-")
    return slug or "base"


def plan_sweep(
    scenario: str,
    *,
    sets: list[str] | None = None,
    grid: dict[str, list[Any]] | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    runs_root: str | Path = "runs",
) -> tuple[Scenario, list[SweepRun]]:
    """The base scenario and every run of the sweep, each validated (``ScenarioError`` naming the run otherwise).

    ``grid``/``seeds`` replace the scenario's ``[sweep]`` grid/seeds when given; its ``variants`` stay."""
    sets = list(sets or [])
    base = load_scenario(scenario, sets)
    spec = base.sweep
    grid = dict(spec.grid) if grid is None else grid
    seeds = spec.seeds if seeds is None else seeds
    if seeds < 1:
        raise ScenarioError(f"--seeds must be >= 1, got {seeds}")
    for key, values in grid.items():
        if not values:
            raise ScenarioError(f"sweep grid key {key!r} has no values")
    variants = [dict(v) for v in spec.variants] or [{}]
    labels = [str(v.pop("label", "")) or _slug(v) for v in variants]
    if len(set(labels)) != len(labels):
        raise ScenarioError(f"sweep.variants need distinct labels, got {labels}")
    root = Path(out) if out else Path(runs_root) / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{base.name}"
    runs = []
    for label, variant in zip(labels, variants, strict=True):
        for combo in itertools.product(*grid.values()):
            setting = dict(zip(grid, combo, strict=True))
            if variant:
                setting = {"variant": label, **setting}
            items = [
                f"{k}={toml_value(v)}" for k, v in {**variant, **dict(zip(grid, combo, strict=True))}.items()
            ]
            for k in range(seeds):
                seed = base.seed + k
                overrides = [*sets, *items, f"seed={seed}"]
                try:
                    load_scenario(scenario, overrides)
                except ScenarioError as exc:
                    raise ScenarioError(f"sweep run {_slug(setting)} seed {seed}: {exc}") from None
                runs.append(SweepRun(setting, seed, overrides, root / _slug(setting) / f"seed{seed}"))
    if len({r.out for r in runs}) != len(runs):
        raise ScenarioError("two runs of this sweep would share a directory: make the grid's values distinct")
    return base, runs


def _finished(run_dir: Path) -> bool:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(summary.get("stopped_by")) or summary.get("rounds_completed") == summary.get("rounds_planned")


def result_of(run_dir: Path, status: str) -> dict[str, Any]:
    """The comparison row of a finished run, from its files."""
    summary = json.loads((run_dir / "summary.json").read_text())
    final, diag = summary.get("final") or {}, summary.get("final_non_private") or {}
    stop = summary.get("stopped_by")
    return {
        "heldout_accuracy": final.get("heldout_accuracy"),
        "train_accuracy": diag.get("train_accuracy"),
        "gap_accuracy": diag.get("gap_accuracy"),
        "epsilon": final.get("epsilon"),
        "rounds": summary.get("rounds_completed"),
        "wall_s": (summary.get("timings") or {}).get("total_s"),
        "status": f"{status}; stopped by {stop}" if stop else status,
        "run_dir": str(run_dir),
        "delta": summary.get("delta"),
        "accountant": summary.get("accountant"),
    }


def execute(scenario: str, overrides: list[str], out: str) -> dict[str, Any]:
    """Run (or resume, or skip) one sweep run; its comparison row. Module-level: Ray tasks call it by reference."""
    from fedsim.engine.runner import resume_run, run_scenario
    from fedsim.report.checkpoint import CheckpointError

    run_dir = Path(out)
    if _finished(run_dir):
        return result_of(run_dir, "skipped: finished before")
    try:
        if (run_dir / "config.toml").is_file():  # started before and killed
            if (run_dir / "checkpoint.npz").is_file():
                try:
                    resume_run(run_dir)
                    return result_of(run_dir, "resumed")
                except CheckpointError:
                    pass
            for n in itertools.count(1):
                aside = run_dir.with_name(f"{run_dir.name}.incomplete-{n}")
                if not aside.exists():
                    run_dir.rename(aside)
                    break
        run_scenario(load_scenario(scenario, overrides), run_dir)
        return result_of(run_dir, "done")
    except Exception as exc:  # one broken run must not cost the sweep the others
        return {"status": f"error: {type(exc).__name__}: {exc}"[:300], "run_dir": str(run_dir)}


def run_sweep(
    scenario: str,
    runs: list[SweepRun],
    *,
    parallel: int = 1,
    on_result: Callable[[SweepRun], None] | None = None,
) -> list[SweepRun]:
    """Run every run (see the module docstring); ``on_result`` as each one ends."""
    scenario = _portable(scenario)
    todo = [r for r in runs if not _finished(r.out)]
    for r in runs:
        if r not in todo:
            r.result = result_of(r.out, "skipped: finished before")
            if on_result:
                on_result(r)
    if parallel <= 1 or len(todo) <= 1:
        for r in todo:
            t0 = time.perf_counter()
            r.result = execute(scenario, r.overrides, str(r.out))
            r.result.setdefault("wall_s", time.perf_counter() - t0)
            if on_result:
                on_result(r)
        return runs
    import ray

    from fedsim.engine.ray_engine import _driver_pythonpath

    owns = not ray.is_initialized()
    if owns:
        import logging
        import warnings

        # as in RayEngine: Ray 2.55's notice of a future GPU-hiding default, on every init
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)

        with _driver_pythonpath():
            ray.init(
                num_cpus=parallel,
                num_gpus=0,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
    try:
        task = ray.remote(num_cpus=1)(execute)
        pending = {
            task.remote(
                scenario, [*r.overrides, "engine.name=local", "engine.round_timeout_s=none"], str(r.out)
            ): r
            for r in todo
        }
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                r = pending.pop(ref)
                try:
                    r.result = ray.get(ref)
                except Exception as exc:  # the task's process died: the run is reported, the others go on
                    r.result = {
                        "status": f"error: {type(exc).__name__}: {str(exc)[:200]}",
                        "run_dir": str(r.out),
                    }
                if on_result:
                    on_result(r)
    finally:
        if owns:
            ray.shutdown()
    return runs


def _portable(scenario: str) -> str:
    """A scenario path as an absolute path (Ray tasks may run elsewhere); a shipped name as it is."""
    path = Path(scenario)
    return str(path.resolve()) if path.suffix == ".toml" or path.exists() else scenario


def table_rows(runs: list[SweepRun]) -> tuple[list[str], list[dict[str, Any]]]:
    keys: list[str] = []
    for r in runs:
        for k in r.setting:
            if k not in keys:
                keys.append(k)
    rows = [{**{k: r.setting.get(k) for k in keys}, "seed": r.seed, **r.result} for r in runs]
    return [*keys, *RESULT_COLUMNS], rows


#: the printed table's headers for the result columns (the CSV keeps the full names)
SHORT_HEADERS = {
    "heldout_accuracy": "held-out acc",
    "train_accuracy": "train acc",
    "gap_accuracy": "gap",
    "wall_s": "wall s",
}


def shown(column: str, value: Any) -> str:
    """A cell of the printed table: 3 decimals (1 for seconds), grid values as written."""
    if column not in RESULT_COLUMNS:  # a setting
        return str(_setting_cell(value))
    if isinstance(value, float) and math.isfinite(value):
        return (
            f"{value:.1f}"
            if column == "wall_s"
            else f"{value:+.3f}"
            if column == "gap_accuracy"
            else f"{value:.3f}"
        )
    return str(_cell(value))


def write_csv(runs: list[SweepRun], path: Path) -> Path:
    columns, rows = table_rows(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        grid = set(columns) - set(RESULT_COLUMNS)
        for row in rows:  # grid values as they are written in --grid (2.0, not 2), results to 6 digits
            w.writerow({k: _setting_cell(row.get(k)) if k in grid else _cell(row.get(k)) for k in columns})
    tmp.replace(path)
    return path


def _setting_cell(value: Any) -> Any:
    return value if isinstance(value, str) else toml_value(value)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else value


def line_key(runs: list[SweepRun], requested: str | None) -> str | None:
    """Which setting key draws one line per value: ``requested``, else ``variant``, else the first key with
    non-numeric values, else none (one line)."""
    keys = list(runs[0].setting) if runs else []
    if requested:
        if requested not in keys:
            raise ScenarioError(
                f"--line {requested!r} is not a key of this sweep; its keys: {', '.join(keys) or 'none'}"
            )
        return requested
    if "variant" in keys:
        return "variant"
    for k in keys:
        if any(not isinstance(r.setting[k], int | float) or isinstance(r.setting[k], bool) for r in runs):
            return k
    return None


def plot_privacy_utility(runs: list[SweepRun], path: Path, *, line: str | None, title: str) -> Path | None:
    """Final held-out accuracy against certified epsilon: one line per value of ``line``, a point per setting
    (mean over seeds, bars: one standard deviation over seeds; faint dots: the seeds)."""
    from fedsim.report.plots import _pyplot, _save

    ok = [r for r in runs if _finite(r.result.get("epsilon")) and _finite(r.result.get("heldout_accuracy"))]
    if not ok:
        return None
    plt = _pyplot()
    groups: dict[Any, dict[tuple, list[SweepRun]]] = {}
    for r in ok:
        point = tuple((k, json.dumps(v)) for k, v in r.setting.items() if k != line)
        groups.setdefault(r.setting.get(line) if line else title, {}).setdefault(point, []).append(r)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    eps_all = []
    for i, (name, points) in enumerate(groups.items()):
        xs, ys, es = [], [], []
        for members in points.values():
            eps = np.array([m.result["epsilon"] for m in members], dtype=float)
            acc = 100 * np.array([m.result["heldout_accuracy"] for m in members], dtype=float)
            ax.scatter(eps, acc, s=10, alpha=0.3, color=f"C{i}")
            xs.append(eps.mean())
            ys.append(acc.mean())
            es.append(acc.std(ddof=1) if acc.size > 1 else 0.0)
            eps_all.extend(eps)
        order = np.argsort(xs)
        for (point, _), x, y in zip(points.items(), xs, ys, strict=True):  # which setting each point is
            text = ", ".join(
                str(json.loads(v)) if len(point) == 1 else f"{k.rsplit('.', 1)[-1]}={json.loads(v)}"
                for k, v in point
            )
            if text:
                ax.annotate(
                    text, (x, y), textcoords="offset points", xytext=(3, 5), fontsize=7, color=f"C{i}"
                )
        label = f"{line} = {name}" if line else str(name)
        ax.errorbar(
            np.array(xs)[order],
            np.array(ys)[order],
            yerr=np.array(es)[order],
            fmt="o-",
            capsize=3,
            color=f"C{i}",
            label=label,
        )
    if eps_all and max(eps_all) > 10 * max(min(eps_all), 1e-12):
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 2, 5, 10, 20 rather than 2x10^0
        ax.xaxis.set_minor_formatter(NullFormatter())
    first = ok[0].result
    ax.set_xlabel(f"certified epsilon at delta = {first.get('delta')} ({first.get('accountant')})")
    ax.set_ylabel("final held-out client-level accuracy (%)")
    seeds = sorted({r.seed for r in ok})
    ax.set_title(f"{title}: privacy-utility, {len(ok)} runs, mean and sd over {len(seeds)} seed(s)")
    ax.grid(True, which="both", alpha=0.3)
    point_keys = sorted({k for r in ok for k in r.setting if k != line})
    legend_title = ("points: " + ", ".join(k.rsplit(".", 1)[-1] for k in point_keys)) if point_keys else None
    ax.legend(fontsize=8, title=legend_title, title_fontsize=8)
    return _save(fig, path)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def default_parallel() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
