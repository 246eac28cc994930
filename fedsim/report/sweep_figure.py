"""``privacy_utility.png``: a sweep's held-out accuracy against the certified epsilon (:mod:`fedsim.sweep`).

One line per value of the ``line`` key, bars the 95% interval over seeds, each non-private setting a horizontal
reference line with its interval as a band. The statistics it draws are :mod:`fedsim.report.sweep_table`'s.
"""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.report.sweep_table import (
    DEFAULT_LAST,
    MEAN,
    SettingSummary,
    SweepRun,
    _finite,
    _setting_keys,
    _slug,
    inline_toml,
    statistic,
    summarise_settings,
)
from fedsim.scenarios import ScenarioError


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
