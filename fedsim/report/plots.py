"""A run directory's ``plots/`` and the overlays of several runs (``fedsim report``), drawn with matplotlib.

Per run, from ``metrics.jsonl``, ``ledger.json`` and ``summary.json`` only (so ``fedsim report`` can redraw them
from any finished or stopped run):

* ``epsilon.png``: epsilon per round for each certified accountant (dp-accounting's PLD and RDP; the run's own from
  its rows, the other from its ledger), with the paper's IGMM bound as printed and the corrected closed form beside
  them, on a log scale; rounds where the printed bound is undefined are named in the legend;
* ``accuracy.png``: train and held-out accuracy per round and, below, their gap (train is a non-private
  diagnostic: epsilon does not cover it);
* ``generalization.png``: per round, the bound ``a`` of the statement ``P(|gap| > a) < b`` implied by the certified
  epsilon (UAI Theorem 1), beside the measured gap, and ``b``; rounds without a statement are shaded.

Overlays (several runs): held-out accuracy and certified epsilon per round, one line per run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: what every row of a run has (``fedsim.loop``): a file without them is not a run's
ROW_KEYS = ("round", "epsilon", "delta", "accountant")
#: the types of the row values a report reads (None allowed where a value can be missing)
ROW_TYPES: dict[str, Any] = {
    "round": int,
    "epsilon": (int, float),
    "delta": (int, float),
    "accountant": str,
    "heldout_accuracy": (int, float),
    "heldout_loss": (int, float),
    "paper_epsilon_igmm": (int, float),
    "paper_epsilon_igmm-corrected": (int, float),
    "generalization": dict,
    "non_private": dict,
}

#: the other certified accountant is computed from the ledger at most at this many rounds (each is a composition)
LEDGER_POINTS = 24


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window; safe in workers and on servers without a display
    import matplotlib.pyplot as plt

    return plt


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """The rows, summary, ledger and config name of a run directory (``ValueError`` naming what is missing)."""
    path = Path(run_dir)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{path} is not a run directory (no metrics.jsonl)")
    rows = []
    for i, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"{metrics} line {i} is not JSON (a run killed while writing it?)") from None
        wrong = _row_problems(row)
        if wrong:
            raise ValueError(f"{metrics} line {i} is not a fedsim row ({'; '.join(wrong)})")
        rows.append(row)
    summary = _json_or_none(path / "summary.json")
    ledger = _json_or_none(path / "ledger.json")
    # a sweep's runs are <setting>/seed<k>: the seed alone would not say which run a plot is of
    name = f"{path.parent.name}/{path.name}" if path.name.startswith("seed") else path.name
    return {"path": path, "rows": rows, "summary": summary or {}, "ledger": ledger, "name": name}


def _row_problems(row: Any) -> list[str]:
    if not isinstance(row, dict):
        return [f"a JSON {type(row).__name__}, not an object"]
    out = []
    for key, types in ROW_TYPES.items():
        value = row.get(key)
        if key in ROW_KEYS and key not in row:
            out.append(f"no {key}")
        elif (
            key in row
            and not (value is None and key not in ROW_KEYS)
            and not (isinstance(value, types) and not isinstance(value, bool))
        ):
            out.append(f"{key} is {value!r}")
    return out


def _json_or_none(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _column(rows: list[dict[str, Any]], key: str, section: str | None = None) -> np.ndarray:
    out = []
    for r in rows:
        v = (r.get(section) or {}).get(key) if section else r.get(key)
        out.append(math.nan if v is None else float(v))
    return np.asarray(out, dtype=float)


def _ledger_curve(ledger: dict[str, Any] | None, delta: float, method: str, rounds: np.ndarray) -> np.ndarray:
    """``method``'s epsilon after each of ``rounds`` from the ledger (nan where it cannot be computed)."""
    from fedsim.privacy import Ledger

    out = np.full(rounds.size, math.nan)
    if not ledger or not ledger.get("releases"):
        return out
    picks = np.unique(np.linspace(0, rounds.size - 1, min(LEDGER_POINTS, rounds.size)).round().astype(int))
    releases = ledger["releases"]
    for i in picks:
        try:
            upto = {**ledger, "releases": [r for r in releases if int(r["round"]) <= int(rounds[i])]}
            out[i] = Ledger.from_dict(upto).epsilon(delta, method)
        except (
            Exception
        ):  # PLD too large for memory, a damaged ledger: leave the point out, never fail a report
            pass
    return out


def plot_epsilon(run: dict[str, Any], path: Path, from_ledger: bool = True) -> Path:
    plt = _pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    delta = float(rows[-1]["delta"]) if rows else math.nan
    own = str(rows[-1].get("accountant", "pld")) if rows else "pld"
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.plot(r, _column(rows, "epsilon"), "o-", ms=3, lw=2, label=f"{own} (certified, dp-accounting)")
    other = "rdp" if own == "pld" else "pld"
    eps_other = (
        _ledger_curve(run.get("ledger"), delta, other, r) if from_ledger else np.full(r.size, math.nan)
    )
    ok = np.isfinite(eps_other)
    if ok.any():
        ax.plot(r[ok], eps_other[ok], "s--", ms=3, label=f"{other} (certified, from ledger.json)")
    for key, label, style in (
        ("paper_epsilon_igmm-corrected", "IGMM corrected (valid closed form)", ":"),
        ("paper_epsilon_igmm", "IGMM Theorem 7 as printed (not a certificate)", "-."),
    ):
        v = _column(rows, key)
        good = np.isfinite(v)
        undefined = int((~good).sum())
        note = f"; undefined at {undefined} of {len(rows)} rounds" if undefined else ""
        if good.any():
            ax.plot(r[good], v[good], style, lw=1.5, label=label + note)
        elif rows:
            ax.plot([], [], style, label=label + ": undefined at every round")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel(f"epsilon at delta = {delta:g} (log scale)")
    ax.set_title(f"{run['name']}: client-level privacy spent per round")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def plot_accuracy(run: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True, height_ratios=[2, 1])
    held = _column(rows, "heldout_accuracy")
    train = _column(rows, "train_accuracy", "non_private")
    gap = _column(rows, "gap_accuracy", "non_private")
    for values, label, style in (
        (train, "training clients (non-private diagnostic)", "o-"),
        (held, "held-out clients (never trained on)", "s-"),
    ):
        good = np.isfinite(values)
        if good.any():
            top.plot(r[good], 100 * values[good], style, ms=3, label=label)
    top.set_ylabel("client-level accuracy (%)")
    top.set_title(f"{run['name']}: accuracy and generalization gap per round")
    top.grid(True, alpha=0.3)
    if top.get_legend_handles_labels()[0]:
        top.legend(fontsize=8)
    good = np.isfinite(gap)
    bottom.axhline(0.0, color="grey", lw=0.8)
    if good.any():
        bottom.plot(r[good], 100 * gap[good], "d-", ms=3, color="C3", label="gap = train - held-out")
        bottom.legend(fontsize=8)
    bottom.set_xlabel("round")
    bottom.set_ylabel("gap (accuracy points)")
    bottom.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_generalization(run: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    a = _column(rows, "a", "generalization")
    b = _column(rows, "b", "generalization")
    status = [str((row.get("generalization") or {}).get("status", "n/a")) for row in rows]
    gap = np.abs(_column(rows, "gap_loss", "non_private"))
    population = (rows[-1].get("generalization") or {}).get("population") if rows else None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True, height_ratios=[2, 1])
    none = [x for x, s in zip(r, status, strict=True) if s != "ok"]
    for ax in (top, bottom):
        for x in none:
            ax.axvspan(x - 0.5, x + 0.5, color="grey", alpha=0.15, lw=0)
    ok = np.isfinite(a)
    if ok.any():
        top.plot(r[ok], a[ok], "o-", ms=3, label="bound a: P(|gap| > a) < b (Theorem 1, certified epsilon)")
    good = np.isfinite(gap)
    if good.any():
        top.plot(r[good], gap[good], "s-", ms=3, label="measured |gap| in loss (non-private diagnostic)")
    top.plot(
        [], [], "s", color="grey", alpha=0.3, ms=10, label=f"no statement ({len(none)} of {len(rows)} rounds)"
    )
    if not ok.any() and rows:  # said in the empty lower panel, where it hides no data
        last = rows[-1].get("generalization") or {}
        n_min, eps = (
            last.get("n_min"),
            float(rows[-1]["epsilon"] if rows[-1]["epsilon"] is not None else math.nan),
        )
        need = (
            f"needs at least {n_min:,} clients"
            if isinstance(n_min, int)
            else "gives no statement for any number of clients"
        )
        bottom.text(
            0.5,
            0.5,
            f"no statement at any round:\nat the final epsilon {eps:.3g}, Theorem 1 {need}\n(this run has {population})",
            transform=bottom.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": "grey"},
        )
    top.set_ylabel("generalization gap (loss)")
    top.set_title(f"{run['name']}: generalization implied by privacy ({population} clients)")
    top.grid(True, alpha=0.3)
    top.legend(fontsize=8)
    if np.isfinite(b).any():
        bottom.plot(r[np.isfinite(b)], b[np.isfinite(b)], "d-", ms=3, color="C2", label="probability b")
        bottom.legend(fontsize=8)
    bottom.set_ylabel("b (probability)")
    bottom.set_xlabel("round")
    bottom.grid(True, alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def run_plots(run_dir: str | Path, *, from_ledger: bool = True) -> list[Path]:
    """(Re)draw ``RUN_DIR/plots/*.png``; returns the files written. ``from_ledger``: also the other certified
    accountant's curve, recomputed from ``ledger.json`` at up to :data:`LEDGER_POINTS` rounds (seconds: a run
    draws its plots without it, ``fedsim report`` with it)."""
    run = read_run(run_dir)
    out = run["path"] / "plots"
    if not run["rows"]:
        return []
    return [
        plot_epsilon(run, out / "epsilon.png", from_ledger),
        plot_accuracy(run, out / "accuracy.png"),
        plot_generalization(run, out / "generalization.png"),
    ]


def overlay(run_dirs: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Held-out accuracy and certified epsilon per round of several runs, one line per run."""
    plt = _pyplot()
    runs = [read_run(d) for d in run_dirs]
    names = _labels([run["path"] for run in runs])
    written = []
    for key, ylabel, fname, scale in (
        ("heldout_accuracy", "held-out client-level accuracy (%)", "overlay_accuracy.png", 100.0),
        ("epsilon", "certified epsilon (log scale)", "overlay_epsilon.png", 1.0),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for run, name in zip(runs, names, strict=True):
            v = scale * _column(run["rows"], key)
            good = np.isfinite(v)
            if good.any():
                ax.plot(_column(run["rows"], "round")[good], v[good], "o-", ms=2, label=name)
        if key == "epsilon":
            ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{len(runs)} runs: {ylabel.split(' (')[0]} per round")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        written.append(_save(fig, Path(out_dir) / fname))
    return written


def _labels(paths: list[Path]) -> list[str]:
    """Short distinct labels: the last path parts that tell the runs apart."""
    for depth in range(1, 4):
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]
