"""``fedsim sweep``: run a scenario over a grid of settings and seeds, compare the runs in a table and a plot.

A sweep is the scenario's own ``[sweep]`` table (``grid``, ``variants``, ``seeds``, ``line``), or ``--grid`` and
``--seeds`` on the command line, which replace it. Every combination of the grid's values, crossed with every
variant (a named set of linked values, e.g. a sampling scheme with the cohort that gives the same expected size)
and every seed, is one run with its own run directory ``OUT/<setting>/seed<k>``, exactly what ``fedsim run``
writes. Every run's scenario is built and validated before the first one starts, so a bad value costs nothing.

Runs go to Ray tasks, ``parallel`` at a time (each then trains on the in-process engine: a Ray task cannot hold
a pool of Ray actors of its own without starving the others, and the engine does not change a seeded run's
results beyond float rounding); with ``parallel = 1`` they run one after the other here, on the scenario's engine.

A sweep started again reuses a run directory only when its ``config.toml`` is the run's planned config (the
resolved scenario, compared as parsed TOML; only ``sweep.*`` and the two engine keys a sweep's Ray tasks set,
``engine.name`` and ``engine.round_timeout_s``, are left out: they change neither what a run computes nor what it
releases). Then a finished run is skipped (a run stopped by the privacy budget finished; one stopped by client
failures is reported as failed), and a seeded run that was killed is resumed from its checkpoint, or else moved
aside (``<dir>.incomplete-N``, never deleted) and run again: seeded, it draws the same cohorts and noise, so
nothing new is released, as long as each round computes the same clipped sum again. A round whose clients failed
by the clock (a timeout, a lost worker) may not, and the two runs' releases of that round, with the same noise,
then differ by exactly the clients whose fate differed: seeded runs are simulations whose seed (and so whose
noise) the experimenter holds, so their epsilon is nominal anyway; do not treat the moved-aside directory as
unreleased. A killed run that drew from the operating system's entropy is never run again: the
rounds it released were released. Every existing run directory is checked before the first run starts; a config
that differs, or such a killed run, refuses the whole sweep (:class:`SweepRefused`, naming the directory and the
differing keys), unless ``new_run_dirs``: then each run whose config differs gets a new directory beside the old
one (``seed0.2``, ``seed0.3``, ...; the old one is never changed), and a later sweep with the same settings finds
it there.

The comparison uses a stated statistic, not the final round alone (which swings by tens of points at high noise):
each run's held-out accuracy averaged over its last ``last`` evaluated rounds (``--last``, ``sweep.last``,
default 5; fewer where a run evaluated fewer, counted in ``heldout_rounds_averaged``), and per setting the mean
of those over seeds with a 95% Student t interval (one seed: no interval). ``sweep.csv`` has a row per run (the
last-``last`` mean and the final round's value; the training accuracy and the gap are exact statistics of
training clients, not covered by epsilon: their columns say ``non_private_``), ``sweep_summary.csv`` a row per
setting (mean, interval half-width, n, the certified epsilon's min and max over seeds). A run with
``privacy.noise_multiplier = 0`` is not private: its epsilon is infinite (``inf (not private)``).
``privacy_utility.png`` plots the accuracy against the certified epsilon (against the varied grid key when
epsilon does not separate the settings), one line per value of the ``line`` key, bars the 95% interval over
seeds, and each non-private setting as a horizontal reference line with its interval as a band.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import textwrap
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.privacy import Mechanism
from fedsim.report.rows import PUBLIC_STOPS, summary_stop, summary_timings
from fedsim.report.rundir import flatten_tables
from fedsim.scenarios import Scenario, ScenarioError, load_scenario, parse_override, scenario_to_toml

#: how many evaluated rounds a run's held-out accuracy is averaged over, unless ``--last``/``sweep.last`` say
DEFAULT_LAST = 5
#: a run's held-out accuracy averaged over its last k evaluated rounds (the statistic the sweep compares)
MEAN = "heldout_accuracy_mean"
#: the confidence of the interval over seeds
CONFIDENCE = 0.95

#: the columns of the comparison table after the grid's own
RESULT_COLUMNS = (
    "seed",
    MEAN,
    "heldout_accuracy_final",
    "heldout_rounds_averaged",
    "non_private_train_accuracy",  # exact statistics of training clients (final round): epsilon does not cover them
    "non_private_gap_accuracy",
    "epsilon",  # after the final round; infinite for a run without noise (private = false)
    "private",
    "rounds",
    "non_private_wall_s",  # timings grow with the realised cohort
    "status",
    "run_dir",
    # a run that replaced a directory of other settings (new_run_dirs) on the same clients: that directory's
    # released rounds, which this run's epsilon does not compose with (SweepRun.uncomposed)
    "uncomposed_releases",
)


@dataclass
class SweepRun:
    """One run of a sweep: its setting (grid key -> value, plus ``variant``), seed, ``--set`` items and directory."""

    setting: dict[str, Any]
    seed: int
    overrides: list[str]
    out: Path
    result: dict[str, Any] = field(default_factory=dict)
    #: what :func:`prepare_runs` found in ``out``: ``new``, ``finished``, ``failed`` (stopped by failures) or
    #: ``partial`` (seeded, killed: resumed or run again); None before it looked
    state: str | None = None
    #: the run directory ``out`` replaced because its config differs (``new_run_dirs``), else None
    replaced: Path | None = None
    #: what :attr:`replaced` released about the same clients (same data settings and seed) that this run's epsilon
    #: does not compose with: ``"<dir>: N rounds"``; None when it released nothing or trained other clients
    uncomposed: str | None = None
    #: what its config says about the population it protects: ``sampling``, ``population``, ``cohort`` (expected
    #: clients a round), ``noise_multiplier``, ``clip`` (:func:`add_statistics`)
    facts: dict[str, Any] = field(default_factory=dict)


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


class SweepRefused(ScenarioError):
    """An existing run directory cannot be reused for its planned run; nothing was run or changed."""


#: config keys a reused run may differ in: what the sweep runs (``sweep.*``), and the engine a sweep's Ray tasks
#: put every run on (``engine.name = "local"``, no round timeout, which only the Ray engine reads). A seeded run
#: gives the same rows on either engine (tested), and neither changes what a run releases or certifies.
IGNORED_KEYS = ("sweep", "engine.name", "engine.round_timeout_s")


def planned_config(scenario: str, overrides: list[str]) -> dict[str, Any]:
    """The ``config.toml`` a run of ``overrides`` writes, parsed: the resolved scenario."""
    return tomllib.loads(scenario_to_toml(load_scenario(scenario, overrides)))


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in IGNORED_KEYS)


def config_differences(existing: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    """``["privacy.noise_multiplier: 1.0 in the run, 0.5 planned", ...]``: every dotted key (but
    :data:`IGNORED_KEYS`) whose value differs, or that only one of the two has; empty when they are the same."""
    run, plan = flatten_tables(existing), flatten_tables(planned)

    def same(a: Any, b: Any) -> bool:  # 1 and 1.0, or true and 1, are different values here
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)

    def text(d: dict[str, Any], k: str) -> str:
        return toml_value(d[k]) if k in d else "absent"

    keys = sorted(k for k in {*run, *plan} if not _ignored(k))
    if plan.get("privacy.target_epsilon") is not None:  # the noise multiplier is calibrated from the target
        keys = [k for k in keys if k != "privacy.noise_multiplier"]
    return [
        f"{k}: {text(run, k)} in the run, {text(plan, k)} planned"
        for k in keys
        if k not in run or k not in plan or not same(run[k], plan[k])
    ]


def _summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _ended(summary: dict[str, Any] | None) -> bool:
    """The run came to its end: every planned round, or a stop (budget or failures). A run that raised also
    writes ``summary.json``, with fewer rounds and no stop: it did not end."""
    if not summary:
        return False
    stop = summary_stop(summary)
    done = stop["rounds_completed"]
    return bool(stop["stopped_by"]) or (isinstance(done, int) and done == summary.get("rounds_planned"))


def _finished(run_dir: Path) -> bool:
    return _ended(_summary(run_dir))


def stopped_by_failures(summary: dict[str, Any] | None) -> bool:
    """A stop that is not a finish: anything but the privacy budget (``failures``: too many clients failed)."""
    return bool(summary) and summary_stop(summary)["stopped_by"] not in (None, *PUBLIC_STOPS)


def examine(run_dir: Path, planned: dict[str, Any]) -> tuple[str, str]:
    """What ``run_dir`` holds for a run planned as ``planned``: ``(state, why)``, state one of

    ``new`` (nothing there, or a run that stopped before writing its config: it can start there),
    ``finished``, ``failed`` (it ended stopped by failures), ``partial`` (seeded and killed: it can be resumed or
    run again with the same noise), ``differs`` (its config is not the planned one; ``why`` lists the keys),
    ``entropy`` (killed, and it drew from the operating system: never run again), ``blocked`` (not usable)."""
    if not run_dir.exists():
        return "new", ""
    if not run_dir.is_dir():
        return "blocked", f"{run_dir} is a file, not a run directory"
    config = run_dir / "config.toml"
    if not config.is_file():
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and metrics.stat().st_size > 0:
            return (
                "blocked",
                f"{run_dir} holds rows (metrics.jsonl) but no config.toml: what ran there is unknown",
            )
        return "new", ""
    try:
        existing = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return "blocked", f"{config} cannot be read ({exc}): what ran there is unknown"
    diffs = config_differences(existing, planned)
    if diffs:
        return "differs", "; ".join(diffs)
    summary = _summary(run_dir)
    if _ended(summary):
        return ("failed" if stopped_by_failures(summary) else "finished"), ""
    randomness = (existing.get("privacy") or {}).get("randomness", "seeded")
    if randomness != "seeded":
        return "entropy", (
            f"{run_dir} is a run that was killed (or raised) after drawing its cohorts and noise from the "
            f"operating system (privacy.randomness = {randomness!r}): the rounds it released were released, and "
            "running it again would release the same clients anew under noise that cannot be drawn again; it is "
            "kept as it is (read it with `fedsim report`), and a sweep never runs it again: move it out of the "
            "sweep yourself to run this setting afresh"
        )
    return "partial", ""


def _siblings(run_dir: Path) -> list[Path]:
    """``seed0.2``, ``seed0.3``, ... beside ``seed0``: the new run directories of earlier ``new_run_dirs`` sweeps."""
    if not run_dir.parent.is_dir():
        return []
    pattern = re.compile(re.escape(run_dir.name) + r"\.(\d+)")
    found = [(int(m.group(1)), p) for p in run_dir.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def _blocking_ancestor(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is not a directory (then nothing can be written there)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


#: the keys that decide which clients a run trains and on what data: a replaced run with the same ones released
#: rounds about the same clients
SAME_CLIENTS_KEYS = ("seed", "data.")


def uncomposed_releases(old_dir: Path, planned: dict[str, Any]) -> str | None:
    """``"<old_dir>: N rounds released ..."`` when ``old_dir`` (a run of other settings that a ``new_run_dirs`` run
    replaces) released ``N >= 1`` rounds about the same clients as the planned run (the same seed and data
    settings, :data:`SAME_CLIENTS_KEYS`): those releases are not composed with the new run's epsilon, which
    accounts its own rounds only. None when it released nothing or its clients differ."""
    try:  # one row per released round, flushed as each round ends (a killed run's too)
        existing = tomllib.loads((old_dir / "config.toml").read_text(encoding="utf-8"))
        metrics = (old_dir / "metrics.jsonl").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    rounds = sum(1 for line in metrics.splitlines() if line.strip())
    if rounds < 1:
        return None
    run, plan = flatten_tables(existing), flatten_tables(planned)

    def clients(d: dict[str, Any]) -> dict[str, str]:
        return {
            k: json.dumps(v, sort_keys=True, default=str)
            for k, v in d.items()
            if k.startswith(SAME_CLIENTS_KEYS)
        }

    if clients(run) != clients(plan):
        return None
    return (
        f"{old_dir}: {rounds} round{'s' if rounds != 1 else ''} released on the same clients (same seed and data), "
        "not composed with this run's epsilon"
    )


def prepare_runs(scenario: str, runs: list[SweepRun], *, new_run_dirs: bool = False) -> list[SweepRun]:
    """Decide, before anything runs, where each run goes and what becomes of what is already there.

    Each run looks at its directory and at the new ones earlier ``new_run_dirs`` sweeps put beside it; the first
    whose config is the planned one is reused (skipped, reported as failed, resumed or run again, as
    :func:`examine` says). When none is and the directory holds another config: ``new_run_dirs`` gives the run
    the next free ``<dir>.N``; otherwise :class:`SweepRefused`. A killed run that drew from the operating system
    refuses the sweep whatever the flag. Every problem of every run is in the one message; nothing is changed."""
    problems: list[str] = []
    blocked: set[Path] = set()
    for r in runs:
        ancestor = _blocking_ancestor(r.out)
        if ancestor is not None:
            if ancestor not in blocked:
                blocked.add(ancestor)
                problems.append(
                    f"{ancestor} is a file, not a directory: no run directory can be written under it"
                )
            continue
        planned = planned_config(scenario, r.overrides)
        state, why = examine(r.out, planned)
        if state not in ("differs", "blocked"):
            found = (r.out, state, why)
        else:
            others = [(p, *examine(p, planned)) for p in _siblings(r.out)]
            found = next((o for o in others if o[1] not in ("differs", "blocked")), None)
            if found is None:
                if not new_run_dirs:  # a differing config is named with its directory; a blocked one names it
                    problems.extend(
                        f"{p}: {w}" if st == "differs" else w for p, st, w in [(r.out, state, why), *others]
                    )
                    continue
                taken = [int(p.name.rsplit(".", 1)[1]) for p, *_ in others]
                fresh = r.out.with_name(f"{r.out.name}.{max([1, *taken]) + 1}")
                found = (fresh, "new", "")
                r.replaced = r.out
                r.uncomposed = uncomposed_releases(r.out, planned)
        r.out, r.state, why = found
        if r.state == "entropy":
            problems.append(why)
    if problems:
        raise SweepRefused(
            "existing run directories of this sweep cannot be reused for its planned runs; nothing was run or "
            "changed:\n  "
            + "\n  ".join(problems)
            + "\nA run directory is reused only when its config.toml is the run's planned config. Give another "
            "--out, or --new-run-dirs to start each run whose config differs in a new directory beside the old "
            "one (a killed run that drew from the operating system is never run again)."
        )
    return runs


def run_failed(result: dict[str, Any]) -> bool:
    """The row of a run that did not finish: it raised (``error``), or it was stopped by failures, refused or
    lost with its Ray task (``failed``)."""
    return str(result.get("status", "")).startswith(("error", "failed"))


def result_of(run_dir: Path, status: str) -> dict[str, Any]:
    """The comparison row of a finished run, from its files."""
    summary = json.loads((run_dir / "summary.json").read_text())
    final, diag = summary.get("final") or {}, summary.get("final_non_private") or {}
    stopped = summary_stop(summary)
    stop, rounds = stopped["stopped_by"], stopped["rounds_completed"]
    if stopped_by_failures(summary):  # an exact fact about clients, as fedsim run's failures line
        at = f" at round {rounds + 1}" if isinstance(rounds, int) else ""
        status = f"failed: stopped by {stop}{at}, not released (non-private; {status})"
    elif stop:
        status = f"{status}; stopped by {stop}"
    private = summary.get("private")
    epsilon = final.get("epsilon")
    if private is False or (epsilon is None and final.get("epsilon_reason") == "infinite"):
        epsilon = math.inf  # no noise (private = false), or no finite epsilon at this delta
    return {
        "heldout_accuracy_final": final.get("heldout_accuracy"),
        "non_private_train_accuracy": diag.get("train_accuracy"),
        "non_private_gap_accuracy": diag.get("gap_accuracy"),
        "epsilon": epsilon,
        "private": private if isinstance(private, bool) else None,
        "rounds": rounds,
        "non_private_wall_s": summary_timings(summary).get("total_s"),
        "status": status,
        "run_dir": str(run_dir),
        "delta": summary.get("delta"),
        "accountant": summary.get("accountant"),
    }


def execute(scenario: str, overrides: list[str], out: str) -> dict[str, Any]:
    """Run (or resume, or skip) one sweep run; its comparison row. Module-level: Ray tasks call it by reference.

    It looks again at ``out`` (:func:`examine`), so that called on its own it never reports or runs again a
    directory whose config is not the planned one, nor runs again a killed run that drew from the operating
    system: those are refused (``failed: refused: ...``) with the directory as it was."""
    from fedsim.engine.runner import resume_run, run_scenario
    from fedsim.report.checkpoint import CheckpointError

    run_dir = Path(out)
    try:
        state, why = examine(run_dir, planned_config(scenario, overrides))
        if state in ("differs", "blocked", "entropy"):
            return {"status": f"failed: refused, nothing changed: {why}"[:300], "run_dir": str(run_dir)}
        if state in ("finished", "failed"):
            return result_of(run_dir, "skipped: finished before")
        if state == "partial":  # seeded, the planned config, killed: the same cohorts and noise again
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


def remote_execute() -> Any:
    """:func:`execute` as a Ray remote function. ``max_retries=0``: a task whose process died is reported as
    failed, never run again behind the sweep's back (a retry would start the run again in its directory)."""
    import ray

    return ray.remote(num_cpus=1, max_retries=0)(execute)


def lost_task(run: SweepRun, exc: BaseException) -> dict[str, Any]:
    """The row of a run whose Ray task died (or could not be fetched): failed, the others go on."""
    return {
        "status": f"failed: its Ray task died: {type(exc).__name__}: {str(exc)[:200]}",
        "run_dir": str(run.out),
    }


def run_sweep(
    scenario: str,
    runs: list[SweepRun],
    *,
    parallel: int = 1,
    on_result: Callable[[SweepRun], None] | None = None,
    new_run_dirs: bool = False,
) -> list[SweepRun]:
    """Run every run (see the module docstring); ``on_result`` as each one ends. Runs not yet looked at by
    :func:`prepare_runs` are first (:class:`SweepRefused` before anything runs)."""
    scenario = _portable(scenario)
    if any(r.state is None for r in runs):
        prepare_runs(scenario, [r for r in runs if r.state is None], new_run_dirs=new_run_dirs)
    todo = [r for r in runs if r.state not in ("finished", "failed")]
    for r in runs:
        if r not in todo:
            r.result = result_of(r.out, "skipped: finished before")
            if on_result:
                on_result(r)
    if parallel <= 1 or len(todo) <= 1:
        for r in todo:
            t0 = time.perf_counter()
            r.result = execute(scenario, r.overrides, str(r.out))
            if r.result.get("non_private_wall_s") is None:
                r.result["non_private_wall_s"] = time.perf_counter() - t0
            if on_result:
                on_result(r)
        return runs
    import ray

    from fedsim.engine.ray_engine import init_ray

    owns = init_ray(num_cpus=parallel, num_gpus=0)  # as the Ray engine starts it; False: Ray ran already
    try:
        task = remote_execute()
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
                    r.result = lost_task(r, exc)
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


def statistic(last: int) -> str:
    """The statistic the sweep compares, in words: ``mean of last 5 evaluated rounds``."""
    return f"mean of last {last} evaluated round{'s' if last != 1 else ''}"


def last_k_mean(values: list[float], k: int) -> tuple[float | None, int]:
    """The mean of the last ``k`` of ``values`` (a run's held-out accuracies, round order) and how many it
    averaged (fewer than ``k`` when there are fewer); ``(None, 0)`` for none."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    tail = [float(v) for v in values[-k:]]
    return (float(np.mean(tail)), len(tail)) if tail else (None, 0)


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float | None, float | None, int]:
    """``(mean, half-width, n)`` of ``values`` (one per seed): the Student t interval
    ``mean +- t_{(1+confidence)/2, n-1} * sd / sqrt(n)`` (sd with n-1); half-width None for n = 1 (no interval)."""
    from scipy.stats import t

    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0:
        return None, None, 0
    if x.size == 1:
        return float(x[0]), None, 1
    half = t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(half), int(x.size)


def interval_text(n: int, confidence: float = CONFIDENCE) -> str:
    return (
        "n=1, no interval" if n == 1 else f"{confidence:.0%} Student t interval over {n} seeds" if n else ""
    )


def _run_facts(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """What a run's ``config.toml`` (and ``summary.json``) say about whom it protects and how."""
    try:
        config = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    privacy, data = config.get("privacy") or {}, config.get("data") or {}
    gen = (summary.get("final") or {}).get("generalization") or {}
    population = gen.get("population")
    if not isinstance(population, int):  # the training clients: the held-out ones never train
        num, frac = data.get("num_clients"), data.get("heldout_fraction") or 0.0
        population = num - round(num * frac) if isinstance(num, int) else None
    sampling, per_round, rate = (
        privacy.get("sampling"),
        privacy.get("clients_per_round"),
        privacy.get("sampling_rate"),
    )
    cohort = per_round if isinstance(per_round, int) else None
    if isinstance(population, int) and population > 0:
        try:  # the scheme's own expected cohort (fedsim.round.sampling)
            cohort = Mechanism(
                population=population,
                sampling=sampling,
                sampling_rate=rate,
                clients_per_round=per_round,
                min_separation=privacy.get("min_separation"),
                max_participations=privacy.get("max_participations"),
            ).expected_cohort
        except ValueError:  # refused by the schema anyway; the note then shows what was given
            pass
    return {
        "sampling": sampling,
        "population": population,
        "cohort": cohort,
        "noise_multiplier": privacy.get("noise_multiplier"),
        "clip": privacy.get("clip"),
    }


def add_statistics(runs: list[SweepRun], last: int = DEFAULT_LAST) -> list[SweepRun]:
    """Add to each run's result its held-out accuracy averaged over its last ``last`` evaluated rounds (the rows
    of its ``metrics.jsonl`` that have ``heldout_accuracy``) and how many it averaged, and read its config's
    :attr:`SweepRun.facts`. Runs without results of their own (refused, raised, lost) are left as they are."""
    from fedsim.report.rundir import read_rows

    for r in runs:
        if "heldout_accuracy_final" not in r.result:  # refused, raised or lost: its directory is not its run
            continue
        run_dir = Path(r.result.get("run_dir") or r.out)
        try:
            rows = read_rows(run_dir)
        except (OSError, ValueError):
            rows = []
        values = [row["heldout_accuracy"] for row in rows if _finite(row.get("heldout_accuracy"))]
        r.result[MEAN], r.result["heldout_rounds_averaged"] = last_k_mean(values, last)
        r.facts = _run_facts(run_dir, _summary(run_dir) or {})
    return runs


@dataclass
class SettingSummary:
    """One setting of a sweep over its seeds: the mean of the runs' last-k held-out means, its interval, epsilon."""

    setting: dict[str, Any]
    runs: list[SweepRun]
    #: the finished runs with a held-out mean: what the statistics are over
    used: list[SweepRun]
    mean: float | None
    half: float | None
    final_mean: float | None
    eps_min: float | None
    eps_max: float | None
    private: bool | None
    facts: dict[str, Any]

    @property
    def n(self) -> int:
        return len(self.used)

    @property
    def failed(self) -> int:
        return sum(run_failed(r.result) for r in self.runs)


def summarise_settings(runs: list[SweepRun]) -> list[SettingSummary]:
    """One :class:`SettingSummary` per setting, in the sweep's order (after :func:`add_statistics`)."""
    groups: dict[str, list[SweepRun]] = {}
    for r in runs:
        groups.setdefault(_slug(r.setting), []).append(r)
    out = []
    for members in groups.values():
        used = [r for r in members if not run_failed(r.result) and _finite(r.result.get(MEAN))]
        mean, half, _ = t_interval([r.result[MEAN] for r in used])
        finals = [
            r.result["heldout_accuracy_final"]
            for r in used
            if _finite(r.result.get("heldout_accuracy_final"))
        ]
        eps = [float(r.result["epsilon"]) for r in used if isinstance(r.result.get("epsilon"), int | float)]
        out.append(
            SettingSummary(
                setting=dict(members[0].setting),
                runs=members,
                used=used,
                mean=mean,
                half=half,
                final_mean=float(np.mean(finals)) if finals else None,
                eps_min=min(eps) if eps else None,
                eps_max=max(eps) if eps else None,
                private=False
                if any(r.result.get("private") is False for r in used)
                else (True if used else None),
                facts=next((r.facts for r in used if r.facts), {}),
            )
        )
    return out


def _setting_keys(runs: list[SweepRun]) -> list[str]:
    keys: list[str] = []
    for r in runs:
        for k in r.setting:
            if k not in keys:
                keys.append(k)
    return keys


def table_rows(runs: list[SweepRun]) -> tuple[list[str], list[dict[str, Any]]]:
    keys = _setting_keys(runs)
    rows = [
        {
            **{k: r.setting.get(k) for k in keys},
            "seed": r.seed,
            **r.result,
            "uncomposed_releases": r.uncomposed,
        }
        for r in runs
    ]
    return [*keys, *RESULT_COLUMNS], rows


def csv_headers(last: int) -> dict[str, str]:
    """``sweep.csv``'s header for a result column whose name alone would not say which statistic it holds."""
    return {
        MEAN: f"heldout_accuracy ({statistic(last)})",
        "heldout_accuracy_final": "heldout_accuracy (final round)",
    }


#: the printed table's headers for the result columns (the CSV keeps the full names)
SHORT_HEADERS = {
    "heldout_accuracy_final": "held-out acc\nfinal round",
    "heldout_rounds_averaged": "rounds\naveraged",
    "non_private_train_accuracy": "train acc\n(non-private)",
    "non_private_gap_accuracy": "gap\n(non-private)",
    "non_private_wall_s": "wall s\n(non-private)",
    "uncomposed_releases": "earlier releases\nnot composed",
}


def short_header(column: str, last: int) -> str:
    if column == MEAN:
        return f"held-out acc\nmean last {last}"
    return SHORT_HEADERS.get(column, column.rsplit(".", 1)[-1])


def shown(column: str, value: Any, row: dict[str, Any] | None = None) -> str:
    """A cell of the printed table: 3 decimals (1 for seconds), grid values as written; an infinite epsilon says
    why (``inf (not private)`` for a run without noise)."""
    if column not in RESULT_COLUMNS:  # a setting
        return str(_setting_cell(value))
    if column == "epsilon" and isinstance(value, float) and math.isinf(value):
        return "inf (not private)" if (row or {}).get("private") is False else "inf (no finite epsilon)"
    if isinstance(value, float) and math.isfinite(value):
        return (
            f"{value:.1f}"
            if column == "non_private_wall_s"
            else f"{value:+.3f}"
            if column == "non_private_gap_accuracy"
            else f"{value:.3f}"
        )
    return str(_cell(value))


def _write(path: Path, columns: list[str], headers: dict[str, str], rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([headers.get(c, c) for c in columns])
        for row in rows:
            w.writerow([row.get(c, "") for c in columns])
    tmp.replace(path)
    return path


def write_csv(runs: list[SweepRun], path: Path, *, last: int = DEFAULT_LAST) -> Path:
    """``sweep.csv``: a row per run, the grid's values as written in ``--grid`` (2.0, not 2), results to 6
    digits, the held-out accuracy both as the last-``last`` mean and the final round's (:func:`add_statistics`
    first, or the mean is blank)."""
    columns, rows = table_rows(runs)
    grid = set(columns) - set(RESULT_COLUMNS)
    cells = [
        {k: _setting_cell(row.get(k)) if k in grid else _cell(row.get(k)) for k in columns} for row in rows
    ]
    return _write(path, columns, csv_headers(last), cells)


def summary_columns(last: int) -> list[str]:
    return [
        "runs",
        "failed",
        f"heldout_accuracy ({statistic(last)}; mean over seeds)",
        f"ci{CONFIDENCE * 100:.0f}_halfwidth (Student t over seeds)",
        "interval",
        "heldout_accuracy_final (mean over seeds)",
        "epsilon_min",
        "epsilon_max",
        "private",
        "sampling",
        "population",
        "expected_cohort",
    ]


def summary_rows(
    runs: list[SweepRun], last: int = DEFAULT_LAST
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """``(grid keys, result columns, rows)`` of ``sweep_summary.csv``: a row per setting."""
    keys, cols = _setting_keys(runs), summary_columns(last)
    rows = []
    for s in summarise_settings(runs):
        values = [
            s.n,
            s.failed,
            s.mean,
            s.half,
            interval_text(s.n),
            s.final_mean,
            s.eps_min,
            s.eps_max,
            s.private,
            s.facts.get("sampling"),
            s.facts.get("population"),
            s.facts.get("cohort"),
        ]
        rows.append({**{k: s.setting.get(k) for k in keys}, **dict(zip(cols, values, strict=True))})
    return keys, cols, rows


def write_summary_csv(runs: list[SweepRun], path: Path, *, last: int = DEFAULT_LAST) -> Path:
    """``sweep_summary.csv``: per setting, n (finished runs), the mean over seeds of the runs' last-``last``
    held-out means, the 95% Student t half-width (blank for n = 1), the certified epsilon's min and max over the
    seeds (``inf`` for a setting without noise), and the population and cohort its sampling protects."""
    keys, cols, rows = summary_rows(runs, last)
    cells = [{**{k: _setting_cell(row[k]) for k in keys}, **{c: _cell(row[c]) for c in cols}} for row in rows]
    return _write(path, [*keys, *cols], {}, cells)


def _setting_cell(value: Any) -> Any:
    return value if isinstance(value, str) else inline_toml(value)


def inline_toml(value: Any) -> str:
    """A grid value as a one-line TOML literal (``[32, 32]``, ``{a = 1}``), as ``--grid`` takes it back."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(inline_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {inline_toml(v)}" for k, v in value.items()) + "}"
    return toml_value(value)


def _cell(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if value == math.inf else "" if not math.isfinite(value) else f"{value:.6g}"
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


#: short names of grid keys in point labels
ABBREVIATIONS = {"privacy.noise_multiplier": "z", "privacy.sampling_rate": "q", "privacy.clip": "clip"}


def _short(key: str) -> str:
    return ABBREVIATIONS.get(key, key.rsplit(".", 1)[-1])


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else inline_toml(value)


def _baseline_label(s: SettingSummary) -> str:
    clip = s.facts.get("clip")
    what = (
        "non-private (clip = 0: plain FedAvg)"
        if clip == 0 and s.facts.get("noise_multiplier") == 0
        else "non-private (noise_multiplier = 0)"
    )
    return what


def _sampling_notes(settings: list[SettingSummary]) -> list[str]:
    """Where the settings sample clients differently: each sampling's population and expected cohort, and what
    ``all`` means (every client every round: no amplification, its own population)."""
    seen: dict[tuple, None] = {}
    for s in settings:
        f = s.facts
        if f.get("sampling"):
            seen.setdefault((f["sampling"], f.get("population"), f.get("cohort")), None)
    if len({k[0] for k in seen}) < 2:
        return []

    def num(v: Any) -> str:
        return f"{v:g}" if isinstance(v, int | float) else "?"

    notes = [
        f"sampling {name}: population {num(pop)}, expected cohort {num(cohort)}" for name, pop, cohort in seen
    ]
    everyone = [repr(name) for name, pop, cohort in seen if isinstance(pop, int) and cohort == pop]
    if everyone:
        notes.append(
            f"{', '.join(everyone)} trains every client each round: its population and cohort differ from the other "
            "samplings' (no amplification by sampling)"
        )
    return notes


def _drawn_points(ax: Any, step: float = 3.0) -> np.ndarray:
    """Display coordinates, every ``step`` pixels, of everything drawn as lines on ``ax`` (the curves, error bars
    and caps, reference lines) and its markers: what a point label must not cover."""
    paths = []
    for artist in [*ax.lines, *ax.collections]:
        if hasattr(artist, "get_segments"):  # error bars
            paths += [ax.transData.transform(np.asarray(seg)) for seg in artist.get_segments() if len(seg)]
        elif hasattr(artist, "get_xydata"):
            paths.append(artist.get_transform().transform(np.asarray(artist.get_xydata(), dtype=float)))
        elif hasattr(artist, "get_offsets"):  # scatter dots
            paths += [
                ax.transData.transform(np.asarray(artist.get_offsets()))[i : i + 1]
                for i in range(len(artist.get_offsets()))
            ]
    pts = []
    for path in paths:
        path = path[np.all(np.isfinite(path), axis=1)]
        pts.append(path)
        for p, q in itertools.pairwise(path):
            n = int(np.hypot(*(q - p)) // step)
            if n > 1:
                pts.append(p + np.linspace(0, 1, n)[:, None] * (q - p))
    return np.concatenate(pts) if pts else np.empty((0, 2))


def _place_labels(fig: Any, ax: Any, labels: list[tuple[float, float, str, str]]) -> None:
    """Annotate each point ``(x, y, text, color)`` at the first of a ring of offsets where the text covers no
    label placed before, nothing drawn (:func:`_drawn_points`) and stays inside the axes; where none is free, the
    one that covers the least, with a thin leader line."""
    if not labels:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    drawn = _drawn_points(ax)
    taken: list[Any] = []
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (0, 9), (0, -17), (9, -3), (-9, -3)]
    offsets += [(dx * 2, dy * 2) for dx, dy in offsets] + [(dx * 3, dy * 3) for dx, dy in offsets]
    style = {"fontsize": 7, "bbox": {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7}}
    for x, y, text, color in labels:
        best: tuple[float, Any, Any] | None = None
        for i, (dx, dy) in enumerate(offsets):
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            ann = ax.annotate(
                text, (x, y), textcoords="offset points", xytext=(dx, dy), color=color, ha=ha, **style
            )
            box = ann.get_window_extent(renderer).padded(1.0)
            inside = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
            covered = int(
                np.count_nonzero(
                    (drawn[:, 0] >= box.x0)
                    & (drawn[:, 0] <= box.x1)
                    & (drawn[:, 1] >= box.y0)
                    & (drawn[:, 1] <= box.y1)
                )
            )
            cost = covered + 1000 * sum(box.overlaps(t) for t in taken) + (0 if inside else 10_000) + i * 0.01
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost < 1:  # nothing covered: the nearest free place
                break
        assert best is not None
        cost, ann, box = best
        if math.hypot(*ann.xyann) > 14:  # away from its point: a leader line says whose label it is
            ann.remove()
            ann = ax.annotate(
                text,
                (x, y),
                textcoords="offset points",
                xytext=ann.xyann,
                color=color,
                ha=ann.get_ha(),
                arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5, "alpha": 0.6},
                **style,
            )
        taken.append(box)


def privacy_utility_figure(
    runs: list[SweepRun], *, line: str | None, title: str, last: int = DEFAULT_LAST
) -> Any:
    """The privacy-utility figure (a matplotlib Figure, or None when no run has a held-out accuracy).

    y: per setting, the mean over seeds of each run's held-out accuracy averaged over its last ``last`` evaluated
    rounds; bars: the 95% Student t interval over seeds; faint dots: the seeds. x: the certified epsilon after the
    final round, one line per value of ``line``; when two settings of one line share their epsilon (a sweep at
    constant epsilon), x is the varied grid key instead and the title says so. A setting without noise
    (``noise_multiplier = 0``, not private) is a horizontal dashed line, its interval a band. Where the settings
    sample differently, the legend gives each sampling's population and cohort. Call :func:`add_statistics`
    first."""
    from fedsim.report.plots import pyplot

    settings = [s for s in summarise_settings(runs) if s.n and s.mean is not None]
    private = [s for s in settings if s.private is not False and _finite(s.eps_max)]
    baseline = [s for s in settings if s.private is False]
    if not private and not baseline:
        return None
    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(7.2, 4.6))

    def line_of(s: SettingSummary) -> str | None:  # the line's value as written (a list or a table too)
        return _value_text(s.setting.get(line)) if line else None

    groups: dict[str | None, list[SettingSummary]] = {}
    for s in private:
        groups.setdefault(line_of(s), []).append(s)
    colors = {name: f"C{i}" for i, name in enumerate(groups)}
    for b in baseline:  # a baseline on a line takes its colour; without lines, a neutral one
        name = line_of(b)
        if line:
            colors.setdefault(name, f"C{len(colors)}")
    point_keys = [k for k in _setting_keys(runs) if k != line]
    varied = [k for k in point_keys if len({json.dumps(s.setting.get(k)) for s in private}) > 1]

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)

    collapsed = any(
        close(a.eps_max, b.eps_max)
        for members in groups.values()
        for a, b in itertools.combinations(members, 2)
    )
    numeric_key = (
        varied[0]
        if len(varied) == 1
        and all(
            isinstance(s.setting.get(varied[0]), int | float)
            and not isinstance(s.setting.get(varied[0]), bool)
            for s in private
        )
        else None
    )
    categories: list[str] = []

    def point_text(s: SettingSummary) -> str:
        return ", ".join(f"{_short(k)}={_value_text(s.setting.get(k))}" for k in varied)

    def x_of(s: SettingSummary) -> float:
        if not collapsed:
            return float(s.eps_max)
        if numeric_key:
            return float(s.setting[numeric_key])
        text = point_text(s) or _slug(s.setting)
        if text not in categories:
            categories.append(text)
        return float(categories.index(text))

    labels: list[tuple[float, float, str, str]] = []
    eps_all = sorted({s.eps_max for s in private})
    for name, members in groups.items():
        members = sorted(members, key=x_of)
        xs = np.array([x_of(s) for s in members])
        ys = np.array([100 * s.mean for s in members])
        err = np.array([100 * (s.half or 0.0) for s in members])
        color = colors[name]
        for s, x in zip(members, xs, strict=True):
            seeds = [100 * r.result[MEAN] for r in s.used]
            ax.scatter([x] * len(seeds), seeds, s=14, alpha=0.45, color=color, linewidths=0, zorder=2)
            if not collapsed and varied:
                labels.append((x, 100 * s.mean, point_text(s), color))
        label = f"{line} = {name}" if line else "DP-FedAvg (private)"
        if collapsed and len(eps_all) > 1:  # the lines differ in epsilon: each says its own
            eps = sorted({s.eps_max for s in members})
            label += f", epsilon {eps[0]:.3g}" + (f"-{eps[-1]:.3g}" if len(eps) > 1 else "")
        ax.errorbar(
            xs, ys, yerr=err if err.any() else None, fmt="o-", capsize=3, color=color, label=label, zorder=3
        )
    for b in baseline:
        name = line_of(b)
        color = colors[name] if line else "0.2"
        y = 100 * b.mean
        spread = f"mean of {b.n} seeds, band: 95% t interval" if b.half is not None else "n=1, no interval"
        label = _baseline_label(b) + (f", {line} = {name}" if line else "")
        twins = [o for o in baseline if line_of(o) == name]
        if len(twins) > 1:  # several baselines on one line: say which settings each is
            label += ", " + ", ".join(
                f"{_short(k)}={_value_text(b.setting[k])}" for k in b.setting if k != line
            )
        ax.axhline(y, ls="--", lw=1.4, color=color, label=f"{label}\n({spread})", zorder=2)
        if b.half is not None:
            ax.axhspan(y - 100 * b.half, y + 100 * b.half, color=color, alpha=0.12, lw=0, zorder=1)
    if not collapsed and len(eps_all) > 1 and eps_all[-1] > 10 * max(eps_all[0], 1e-12):
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 2, 5, 10, 20 rather than 2x10^0
        ax.xaxis.set_minor_formatter(NullFormatter())
    first = (private or baseline)[0].used[0].result
    if collapsed:
        if numeric_key:
            ax.set_xlabel(numeric_key)
        else:
            ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right", fontsize=8)
            ax.set_xlabel("setting")
    elif private:
        ax.set_xlabel(
            f"certified epsilon after the final round, delta = {first.get('delta')} ({first.get('accountant')})"
        )
    else:  # only non-private settings: no epsilon to put anywhere
        ax.set_xticks([])
        ax.set_xlabel("no private setting: epsilon is infinite for every run")
    ax.set_ylabel(f"held-out client-level accuracy (%)\n{statistic(last)}")
    n_seeds = sorted({s.n for s in settings})
    seeds = f"{n_seeds[0]}" if len(n_seeds) == 1 else f"{n_seeds[0]}-{n_seeds[-1]}"
    text = (
        f"{title}: privacy-utility, {len(settings)} setting{'s' if len(settings) != 1 else ''} x {seeds} "
        f"seed{'s' if n_seeds[-1] != 1 else ''}"
    )
    if collapsed:
        against = numeric_key or "the setting"
        text += (
            f"; epsilon is the same ({eps_all[0]:.3g}) for every private setting, so accuracy is plotted against "
            f"{against}"
            if len(eps_all) == 1
            else f"; settings of one line share their epsilon, so accuracy is plotted against {against}"
        )
        if not numeric_key and len(varied) > 1:
            text += f" (--line {varied[-1]}: one line per value)"
    ax.set_title(textwrap.fill(text, 72, break_on_hyphens=False), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    lo, hi = ax.get_ylim()  # an interval over few seeds can reach past what an accuracy can be
    ax.set_ylim(max(lo, -2.0), min(hi, 102.0))
    _place_labels(fig, ax, labels)
    handles, names = ax.get_legend_handles_labels()
    blank = Line2D([], [], ls="none")
    notes = [
        f"y: per run, {statistic(last)}; points: mean over seeds, "
        + ("bars: 95% Student t interval over seeds" if max(n_seeds) > 1 else "n=1, no interval")
        + "; faint dots: seeds",
        *_sampling_notes(settings),
    ]
    if labels:
        notes.append("point labels: " + ", ".join(f"{_short(k)} = {k}" for k in varied))
    handles += [blank] * len(notes)
    names += [textwrap.fill(n, 46) for n in notes]
    ax.legend(
        handles,
        names,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=7.5,
        borderaxespad=0.0,
        handlelength=2.2,
    )
    return fig


def plot_privacy_utility(
    runs: list[SweepRun], path: Path, *, line: str | None, title: str, last: int = DEFAULT_LAST
) -> Path | None:
    """``privacy_utility.png`` (:func:`privacy_utility_figure`), the legend outside the axes."""
    fig = privacy_utility_figure(runs, line=line, title=title, last=last)
    if fig is None:
        return None
    from fedsim.report.plots import pyplot

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def default_parallel() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
