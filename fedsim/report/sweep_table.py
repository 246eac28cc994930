"""A sweep's runs and what is compared across them: each run's last-k held-out mean, per setting the mean over
seeds with its Student t interval, and per setting its difference to the sweep's reference setting paired by seed
(:func:`paired_differences`); the comparison table and the three CSVs (``sweep.csv``, ``sweep_summary.csv``,
``sweep_paired.csv``).

Why paired: a run's seed draws its data, partition, initial model and batch orders (``data_seed``) as well as its
cohorts and noise (``noise_seed``; :data:`fedsim.scenarios.schema.SEEDS`), so the spread over seeds of one setting
holds the spread of the data too, and two settings' unpaired intervals overlap where the settings differ
consistently. The runs of two settings with the same seed share their data: their difference, seed by seed, leaves
the data's spread out. Its Student t interval is over the paired differences, and the sign count (``3/3 above``)
says in how many seeds the setting was above (below) the reference.

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

from fedsim.privacy import PrivacySettings

#: how many evaluated rounds a run's held-out accuracy is averaged over, unless ``--last``/``sweep.last`` say
DEFAULT_LAST = 5


#: a run's held-out accuracy averaged over its last k evaluated rounds (the statistic the sweep compares)
MEAN = "heldout_accuracy_mean"


#: the confidence of the interval over seeds
CONFIDENCE = 0.95


#: the columns of the comparison table after the grid's own
RESULT_COLUMNS = (
    "seed",
    "data_seed",  # what the seed drew (scenarios.schema.SEEDS): both are the seed unless the scenario fixed one
    "noise_seed",
    MEAN,
    "heldout_accuracy_final",
    "heldout_rounds_averaged",
    "non_private_train_accuracy",  # exact statistics of training clients (final round): epsilon does not cover them
    "non_private_gap_accuracy",
    "noise_multiplier",  # the one the run used: calibrated to privacy.target_epsilon where it set one (config.toml)
    "epsilon",  # after the final round; infinite for a run without noise (private = false)
    "private",
    "rounds",
    "non_private_wall_s",  # timings grow with the realised cohort
    "status",
    # the kinds of the run's setting warnings (summary.json's `warnings`, fedsim.run_checks: noise, delta, ...)
    "warnings",
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
    #: clients a round), ``noise_multiplier`` (the one it used, calibrated where ``target_epsilon`` was set:
    #: ``calibrated``), ``clip``, ``data_seed`` and ``noise_seed`` (:func:`add_statistics`)
    facts: dict[str, Any] = field(default_factory=dict)


def toml_value(value: Any) -> str:
    """A value as ``--set`` reads it back (a TOML literal); None, or the string ``"none"`` (TOML has no null, so a
    ``[sweep]`` table writes it so), removes the key, as ``--set key=none`` does."""
    import tomli_w

    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        return "none"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


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
            cohort = (
                PrivacySettings(
                    sampling=sampling,
                    sampling_rate=rate,
                    clients_per_round=per_round,
                    min_separation=privacy.get("min_separation"),
                    max_participations=privacy.get("max_participations"),
                )
                .mechanism_at(population)
                .expected_cohort
            )
        except ValueError:  # refused by the schema anyway; the note then shows what was given
            pass
    # the noise multiplier the run used: config.toml is written after calibration (fedsim.engine.runner), so it holds
    # the calibrated value; a summary.json that records it too is read first
    z = next(
        (v for v in (summary.get("noise_multiplier"), privacy.get("noise_multiplier")) if _finite(v)), None
    )
    seed = config.get("seed")
    return {
        "sampling": sampling,
        "population": population,
        "cohort": cohort,
        "noise_multiplier": z,
        "calibrated": summary["noise_calibration"] is not None
        if "noise_calibration" in summary  # summary.json's record of the calibration (fedsim.report.rows)
        else privacy.get("target_epsilon") is not None,
        "clip": privacy.get("clip"),
        # a config written before the two seeds existed has seed alone, which drew both
        "data_seed": config.get("data_seed", seed),
        "noise_seed": config.get("noise_seed", seed),
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


def noise_multipliers(s: SettingSummary) -> tuple[list[float], bool]:
    """The noise multipliers a setting's finished runs used (sorted, distinct: one unless a calibration met the
    target over populations that differ by seed), and whether ``privacy.target_epsilon`` calibrated them."""
    zs = sorted(
        {float(r.facts["noise_multiplier"]) for r in s.used if _finite(r.facts.get("noise_multiplier"))}
    )
    return zs, any(bool(r.facts.get("calibrated")) for r in s.used)


def noise_multiplier_text(s: SettingSummary, *, calibrated: bool = True) -> str:
    """``1.13`` (``1.13 (calibrated)`` where ``target_epsilon`` set it), ``1.12-1.14`` where its seeds differ;
    ``n/a`` where no run finished."""
    zs, cal = noise_multipliers(s)
    if not zs:
        return "n/a"
    text = f"{zs[0]:.4g}" if len(zs) == 1 else f"{zs[0]:.4g}-{zs[-1]:.4g}"
    return text + (" (calibrated)" if cal and calibrated else "")


@dataclass
class PairedDifference:
    """A setting's held-out accuracy (:data:`MEAN`) against the reference setting's, paired by seed: the runs of
    both with the same seed drew the same data (``data_seed``), so the difference leaves the data's spread out."""

    setting: dict[str, Any]  # the compared setting (as SweepRun.setting)
    reference: dict[str, Any]  # the reference setting
    seeds: list[int]  # seeds finished in both, paired (sorted)
    differences: list[float]  # per paired seed: setting's heldout_accuracy_mean - reference's
    mean: float | None  # mean difference (None when no pairs)
    half: float | None  # Student t half-width at CONFIDENCE over the differences (None for n < 2)
    n: int  # len(seeds)
    above: int  # seeds with difference > 0
    below: int  # seeds with difference < 0

    @property
    def signs(self) -> str:
        """In how many paired seeds the setting was above, below and equal to the reference: ``3/3 above``,
        ``2/3 above, 1/3 below``; ``no paired seeds``."""
        if not self.n:
            return "no paired seeds"
        equal = self.n - self.above - self.below
        parts = [(self.above, "above"), (self.below, "below"), (equal, "equal")]
        return ", ".join(f"{k}/{self.n} {word}" for k, word in parts if k)

    def text(self) -> str:
        """``+0.034 +- 0.012 (3 pairs; 3/3 above)`` for the console table."""
        if self.mean is None:
            return "n/a (no paired seeds)"
        spread = f" +- {self.half:.3f}" if self.half is not None else ""
        pairs = f"{self.n} pair{'s' if self.n != 1 else ''}" + (
            "" if self.half is not None else ", no interval"
        )
        return f"{self.mean:+.3f}{spread} ({pairs}; {self.signs})"


def setting_text(setting: dict[str, Any]) -> str:
    """A setting as ``--reference`` takes it back: ``variant=dp-fedavg,privacy.target_epsilon=4.0`` (a name holding
    a comma, a quote or ``=`` quoted)."""

    def cell(v: Any) -> str:
        quote = isinstance(v, str) and any(c in v for c in ",=\"'[]{}")
        return toml_value(v) if quote else str(_setting_cell(v))

    return ",".join(f"{k}={cell(v)}" for k, v in setting.items()) or "(the one setting)"


def _settings_in_order(runs: list[SweepRun]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for r in runs:
        seen.setdefault(_slug(r.setting), dict(r.setting))
    return list(seen.values())


def _same_value(value: Any, raw: str, parsed: Any) -> bool:
    """A setting's value against one written in ``--reference`` (``raw``, read as TOML: ``parsed``): numbers
    compare as numbers (``1`` is ``1.0``, but never ``true``), ``none`` is none, anything else as written."""
    if raw.strip() in (str(value), _setting_cell(value)):
        return True
    none = value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))
    if none or parsed is None:
        return none and parsed is None
    if isinstance(value, bool) or isinstance(parsed, bool):
        return isinstance(value, bool) and isinstance(parsed, bool) and value == parsed
    if isinstance(value, int | float) and isinstance(parsed, int | float):
        return float(value) == float(parsed)
    return bool(value == parsed)


def reference_setting(runs: list[SweepRun], requested: str | None) -> dict[str, Any] | None:
    """The sweep's reference setting: `requested` is a setting written as in the CLI, `key=value[,key=value]` (e.g.
    "variant=dp-fedavg" or "privacy.mechanism=independent"), matching exactly one setting, else a clear error; None
    requested -> the first setting in sweep order. None when the sweep has a single setting.

    A key is a setting's key (``privacy.noise_multiplier``), or its last part where that names one key alone
    (``noise_multiplier``); values are read as TOML, as ``--grid`` reads them. Errors are
    :class:`~fedsim.scenarios.ScenarioError` naming what was given and what the sweep has."""
    from fedsim.validation import ScenarioError, parse_value

    settings = _settings_in_order(runs)
    if requested is None or not requested.strip():
        return settings[0] if len(settings) > 1 else None
    keys = _setting_keys(runs)
    listed = "; ".join(setting_text(s) for s in settings) or "none"
    wanted: dict[str, tuple[str, Any]] = {}
    for item in split_values(requested):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ScenarioError(
                f"--reference {requested!r}: {item!r} is not key=value; write the reference setting as "
                f"key=value[,key=value], e.g. {setting_text(settings[0]) if settings else 'variant=dp-fedavg'}"
            )
        named = [key] if key in keys else [k for k in keys if k.rsplit(".", 1)[-1] == key]
        if not named:
            raise ScenarioError(
                f"--reference {requested!r}: {key!r} is not a key of this sweep's settings; its keys: "
                f"{', '.join(keys) or 'none (a single setting)'}"
            )
        if len(named) > 1:
            raise ScenarioError(
                f"--reference {requested!r}: {key!r} names several keys of this sweep ({', '.join(named)}); "
                "give the full key"
            )
        if named[0] in wanted:
            raise ScenarioError(f"--reference {requested!r}: {named[0]} is given twice")
        wanted[named[0]] = (raw.strip(), parse_value(raw))
    matches = [
        s for s in settings if all(k in s and _same_value(s[k], raw, v) for k, (raw, v) in wanted.items())
    ]
    if not matches:
        raise ScenarioError(
            f"--reference {requested!r} matches no setting of this sweep; its settings: {listed}"
        )
    if len(matches) > 1:
        raise ScenarioError(
            f"--reference {requested!r} matches {len(matches)} settings of this sweep "
            f"({'; '.join(setting_text(s) for s in matches)}): add keys until one is left"
        )
    return matches[0] if len(settings) > 1 else None


def _by_seed(runs: list[SweepRun]) -> dict[int, float]:
    """A setting's finished runs' :data:`MEAN` by seed (the first run of a seed, should one appear twice)."""
    out: dict[int, float] = {}
    for r in runs:
        if not run_failed(r.result) and _finite(r.result.get(MEAN)):
            out.setdefault(int(r.seed), float(r.result[MEAN]))
    return out


def paired_to_reference(
    runs: list[SweepRun], reference: dict[str, Any] | None, line: str | None = None
) -> list[PairedDifference]:
    """The sweep's paired comparisons, the one rule the tables, the CSVs and the figure use. With a ``line`` key
    (the figure's lines: ``variant``, or ``--line``) that the reference setting has, each setting is paired with
    the setting on the reference's line that shares all its other values (the same target epsilon, the same grid
    point): a mechanism is compared with the reference mechanism at the same epsilon, never across epsilons.
    Otherwise every setting is paired with the reference itself (:func:`paired_differences`)."""
    if reference is None:
        return []
    if not line or line not in reference:
        return paired_differences(runs, reference)

    def key(value: Any) -> str:
        return json.dumps(value, sort_keys=True, default=str)

    groups: dict[str, list[SweepRun]] = {}
    for r in runs:
        groups.setdefault(key({k: v for k, v in r.setting.items() if k != line}), []).append(r)
    out: list[PairedDifference] = []
    for members in groups.values():
        ref = next((r.setting for r in members if key(r.setting.get(line)) == key(reference[line])), None)
        if ref is not None:
            out += paired_differences(members, dict(ref))
    order = {_slug(s): i for i, s in enumerate(_settings_in_order(runs))}
    return sorted(out, key=lambda d: order.get(_slug(d.setting), 0))


def reference_slugs(reference: dict[str, Any] | None, pairs: list[PairedDifference]) -> set[str]:
    """The settings the others are compared with: the reference, and with a line key the reference line's
    setting at each point (:func:`paired_to_reference`)."""
    return ({_slug(reference)} if reference is not None else set()) | {_slug(d.reference) for d in pairs}


def paired_differences(runs: list[SweepRun], reference: dict[str, Any] | None) -> list[PairedDifference]:
    """One per setting other than the reference, in sweep order (runs after add_statistics); [] when reference is
    None. Seeds pair by the run's seed (:attr:`SweepRun.seed`); a seed that did not finish in both is left out."""
    if reference is None:
        return []
    ref_slug = _slug(reference)
    groups: dict[str, list[SweepRun]] = {}
    for r in runs:
        groups.setdefault(_slug(r.setting), []).append(r)
    if ref_slug not in groups:
        raise ValueError(f"the reference setting {setting_text(reference)} is not a setting of this sweep")
    ref = _by_seed(groups[ref_slug])
    out = []
    for slug, members in groups.items():
        if slug == ref_slug:
            continue
        mine = _by_seed(members)
        seeds = sorted(set(mine) & set(ref))
        diffs = [mine[k] - ref[k] for k in seeds]
        mean, half, n = t_interval(diffs)
        out.append(
            PairedDifference(
                setting=dict(members[0].setting),
                reference=dict(reference),
                seeds=seeds,
                differences=diffs,
                mean=mean,
                half=half,
                n=n,
                above=sum(d > 0 for d in diffs),
                below=sum(d < 0 for d in diffs),
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
            **{k: r.facts.get(k) for k in ("data_seed", "noise_seed", "noise_multiplier")},
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
    "noise_multiplier": "noise\nmultiplier",
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
    if column == "noise_multiplier" and _finite(value):
        return f"{value:.4g}"
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
        "reference",
        f"paired_difference ({statistic(last)}; setting - reference, mean over paired seeds)",
        f"paired_ci{CONFIDENCE * 100:.0f}_halfwidth (Student t over paired differences)",
        "paired_seeds",
        "paired_above",
        "paired_below",
        "paired_signs",
        "noise_multiplier",
        "noise_multiplier_calibrated",
        "epsilon_min",
        "epsilon_max",
        "private",
        "sampling",
        "population",
        "expected_cohort",
    ]


def summary_rows(
    runs: list[SweepRun], last: int = DEFAULT_LAST, reference: str | None = None, line: str | None = None
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """``(grid keys, result columns, rows)`` of ``sweep_summary.csv``: a row per setting; ``reference`` as
    :func:`reference_setting` takes it (None: the first setting)."""
    keys, cols = _setting_keys(runs), summary_columns(last)
    ref = reference_setting(runs, reference)
    pairs = paired_to_reference(runs, ref, line)
    paired, references = {_slug(d.setting): d for d in pairs}, reference_slugs(ref, pairs)
    rows = []
    for s in summarise_settings(runs):
        d = paired.get(_slug(s.setting))
        zs, calibrated = noise_multipliers(s)
        values = [
            s.n,
            s.failed,
            s.mean,
            s.half,
            interval_text(s.n),
            s.final_mean,
            _slug(s.setting) in references,
            d and d.mean,
            d and d.half,
            d and d.n,
            d and d.above,
            d and d.below,
            d and d.signs,
            (zs[0] if len(zs) == 1 else noise_multiplier_text(s, calibrated=False)) if zs else None,
            calibrated if zs else None,
            s.eps_min,
            s.eps_max,
            s.private,
            s.facts.get("sampling"),
            s.facts.get("population"),
            s.facts.get("cohort"),
        ]
        rows.append({**{k: s.setting.get(k) for k in keys}, **dict(zip(cols, values, strict=True))})
    return keys, cols, rows


def write_summary_csv(
    runs: list[SweepRun],
    path: Path,
    *,
    last: int = DEFAULT_LAST,
    reference: str | None = None,
    line: str | None = None,
) -> Path:
    """``sweep_summary.csv``: per setting, n (finished runs), the mean over seeds of the runs' last-``last``
    held-out means, the 95% Student t half-width (blank for n = 1), whether it is the reference (``reference``
    as :func:`reference_setting` takes it; None: the first setting) and, for the others, the difference to it
    paired by seed (mean, 95% Student t half-width over the differences, pairs, seeds above and below), the noise
    multiplier its runs used, the certified epsilon's min and max over the seeds (``inf`` for a setting without
    noise), and the population and cohort its sampling protects."""
    keys, cols, rows = summary_rows(runs, last, reference, line)
    cells = [{**{k: _setting_cell(row[k]) for k in keys}, **{c: _cell(row[c]) for c in cols}} for row in rows]
    return _write(path, [*keys, *cols], {}, cells)


def paired_columns(last: int) -> list[str]:
    return [
        "seed",
        "reference",
        f"heldout_accuracy ({statistic(last)})",
        f"reference_heldout_accuracy ({statistic(last)})",
        "difference (setting - reference)",
    ]


def write_paired_csv(
    runs: list[SweepRun],
    path: Path,
    *,
    last: int = DEFAULT_LAST,
    reference: str | None = None,
    line: str | None = None,
) -> Path:
    """``sweep_paired.csv``: a row per setting (but the reference) and paired seed: the setting's and the
    reference's last-``last`` held-out means in that seed and their difference, the numbers that
    ``sweep_summary.csv``'s paired columns summarise. Only a header when the sweep has one setting."""
    keys, cols = _setting_keys(runs), paired_columns(last)
    ref = reference_setting(runs, reference)

    def by_seed(setting: dict[str, Any]) -> dict[int, float]:
        return _by_seed([r for r in runs if _slug(r.setting) == _slug(setting)])

    cells = []
    for d in paired_to_reference(runs, ref, line):
        mine, theirs = by_seed(d.setting), by_seed(d.reference)
        for seed, diff in zip(d.seeds, d.differences, strict=True):
            values = [seed, setting_text(d.reference), mine[seed], theirs[seed], diff]
            cells.append(
                {
                    **{k: _setting_cell(d.setting.get(k)) for k in keys},
                    **{c: _cell(v) for c, v in zip(cols, values, strict=True)},
                }
            )
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
