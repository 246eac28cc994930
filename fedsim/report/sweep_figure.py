"""``privacy_utility.png``: a sweep's held-out accuracy against the certified epsilon (:mod:`fedsim.sweep`).

One line per value of the ``line`` key, bars the 95% interval over seeds (lines shifted sideways where they share
an epsilon), each distinct non-private result a horizontal dashed line with its interval as a light band; below,
each setting's difference to the reference setting paired by seed, with its interval and sign count. The
statistics it draws are :mod:`fedsim.report.sweep_table`'s.
"""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from dataclasses import dataclass
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
from fedsim.validation import ScenarioError


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


#: the sideways offset (points) between the marks of two lines at the same x, so that their error bars stand
#: apart; at most :data:`DODGE_SPAN` for all the lines together
DODGE = 7.0
DODGE_SPAN = 40.0
#: the resolution the figure is laid out and saved at (labels are placed in the pixels it is saved in)
DPI = 110
#: epsilons within this relative distance are one epsilon (runs calibrated to one target land within a fraction
#: of a percent of it): their settings share an x
EPSILON_TOLERANCE = 0.01


def _offset(ax: Any, dx: float) -> Any:
    """``ax``'s data coordinates shifted ``dx`` points sideways (the same on a linear, log or category axis)."""
    from matplotlib.transforms import ScaledTranslation

    return ax.transData + ScaledTranslation(dx / 72.0, 0.0, ax.figure.dpi_scale_trans)


def _drawn_points(ax: Any, step: float = 3.0) -> np.ndarray:
    """Display coordinates, every ``step`` pixels, of everything drawn as lines on ``ax`` (the curves, error bars
    and caps, reference lines) and its markers: what a point label must not cover."""
    paths = []
    for artist in [*ax.lines, *ax.collections]:
        if hasattr(artist, "get_segments"):  # error bars
            transform = artist.get_transform()
            paths += [transform.transform(np.asarray(seg)) for seg in artist.get_segments() if len(seg)]
        elif hasattr(artist, "get_xydata"):
            paths.append(artist.get_transform().transform(np.asarray(artist.get_xydata(), dtype=float)))
        elif hasattr(artist, "get_offsets"):  # scatter dots
            transform = artist.get_offset_transform()
            paths += [
                transform.transform(np.asarray(artist.get_offsets()))[i : i + 1]
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


#: a point label: ``(x, y, text, colour, dx)``, dx the point's sideways offset in points (:func:`_offset`)
Label = tuple[float, float, str, str, float]


def _place_labels(fig: Any, ax: Any, labels: list[Label]) -> None:
    """Annotate each point ``(x, y, text, color, dx)`` at the first of a ring of offsets where the text covers no
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
    for x, y, text, color, shift in labels:
        at = {"xy": (x, y), "xycoords": _offset(ax, shift), "textcoords": "offset points"}
        best: tuple[float, Any, Any] | None = None
        for i, (dx, dy) in enumerate(offsets):
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            ann = ax.annotate(text, xytext=(dx, dy), color=color, ha=ha, **at, **style)
            ann.set_in_layout(False)  # placed in the final layout: it must not move the axes it was placed in
            box = ann.get_window_extent(renderer).padded(1.0)
            margin = box.padded(3.0)  # a little inside: a label flush with the frame reads as cut
            inside = frame.contains(margin.x0, margin.y0) and frame.contains(margin.x1, margin.y1)
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
                xytext=ann.xyann,
                color=color,
                ha=ann.get_ha(),
                arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5, "alpha": 0.6},
                **at,
                **style,
            )
            ann.set_in_layout(False)
        taken.append(box)


def _setting_text(setting: dict[str, Any], keys: list[str] | None = None) -> str:
    return ", ".join(f"{_short(k)} = {_value_text(setting[k])}" for k in (keys or setting) if k in setting)


def _redundant_with_x(key: str, members: list[SettingSummary]) -> bool:
    """A grid key whose value every point's x already shows (``privacy.target_epsilon`` against the certified
    epsilon it was calibrated to, or any key equal to the x within 2%): its label would repeat the axis."""
    if key == "privacy.target_epsilon":
        return True
    values = [s.setting.get(key) for s in members]
    return all(
        isinstance(v, int | float) and not isinstance(v, bool) and abs(v - s.eps_max) <= 0.02 * abs(s.eps_max)
        for v, s in zip(values, members, strict=True)
    )


def _line_value(s: SettingSummary | dict[str, Any], line: str | None) -> str | None:
    """The value of the ``line`` key of a setting (or of a setting's summary) as written; None without lines."""
    setting = s if isinstance(s, dict) else s.setting
    return _value_text(setting.get(line)) if line else None


def _same_epsilon(a: float, b: float) -> bool:
    """Within :data:`EPSILON_TOLERANCE` of each other: epsilons calibrated to one target land within a fraction
    of a percent of it, and are one epsilon."""
    return abs(a - b) <= EPSILON_TOLERANCE * max(abs(a), abs(b), 1e-12)


def _point_text(s: SettingSummary, keys: list[str]) -> str:
    return ", ".join(f"{_short(k)}={_value_text(s.setting.get(k))}" for k in keys)


def _legend_text(name: str) -> str:
    """A legend entry wrapped to the width of the legend beside the axes, its own line breaks kept."""
    return "\n".join(textwrap.fill(part, 44) for part in name.split("\n"))


@dataclass
class _XAxis:
    """What the top panel's x is, and where each point of it goes.

    x is the certified epsilon unless epsilon does not tell the settings apart (``collapsed``: two settings of a
    line share their epsilon, every private setting has the same one, or no setting is private); then it is the
    one varied grid key where that key is numeric (``numeric_key``), else the setting as a category."""

    collapsed: bool
    #: the x where ``collapsed`` and one numeric grid key is varied
    numeric_key: str | None
    #: the grid keys other than the line's whose value differs between the points
    varied: list[str]
    #: the categories' names in x order, where x is the setting
    categories: list[str]
    #: each point's x, by its setting's slug
    xs_of: dict[str, float]
    #: whether lines have points at one x, so that each line's marks are shifted sideways
    dodged: bool
    #: the sideways distance (points) between two lines' marks where ``dodged``
    step: float
    #: each line's sideways shift (points), 0 where not ``dodged``
    shift: dict[str | None, float]
    #: the grid keys a point's label names (not those the x already shows)
    label_keys: list[str]
    #: the private settings' distinct epsilons, in order
    eps_all: list[float]

    @property
    def categorical(self) -> bool:
        """x is the setting: no line joins its points."""
        return self.collapsed and not self.numeric_key


def _numeric_key(varied: list[str], points: list[SettingSummary]) -> str | None:
    """The varied grid key where it is the only one and every point's value of it is a number, else None."""
    if len(varied) != 1:
        return None
    values = [s.setting.get(varied[0]) for s in points]
    return varied[0] if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values) else None


def _is_dodged(points: list[SettingSummary], x: dict[str, float], line: str | None, collapsed: bool) -> bool:
    """Whether points of two lines share their x (``x`` by setting slug; epsilons within
    :data:`EPSILON_TOLERANCE` are one x), so that one line's error bars would hide the other's."""

    def at(s: SettingSummary) -> float:
        return x[_slug(s.setting)]

    return any(
        _line_value(a, line) != _line_value(b, line)
        and (_same_epsilon(at(a), at(b)) if not collapsed else at(a) == at(b))
        for a, b in itertools.combinations(points, 2)
    )


def _x_axis(
    runs: list[SweepRun],
    points: list[SettingSummary],
    private: list[SettingSummary],
    groups: dict[str | None, list[SettingSummary]],
    line: str | None,
) -> _XAxis:
    """The top panel's x (:class:`_XAxis`) for the ``points`` drawn with bars, grouped in lines by ``groups``."""
    only_baselines = not private
    point_keys = [k for k in _setting_keys(runs) if k != line]
    varied = [k for k in point_keys if len({json.dumps(s.setting.get(k)) for s in points}) > 1]
    eps_values = [s.eps_max for s in private]
    collapsed = (
        only_baselines
        or any(
            _same_epsilon(a.eps_max, b.eps_max)
            for members in groups.values()
            for a, b in itertools.combinations(members, 2)
        )
        or (len(private) > 1 and _same_epsilon(min(eps_values), max(eps_values)))
    )
    numeric_key = _numeric_key(varied, points)
    categories: list[str] = []

    def x_of(s: SettingSummary) -> float:
        if not collapsed:
            return float(s.eps_max)
        if numeric_key:
            return float(s.setting[numeric_key])
        text = _point_text(s, varied) or _line_value(s, line) or _slug(s.setting)
        if text not in categories:
            categories.append(text)
        return float(categories.index(text))

    xs_of = {_slug(s.setting): x_of(s) for s in points}
    dodged = len(groups) > 1 and _is_dodged(points, xs_of, line, collapsed)
    step = min(DODGE, DODGE_SPAN / max(len(groups) - 1, 1))
    return _XAxis(
        collapsed=collapsed,
        numeric_key=numeric_key,
        varied=varied,
        categories=categories,
        xs_of=xs_of,
        dodged=dodged,
        step=step,
        shift={
            name: ((i - (len(groups) - 1) / 2) * step if dodged else 0.0) for i, name in enumerate(groups)
        },
        label_keys=[k for k in varied if collapsed or not _redundant_with_x(k, points)],
        eps_all=sorted({s.eps_max for s in private}),
    )


def _line_colors(
    groups: dict[str | None, list[SettingSummary]],
    baseline: list[SettingSummary],
    line: str | None,
    only_baselines: bool,
) -> dict[str | None, str]:
    """A colour per line, matplotlib's cycle in the lines' order; beside private lines, a baseline on a line of
    its own takes the next colour (without lines, baselines are drawn in a neutral grey)."""
    colors = {name: f"C{i % 10}" for i, name in enumerate(groups)}
    if not only_baselines and line:
        for b in baseline:
            colors.setdefault(_line_value(b, line), f"C{len(colors) % 10}")
    return colors


def _line_label(
    name: str | None, members: list[SettingSummary], line: str | None, only_baselines: bool, x: _XAxis
) -> str:
    """A line's legend entry: its value of ``line`` (what kind of setting it is without lines), and its
    epsilons where x is not epsilon and the lines differ in it."""
    if only_baselines:
        label = _baseline_label(members[0]) + (f", {line} = {name}" if line else "")
    else:
        label = f"{line} = {name}" if line else "DP-FedAvg (private)"
    if x.collapsed and len(x.eps_all) > 1:  # the lines differ in epsilon: each says its own
        eps = sorted({s.eps_max for s in members})
        label += f", epsilon {eps[0]:.3g}" + (f"-{eps[-1]:.3g}" if len(eps) > 1 else "")
    return label


def _draw_lines(
    ax: Any,
    groups: dict[str | None, list[SettingSummary]],
    colors: dict[str | None, str],
    x: _XAxis,
    line: str | None,
    only_baselines: bool,
) -> tuple[list[Any], list[str], list[Label]]:
    """Each line of points: the means over seeds with their bars, joined unless x is categorical, and the
    seeds as faint dots, all shifted by the line's :attr:`_XAxis.shift`. Returns the legend's handles and names
    and the point labels to place once the figure is laid out."""
    handles: list[Any] = []
    names: list[str] = []
    labels: list[Label] = []
    for name, members in groups.items():
        members = sorted(members, key=lambda s: x.xs_of[_slug(s.setting)])
        xs = np.array([x.xs_of[_slug(s.setting)] for s in members])
        ys = np.array([100 * s.mean for s in members])
        err = np.array([100 * (s.half or 0.0) for s in members])
        color = colors[name]
        moved = _offset(ax, x.shift[name])
        for s, at in zip(members, xs, strict=True):
            seeds = [100 * r.result[MEAN] for r in s.used]
            dots = ax.scatter([at] * len(seeds), seeds, s=14, alpha=0.45, color=color, linewidths=0, zorder=2)
            dots.set_offset_transform(moved)
            if not x.collapsed and x.label_keys:
                labels.append((at, 100 * s.mean, _point_text(s, x.label_keys), color, x.shift[name]))
        label = _line_label(name, members, line, only_baselines, x)
        bars = ax.errorbar(
            xs,
            ys,
            yerr=err if err.any() else None,
            fmt="o" if x.categorical else "o-",
            capsize=3,
            color=color,
            label=label,
            zorder=3,
            transform=moved,
        )
        handles.append(bars)
        names.append(label)
    return handles, names, labels


def _baseline_line_label(
    name: str | None,
    same: list[SettingSummary],
    runs: list[SweepRun],
    line: str | None,
    twins: int,
) -> str:
    """The legend entry of a baseline drawn once for the settings ``same`` (one result seed by seed): what it
    is, its line, the grid values it stands for where several, and its fixed settings where ``twins`` (the
    distinct baselines on its line) are more than one."""
    b = same[0]
    label = _baseline_label(b) + (f", {line} = {name}" if line else "")
    others = [
        k for k in _setting_keys(runs) if k != line and len({_value_text(o.setting.get(k)) for o in same}) > 1
    ]
    if len(same) > 1:  # the same runs under several grid values: one line, and the label says which
        label += "; the same result at " + "; ".join(
            f"{_short(k)} = {', '.join(dict.fromkeys(_value_text(o.setting.get(k)) for o in same))}"
            for k in others
        )
    if twins > 1:  # several distinct baselines on one line: say which settings each is
        fixed = [k for k in b.setting if k != line and k not in others]
        label += ", " + ", ".join(f"{_short(k)}={_value_text(b.setting[k])}" for k in fixed)
    return label


def _draw_baselines(
    ax: Any,
    runs: list[SweepRun],
    baseline: list[SettingSummary],
    colors: dict[str | None, str],
    line: str | None,
) -> tuple[list[Any], list[str]]:
    """The baselines beside private settings: one dashed line per distinct result (settings whose runs gave
    the same result seed by seed are one line), its 95% interval a light band with dotted edges. Returns the
    legend's handles and names."""
    from matplotlib.patches import Patch

    distinct: dict[tuple, list[SettingSummary]] = {}
    for b in baseline:
        result = tuple(sorted((r.seed, round(float(r.result[MEAN]), 12)) for r in b.used))
        distinct.setdefault((_line_value(b, line), result), []).append(b)
    handles: list[Any] = []
    names: list[str] = []
    for (name, _), same in distinct.items():
        b = same[0]
        color = colors[name] if line else "0.2"
        y = 100 * b.mean
        label = _baseline_line_label(name, same, runs, line, sum(key[0] == name for key in distinct))
        dash = ax.axhline(y, ls="--", lw=1.4, color=color, zorder=2, label=label)
        if b.half is not None:
            ax.axhspan(y - 100 * b.half, y + 100 * b.half, color=color, alpha=0.08, lw=0, zorder=1)
            for edge in (y - 100 * b.half, y + 100 * b.half):
                ax.axhline(edge, ls=":", lw=0.8, color=color, alpha=0.8, zorder=1)
            band = Patch(facecolor=color, alpha=0.25, edgecolor=color, linestyle=":")
            handles.append((band, dash))
            spread = f"band: 95% t interval over {b.n} seeds"
        else:
            handles.append(dash)
            spread = "n=1, no interval"
        names.append(f"{label}\n({spread})")
    return handles, names


def _seed_range(settings: list[SettingSummary]) -> tuple[str, int]:
    """The settings' numbers of seeds as text (``5``, or ``3-5`` where they differ), and the largest."""
    n_seeds = sorted({s.n for s in settings})
    return (f"{n_seeds[0]}" if len(n_seeds) == 1 else f"{n_seeds[0]}-{n_seeds[-1]}"), n_seeds[-1]


def _title_text(title: str, settings: list[SettingSummary], x: _XAxis, only_baselines: bool) -> str:
    """The figure's title: the sweep, its settings and seeds, and, where x is not epsilon, why."""
    seeds, most = _seed_range(settings)
    text = (
        f"{title}: privacy-utility, {len(settings)} setting{'s' if len(settings) != 1 else ''} x {seeds} "
        f"seed{'s' if most != 1 else ''}"
    )
    if x.collapsed and not only_baselines:
        against = x.numeric_key or "the setting"
        text += (
            f"; epsilon is the same ({x.eps_all[0]:.3g}) for every private setting, so accuracy is plotted against "
            f"{against}"
            if len(x.eps_all) == 1
            else f"; settings of one line share their epsilon, so accuracy is plotted against {against}"
        )
        if not x.numeric_key and len(x.varied) > 1:
            text += f" (--line {x.varied[-1]}: one line per value)"
    return text


def _label_axes(
    ax: Any,
    bottom: Any,
    runs: list[SweepRun],
    settings: list[SettingSummary],
    first: dict[str, Any],
    x: _XAxis,
    *,
    title: str,
    last: int,
    only_baselines: bool,
) -> None:
    """The top panel's scale, axis labels (the x label on the ``bottom`` panel), title and limits; ``first``
    is a run's result, whose delta and accountant the epsilon axis names."""
    from fedsim.report.plots import readable_log_ticks

    if not x.collapsed and len(x.eps_all) > 1 and x.eps_all[-1] > 10 * max(x.eps_all[0], 1e-12):
        ax.set_xscale("log")
        readable_log_ticks(ax, "x")  # 2, 3, 5, 10, 20 rather than 10^0 and 10^1 only
    if x.collapsed:
        if x.numeric_key:
            bottom.set_xlabel(x.numeric_key)
        else:
            bottom.set_xticks(range(len(x.categories)), x.categories, rotation=20, ha="right", fontsize=8)
            bottom.set_xlabel(
                "setting (no private setting: epsilon is infinite for every run)"
                if only_baselines
                else "setting"
            )
        if len(x.categories) > 0:
            ax.set_xlim(-0.6, len(x.categories) - 0.4)
    else:
        bottom.set_xlabel(
            f"certified epsilon after the final round, delta = {first.get('delta')} ({first.get('accountant')})"
        )
    ax.set_ylabel(f"held-out client-level {_accuracy_name(runs)} (%)\n{statistic(last)}")
    ax.set_title(
        textwrap.fill(_title_text(title, settings, x, only_baselines), 80, break_on_hyphens=False),
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    lo, hi = ax.get_ylim()  # an interval over few seeds can reach past what an accuracy can be
    ax.set_ylim(max(lo, -2.0), min(hi, 102.0))


def _point_notes(settings: list[SettingSummary], x: _XAxis, last: int) -> list[str]:
    """The notes under the figure on the top panel's points: what y, the points, bars and dots are, and the
    sideways shift where the lines are dodged."""
    notes = [
        f"y: per run, {statistic(last)}; points: mean over seeds, "
        + ("bars: 95% Student t interval over seeds" if _seed_range(settings)[1] > 1 else "n=1, no interval")
        + "; faint dots: seeds"
    ]
    if x.dodged:
        notes.append(
            f"points of the lines at one {'epsilon' if not x.collapsed else 'x'} are shifted sideways "
            f"({x.step:g} pt apart) so that their bars do not overlap"
        )
    return notes


def _legend_and_notes(fig: Any, ax: Any, handles: list[Any], names: list[str], notes: list[str]) -> None:
    """The top panel's legend beside it (a baseline's handle is its band and dashed line together) and the
    notes under the figure."""
    from matplotlib.legend_handler import HandlerTuple

    ax.legend(
        handles,
        [_legend_text(n) for n in names],
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)},
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=7.5,
        borderaxespad=0.0,
        handlelength=2.4,
    )
    fig.text(
        0.0,
        0.0,
        "\n".join(textwrap.fill(n, 130, subsequent_indent="  ") for n in notes),
        fontsize=7,
        va="top",
        ha="left",
        color="0.2",
    )


def _figure(paired: bool) -> tuple[Any, Any, Any]:
    """The figure, its top axes and, where ``paired``, the paired differences' axes under it (sharing x)."""
    from fedsim.report.plots import pyplot

    plt = pyplot()
    if paired:
        fig, (ax, dax) = plt.subplots(
            2, 1, figsize=(8.6, 7.2), dpi=DPI, sharex=True, height_ratios=[3, 2], layout="constrained"
        )
        return fig, ax, dax
    fig, ax = plt.subplots(figsize=(8.6, 4.8), dpi=DPI, layout="constrained")
    return fig, ax, None


def privacy_utility_figure(
    runs: list[SweepRun],
    *,
    line: str | None,
    title: str,
    last: int = DEFAULT_LAST,
    reference: str | None = None,
) -> Any:
    """The privacy-utility figure (a matplotlib Figure, or None when no run has a held-out accuracy).

    Top panel, y: per setting, the mean over seeds of each run's held-out accuracy averaged over its last ``last``
    evaluated rounds; bars: the 95% Student t interval over seeds; faint dots: the seeds. x: the certified epsilon
    after the final round, one line per value of ``line``; when two settings of one line share their epsilon, or
    every private setting has the same one (within :data:`EPSILON_TOLERANCE`: a sweep at constant or calibrated
    epsilon), x is the varied grid key, or the setting, instead and the title says so. Where lines have points at
    the same x, each line's marks are shifted sideways by a few points (the same shift for all its points), so
    that no bar hides another. A setting without noise (``noise_multiplier = 0``, not private) is a horizontal
    dashed line, its interval a light band with dotted edges; settings without noise whose runs gave the same
    result seed by seed (a grid key that does not act without noise) are one line. A sweep of such settings only
    draws them as points with bars against the setting.

    Bottom panel (where a reference setting and a setting paired with it exist): each setting's difference to the
    ``reference`` (``key=value[,key=value]``, resolved by :func:`fedsim.report.sweep_table.reference_setting`; the
    first setting by default), paired by seed (:func:`_pairs`), with its 95% t interval over the paired
    differences and ``k/n``: the seeds of the n paired in which the difference has the sign of its mean. The
    reference is the named zero line. Notes (the statistic, the samplings, what a label means) are under the
    figure. Call :func:`add_statistics` first."""
    from fedsim.report import sweep_table

    settings = [s for s in summarise_settings(runs) if s.n and s.mean is not None]
    private = [s for s in settings if s.private is not False and _finite(s.eps_max)]
    baseline = [s for s in settings if s.private is False]
    if not private and not baseline:
        return None
    only_baselines = not private
    points = private or baseline  # drawn as points with bars
    reference_of = sweep_table.reference_setting(runs, reference)
    # the one pairing rule the tables and CSVs use too
    pairs = [
        p for p in sweep_table.paired_to_reference(runs, reference_of, line) if p.n and p.mean is not None
    ]
    fig, ax, dax = _figure(bool(pairs))
    groups: dict[str | None, list[SettingSummary]] = {}
    for s in points:
        groups.setdefault(_line_value(s, line), []).append(s)
    colors = _line_colors(groups, baseline, line, only_baselines)
    x = _x_axis(runs, points, private, groups, line)
    handles, names, labels = _draw_lines(ax, groups, colors, x, line, only_baselines)
    if not only_baselines:
        more_handles, more_names = _draw_baselines(ax, runs, baseline, colors, line)
        handles += more_handles
        names += more_names
    _label_axes(
        ax,
        dax if dax is not None else ax,
        runs,
        settings,
        points[0].used[0].result,
        x,
        title=title,
        last=last,
        only_baselines=only_baselines,
    )
    notes = _point_notes(settings, x, last)
    paired_labels: list[Label] = []
    if dax is not None:
        note, paired_labels = _paired_panel(
            dax, pairs, points, baseline, line, colors, x.shift, x.xs_of, reference_of, x.categorical
        )
        notes.append(note)
    notes += _sampling_notes(settings)
    if labels:
        notes.append("point labels: " + ", ".join(f"{_short(k)} = {k}" for k in x.label_keys))
    _legend_and_notes(fig, ax, handles, names, notes)
    if x.dodged:  # room at both ends for the shifted marks (once the legends have taken their room)
        _pad_x(fig, ax, list(x.xs_of.values()), max(abs(v) for v in x.shift.values()) + 8.0)
    _place_labels(fig, ax, labels)
    if dax is not None:
        _place_labels(fig, dax, paired_labels)
    return fig


def _pad_x(fig: Any, ax: Any, xs: list[float], points: float) -> None:
    """Widen ``ax``'s x limits so that the marks at ``xs`` (data), shifted up to ``points`` sideways, stay
    inside the axes."""
    fig.canvas.draw()  # the layout, so that the axes' width in pixels is final
    pad = points * fig.dpi / 72.0
    lo, hi = ax.get_xlim()
    inverse = ax.transData.inverted()
    (x0, _), (x1, _) = ax.transData.transform([(lo, 0.0), (hi, 0.0)])
    data = [x for x in xs if math.isfinite(x)]
    if not data:
        return
    first, last = ax.transData.transform([(min(data), 0.0), (max(data), 0.0)])[:, 0]
    new_lo = inverse.transform([(min(x0, first - pad), 0.0)])[0, 0]
    new_hi = inverse.transform([(max(x1, last + pad), 0.0)])[0, 0]
    ax.set_xlim(new_lo, new_hi)


def _accuracy_name(runs: list[SweepRun]) -> str:
    """``token accuracy`` where every run with a directory trained a sequence task (``data.json``'s
    ``target_shape``), else ``accuracy``."""
    shapes = []
    for r in runs:
        try:
            data = json.loads((Path(r.result.get("run_dir") or r.out) / "data.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("target_shape"), list):
            shapes.append(data["target_shape"])
    return "token accuracy" if shapes and all(shapes) else "accuracy"


def _sign_count(p: Any) -> str:
    """``k/n`` for a paired difference: in k of its n seeds the difference has the sign of its mean (where the
    mean is 0, the seeds without a difference)."""
    if p.mean == 0:
        return f"{p.n - p.above - p.below}/{p.n} equal"
    return f"{p.above if p.mean > 0 else p.below}/{p.n}"


#: the paired differences drawn as points, by (line, whether the setting is itself a point of the top panel):
#: each at its x
PairedSeries = dict[tuple[str | None, bool], list[tuple[float, Any]]]


def _paired_series(
    pairs: list[Any],
    drawn: list[SettingSummary],
    xs_of: dict[str, float],
    line: str | None,
    colors: dict[str | None, str],
) -> tuple[PairedSeries, list[tuple[Any, str]]]:
    """Where each paired difference of a ``drawn`` setting goes: a setting drawn as a point at its own x; a
    setting without noise paired with a point at that point's x; one paired with another setting without noise
    nowhere on x, so a horizontal line (returned with its colour), as in the panel above."""
    by_slug = {_slug(s.setting): s for s in drawn}
    series: PairedSeries = {}
    flat: list[tuple[Any, str]] = []
    for p in pairs:
        if _slug(p.setting) not in by_slug:
            continue
        if _slug(p.setting) in xs_of:  # a setting drawn as a point: at its own x
            series.setdefault((_line_value(p.setting, line), True), []).append((xs_of[_slug(p.setting)], p))
        elif _slug(p.reference) in xs_of:  # a baseline against a point: at that point's x
            series.setdefault((_line_value(p.setting, line), False), []).append(
                (xs_of[_slug(p.reference)], p)
            )
        else:  # a baseline against a baseline: a horizontal line, as in the panel above
            flat.append((p, colors.get(_line_value(p.setting, line), "0.2") if line else "0.2"))
    return series, flat


def _draw_paired_points(
    ax: Any,
    series: PairedSeries,
    line: str | None,
    colors: dict[str | None, str],
    shift: dict[str | None, float],
    categorical: bool,
) -> list[Label]:
    """Each series of paired differences: the means with their intervals (filled circles for a setting drawn
    as a point, open diamonds for a setting without noise; joined unless x is categorical) and each seed's
    difference as a faint dot, shifted as the line is in the panel above. Returns the sign counts
    (:func:`_sign_count`) to place beside the points."""
    labels: list[Label] = []
    for (name, own), items in series.items():
        items.sort(key=lambda t: t[0])
        color = colors.get(name, "0.2") if line else ("C0" if own else "0.2")
        moved = _offset(ax, shift.get(name, 0.0))
        xs = np.array([x for x, _ in items])
        ys = np.array([100 * p.mean for _, p in items])
        err = np.array([100 * (p.half or 0.0) for _, p in items])
        ax.errorbar(
            xs,
            ys,
            yerr=err if err.any() else None,
            fmt=("o" if own else "D") + ("" if categorical else "-" if own else "--"),
            mfc=color if own else "white",
            ms=5,
            lw=1.0,
            capsize=3,
            color=color,
            zorder=3,
            transform=moved,
        )
        for p_x, p in items:
            dots = ax.scatter(
                [p_x] * p.n,
                [100 * d for d in p.differences],
                s=10,
                alpha=0.4,
                color=color,
                linewidths=0,
                zorder=2,
            )
            dots.set_offset_transform(moved)
            labels.append((p_x, 100 * p.mean, _sign_count(p), color, shift.get(name, 0.0)))
    return labels


def _draw_paired_lines(ax: Any, flat: list[tuple[Any, str]]) -> None:
    """The differences between two settings without noise: each a dashed horizontal line with its interval as
    a light band, its sign count at the right edge."""
    for p, color in flat:
        y = 100 * p.mean
        ax.axhline(y, ls="--", lw=1.2, color=color, zorder=2)
        if p.half is not None:
            ax.axhspan(y - 100 * p.half, y + 100 * p.half, color=color, alpha=0.08, lw=0, zorder=1)
        ax.annotate(
            _sign_count(p),
            (1.0, y),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            fontsize=7,
            color=color,
        )


def _paired_legend(ax: Any, zero: Any, ref_text: str, against_points: bool) -> None:
    """The lower panel's legend beside it: the reference's zero line, the open diamond where settings without
    noise are paired with points (``against_points``), and what ``k/n`` means."""
    from matplotlib.lines import Line2D

    handles: list[Any] = [zero]
    names = [f"reference: {ref_text} (its difference is 0 by definition)"]
    if against_points:
        handles.append(Line2D([], [], ls="none", marker="D", mfc="white", mec="0.3", color="0.3"))
        names.append("a setting without noise against the reference at that epsilon")
    handles.append(Line2D([], [], ls="none"))
    names.append("k/n beside a point: in k of the n paired seeds the difference has the sign of its mean")
    ax.legend(
        handles,
        [_legend_text(n) for n in names],
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=7.5,
        borderaxespad=0.0,
        handlelength=2.4,
    )


def _paired_note(pairs: list[Any], line: str | None, per_reference: bool) -> str:
    """The note under the figure on the lower panel."""
    seeds = sorted({p.n for p in pairs})
    return (
        "lower panel: setting minus reference, paired by seed"
        + (
            f" (each with the setting of the reference's {line} that shares its other settings)"
            if per_reference
            else ""
        )
        + "; bars: 95% Student t interval over the paired differences"
        + ("" if seeds[-1] > 1 else " (n=1: none)")
        + "; faint dots: the seeds' differences"
    )


def _paired_panel(
    ax: Any,
    pairs: list[Any],
    points: list[SettingSummary],
    baseline: list[SettingSummary],
    line: str | None,
    colors: dict[str | None, str],
    shift: dict[str | None, float],
    xs_of: dict[str, float],
    reference: dict[str, Any] | None,
    categorical: bool,
) -> tuple[str, list[Label]]:
    """The paired differences in ``ax`` (:func:`privacy_utility_figure`'s lower panel); returns its note and the
    sign counts to place beside the points once the figure is laid out."""
    per_reference = line is not None and reference is not None and line in reference
    ref_color = colors.get(_line_value(reference or {}, line), "0.2") if line else "0.2"
    ref_text = (
        f"{line} = {_line_value(reference or {}, line)}, at each point"
        if per_reference
        else _setting_text(reference or {})
    )
    zero = ax.axhline(0.0, color=ref_color, lw=1.6, zorder=2)
    series, flat = _paired_series(pairs, [*points, *baseline], xs_of, line, colors)
    labels = _draw_paired_points(ax, series, line, colors, shift, categorical)
    _draw_paired_lines(ax, flat)
    ax.set_ylabel("paired difference to\nthe reference (points)")
    ax.grid(True, which="both", alpha=0.3)
    _paired_legend(ax, zero, ref_text, any(not own for _, own in series))
    return _paired_note(pairs, line, per_reference), labels


def plot_privacy_utility(
    runs: list[SweepRun],
    path: Path,
    *,
    line: str | None,
    title: str,
    last: int = DEFAULT_LAST,
    reference: str | None = None,
) -> Path | None:
    """``privacy_utility.png`` (:func:`privacy_utility_figure`), the legend outside the axes, the notes under
    them."""
    fig = privacy_utility_figure(runs, line=line, title=title, last=last, reference=reference)
    if fig is None:
        return None
    from fedsim.report.plots import pyplot

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    pyplot().close(fig)
    return path
