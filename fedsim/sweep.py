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

import itertools
import json
import math
import os
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.report.rows import PUBLIC_STOPS, summary_stop, summary_timings
from fedsim.report.rundir import flatten_tables
from fedsim.report.sweep_table import (
    SweepRun,
    _slug,
    _summary,
    split_values,
    toml_value,
)
from fedsim.scenarios import Scenario, ScenarioError, load_scenario, parse_override, scenario_to_toml
from fedsim.scenarios.loader import SHORTHANDS
from fedsim.scenarios.schema import SEEDS


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


def fixed_seeds(base: Scenario) -> dict[str, int]:
    """The seeds (``data_seed``, ``noise_seed``) the scenario (or ``--set``) fixes: a sweep's ``seeds = k`` varies
    ``seed``, and so every seed it does not fix (scenarios.schema.SEEDS)."""
    return {k: getattr(base, k) for k in SEEDS if k in base.model_fields_set}


#: a variant label that says its runs add no noise (case-insensitive): "non-private", "not private", "no noise",
#: "noiseless", "z = 0", "sigma = 0"
NO_NOISE_LABEL = re.compile(
    r"\bnon[-_ ]?private\b|\bnot[-_ ]private\b|\bno[-_ ]noise\b|\bnoiseless\b|\b(?:z|sigma)\s*=\s*0(?![.\d])",
    re.IGNORECASE,
)


def check_layers(
    sets: list[str],
    grid: dict[str, list[Any]],
    grid_origin: str,
    labels: list[str],
    variants: list[dict[str, Any]],
) -> None:
    """Refuse a sweep whose layers would replace each other's values in every run: a grid key a variant also sets
    (the grid's values would replace the variant's), a ``--set`` key the grid or a variant also sets (the
    sweep's values would replace it). Each message names both settings and where they came from. (The noise
    multiplier and the target epsilon, which replace each other through the calibration, are checked when each
    run is loaded: :func:`fedsim.scenarios.loader.noise_precedence`.)"""
    for label, variant in zip(labels, variants, strict=True):
        for key in variant:
            if key in grid:
                raise ScenarioError(
                    f"sweep variant {label!r} sets {key} = {toml_value(variant[key])}, and {grid_origin} varies "
                    f"{key} over {', '.join(toml_value(v) for v in grid[key])}: the grid's values would replace the "
                    f"variant's in every one of its runs. Take {key} out of the variant or out of the grid (a "
                    "setting that must not take the grid's values, such as a non-private baseline, is a sweep of "
                    "its own, or each value becomes a variant)"
                )
    swept = {key: grid_origin for key in grid}
    for label, variant in zip(labels, variants, strict=True):
        for key in variant:
            swept.setdefault(key, f"sweep variant {label!r}")
    for item in sets:
        path, value = parse_override(item)
        key = ".".join(path)
        # a table's shorthand (privacy.mechanism = "banded-mf") keeps its name under the sweep's options of it
        shorthand = tuple(path) in SHORTHANDS and isinstance(value, str)
        hit = next(
            (
                k
                for k in swept
                if k == key or (k.startswith(f"{key}.") and not shorthand) or key.startswith(f"{k}.")
            ),
            None,
        )
        if hit is not None:
            raise ScenarioError(
                f"--set {item} and {swept[hit]} both set {hit}: the sweep's values would replace the --set in "
                "every run. Give it in one place"
            )


def check_label(label: str, scenario: Scenario) -> None:
    """Refuse a variant whose label says its runs add no noise (:data:`NO_NOISE_LABEL`) when its resolved run does
    (a noise multiplier above 0, or one calibrated to a target epsilon): a label never describes a run that did
    not run that way."""
    p = scenario.privacy
    if label and NO_NOISE_LABEL.search(label) and (p.noise_multiplier > 0 or p.target_epsilon is not None):
        what = (
            f"privacy.target_epsilon = {p.target_epsilon:g} (its noise multiplier is calibrated to it)"
            if p.target_epsilon is not None
            else f"privacy.noise_multiplier = {p.noise_multiplier:g}"
        )
        raise ScenarioError(
            f"sweep variant {label!r} is labelled as adding no noise, but its run has {what}: set "
            "privacy.noise_multiplier = 0 and privacy.target_epsilon = none in the variant, or relabel it"
        )


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
    grid_origin = "the sweep grid" if grid is None else "--grid"
    grid = dict(spec.grid) if grid is None else grid
    seeds = spec.seeds if seeds is None else seeds
    if seeds < 1:
        raise ScenarioError(f"--seeds must be >= 1, got {seeds}")
    for key, values in grid.items():
        if not values:
            raise ScenarioError(f"sweep grid key {key!r} has no values")
    variants = [dict(v) for v in spec.variants] or [{}]
    fixed = fixed_seeds(base)
    if any("seed" in d for d in (grid, *variants)):
        raise ScenarioError(
            "sweep grid/variants set 'seed', which sweep.seeds (--seeds) sets run by run (seed, seed+1, ...); "
            "give data_seed or noise_seed there instead"
        )
    if len(fixed) == len(SEEDS) and seeds > 1:
        raise ScenarioError(
            f"sweep.seeds={seeds} varies seed, the shorthand for data_seed and noise_seed, but the scenario fixes both "
            f"({', '.join(f'{k}={v}' for k, v in fixed.items())}): every seed would be the same run; leave one out "
            "(--set noise_seed=none) or give --seeds 1"
        )
    labels = [str(v.pop("label", "")) or _slug(v) for v in variants]
    if len(set(labels)) != len(labels):
        raise ScenarioError(f"sweep.variants need distinct labels, got {labels}")
    check_layers(sets, grid, grid_origin, labels, variants)
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
                seed = base.seed + k  # both seeds, but one the scenario fixes (fixed_seeds)
                overrides = [*sets, *items, *([f"seed={seed}"] if len(fixed) < len(SEEDS) else [])]
                origins = [
                    *["--set"] * len(sets),
                    *[f"sweep variant {label!r}"] * len(variant),
                    *[grid_origin] * len(grid),
                    *["sweep seeds"] * (len(overrides) - len(sets) - len(items)),
                ]
                try:
                    resolved = load_scenario(scenario, overrides, origins=origins)
                    check_label(label, resolved)
                except ScenarioError as exc:
                    raise ScenarioError(f"sweep run {_slug(setting)} seed {seed}: {exc}") from None
                out_dir = root / _slug(setting) / f"seed{seed}"
                runs.append(
                    PlannedRun(
                        setting, seed, overrides, out_dir, origins=origins, rules=resolved.privacy.rules
                    )
                )
    if len({r.out for r in runs}) != len(runs):
        raise ScenarioError("two runs of this sweep would share a directory: make the grid's values distinct")
    return base, runs


@dataclass
class PlannedRun(SweepRun):
    """A run :func:`plan_sweep` planned: a :class:`SweepRun` that also knows where each of its overrides came from
    (``--set``, a variant, the grid, the seeds), so that the rules its run records name them."""

    origins: list[str] | None = None
    #: the precedence rules its settings were merged by (:func:`fedsim.scenarios.loader.noise_precedence`), as
    #: its run prints and records them
    rules: list[str] = field(default_factory=list)


def planned_rules(runs: list[SweepRun]) -> list[str]:
    """The distinct precedence rules of a sweep's planned runs, in order: what ``fedsim sweep`` prints before
    the first run (each run's config.toml and summary.json record its own)."""
    return list(dict.fromkeys(rule for r in runs if isinstance(r, PlannedRun) for rule in r.rules))


def _origins(run: SweepRun) -> list[str] | None:
    return run.origins if isinstance(run, PlannedRun) else None


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
    run, plan = _resolved_seeds(flatten_tables(existing)), flatten_tables(planned)

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
#: rounds about the same clients (whatever its noise_seed: other cohorts and noise of the same clients)
SAME_CLIENTS_KEYS = ("data_seed", "data.")


def _resolved_seeds(flat: dict[str, Any]) -> dict[str, Any]:
    """A run's flattened config with ``data_seed`` and ``noise_seed`` as it ran them: a config written before they
    existed has ``seed`` alone, which drew both."""
    if "seed" in flat:
        for key in SEEDS:
            flat.setdefault(key, flat["seed"])
    return flat


def uncomposed_releases(old_dir: Path, planned: dict[str, Any]) -> str | None:
    """``"<old_dir>: N rounds released ..."`` when ``old_dir`` (a run of other settings that a ``new_run_dirs`` run
    replaces) released ``N >= 1`` rounds about the same clients as the planned run (the same data_seed and data
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
    run, plan = _resolved_seeds(flatten_tables(existing)), flatten_tables(planned)

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
        # what the run's settings do that they do not say (fedsim.run_checks), by kind for the table, in full for
        # the console
        "warnings": ", ".join(dict.fromkeys(w.get("kind", "?") for w in _warnings(summary))),
        "warning_messages": [f"{w.get('kind', '?')}: {w.get('message', '')}" for w in _warnings(summary)],
    }


def _warnings(summary: dict[str, Any]) -> list[dict[str, Any]]:
    found = summary.get("warnings")
    return [w for w in found if isinstance(w, dict)] if isinstance(found, list) else []


def execute(
    scenario: str, overrides: list[str], out: str, origins: list[str] | None = None
) -> dict[str, Any]:
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
        run_scenario(load_scenario(scenario, overrides, origins=origins), run_dir)
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
            r.result = execute(scenario, r.overrides, str(r.out), _origins(r))
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
                scenario,
                [*r.overrides, "engine.name=local", "engine.round_timeout_s=none"],
                str(r.out),
                None if _origins(r) is None else [*_origins(r), "sweep (Ray task)", "sweep (Ray task)"],
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


def default_parallel() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
