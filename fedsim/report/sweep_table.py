"""A sweep's runs and what is compared across them: each run's last-k held-out mean, per setting the mean over
seeds with its Student t interval, the comparison table and the two CSVs (``sweep.csv``, ``sweep_summary.csv``).

Planning and running a sweep is :mod:`fedsim.sweep`; its figure is :mod:`fedsim.report.sweep_figure`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.privacy import Mechanism

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


def _summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def run_failed(result: dict[str, Any]) -> bool:
    """The row of a run that did not finish: it raised (``error``), or it was stopped by failures, refused or
    lost with its Ray task (``failed``)."""
    return str(result.get("status", "")).startswith(("error", "failed"))


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


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)
