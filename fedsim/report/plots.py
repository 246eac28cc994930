"""A run directory's ``plots/`` and the overlays of several runs (``fedsim report``), drawn with matplotlib.

Per run, from ``metrics.jsonl``, ``ledger.json`` and ``summary.json`` only (so ``fedsim report`` can redraw them
from any finished or stopped run):

* ``epsilon.png``: epsilon per round for each certified accountant (dp-accounting's PLD and RDP; the run's own from
  its rows, the other from its ledger), with the paper's IGMM bound as printed and the corrected closed form beside
  them, on a log scale where the values span a factor of 4 or more (labelled densely enough to read over less
  than a decade), else a linear one; rounds where a bound is undefined are counted in the legend, and a bound
  undefined at every round is not drawn and the title says so. A run that is not private (noise multiplier 0)
  gets a panel that says its epsilon is infinite at every round;
* ``accuracy.png``: train and held-out accuracy per round and, below, their gap (the training-client accuracy
  and the gap drawn from it are non-private diagnostics: epsilon does not cover them; the legend and the title
  say so); token accuracy for a sequence task (``data.json``'s ``target_shape``), and it says so;
* ``loss.png``: the same for the loss: held-out loss and the training clients' loss (non-private) per round, and
  their gap (held-out minus training; non-private);
* ``perplexity.png`` (sequence tasks with the default cross-entropy): held-out and training-client (non-private)
  perplexity per round;
* ``accuracy_vs_epsilon.png``: held-out accuracy at each evaluated round against the certified epsilon spent by
  then (points labelled with their round where the labels do not overlap); rounds whose epsilon is infinite are
  not drawn, and the plot says how many (all of them, for a run that is not private);
* ``generalization.png``: per round, the bound ``a`` of the statement ``P(|gap| > a) < b`` implied by the certified
  epsilon (UAI Theorem 1), beside the measured gap, and ``b``; rounds without a statement are shaded;
* ``attack.png`` (runs with ``report.membership_attack``): the client-level membership-inference attack's accuracy
  and AUC per round, and its accuracy against the gap in loss, coloured by round (non-private diagnostics);
* ``agnostic.png`` (agnostic FL runs): per round, the mixture weight lambda of each domain and the noised
  per-domain mean losses (clipped to [0, 1]) it is computed from, both releases covered by epsilon, and below
  them the held-out clients' loss per domain at the evaluated rounds (not on the noised losses' axis: those are
  clipped).

Every round axis has integer ticks, every legend sits outside its axes, and a title names the run in full (a
sweep's ``setting/seed<k>`` is wrapped at its commas, never cut). Each ``figure_*`` function returns the
matplotlib figure (for tests and notebooks); ``plot_*`` saves it.

Overlays (several runs): held-out accuracy and certified epsilon per round, one line per run, whose legend entry
gives the run's certified epsilon after its last round (delta, accountant, noise mechanism and sampling) or says it
is not private; a run whose curve is the same as an earlier run's is dashed over it and says so.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim.labels import INFINITE, NON_PRIVATE, REASON_SUFFIX
from fedsim.privacy.accountants import DEFAULT_ACCOUNTANT, counterpart

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: what every row of a run has (``fedsim.loop``): a file without them is not a run's
ROW_KEYS = ("round", "epsilon", "delta", "accountant")
#: row keys that may be null: an infinite epsilon is written as null (with ``epsilon_reason``, see
#: :func:`fedsim.report.rundir.json_safe`) and drawn as a gap in the curve
NULLABLE = frozenset({"epsilon"})
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
    NON_PRIVATE: dict,
}

#: how a plot labels what epsilon does not cover (the rows' ``non_private``)
NON_PRIVATE_LABEL = "non-private diagnostic: epsilon does not cover it"

#: the other certified accountant is computed from the ledger at most at this many rounds (each is a composition)
LEDGER_POINTS = 24


def pyplot():
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
    data = _json_or_none(path / "data.json") or {}
    return {
        "path": path,
        "rows": rows,
        "summary": summary or {},
        "ledger": ledger,
        "name": name,
        "target_shape": data.get("target_shape"),
    }


def is_sequence_task(run: dict[str, Any]) -> bool:
    """Whether a run's targets are sequences (``data.json``'s ``target_shape`` has an axis, or a row reports a
    perplexity): its accuracy is token accuracy."""
    shape = run.get("target_shape")
    if isinstance(shape, list):
        return len(shape) > 0
    return has_perplexity(run)


def has_perplexity(run: dict[str, Any]) -> bool:
    """Whether a row reports a perplexity (a sequence task with the default cross-entropy)."""
    return any(
        isinstance(row.get("heldout_perplexity"), int | float)
        or isinstance((row.get(NON_PRIVATE) or {}).get("train_perplexity"), int | float)
        for row in run["rows"]
    )


def accuracy_name(run: dict[str, Any]) -> str:
    """``token accuracy`` for a sequence task (the share of scored tokens predicted), else ``accuracy``."""
    return "token accuracy" if is_sequence_task(run) else "accuracy"


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
            and not (value is None and (key not in ROW_KEYS or key in NULLABLE))
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


#: the width of every per-run plot (inches): the axes and, to their right, the legend
WIDTH = 9.0
#: the titles' font size, and the width (inches) a title is wrapped to: it is centred on the axes, which leave the
#: legend the right of the figure, so a line this wide stays inside the figure
TITLE_SIZE = 10
TITLE_WIDTH = 6.0
#: legend labels are wrapped to this many characters (the legend sits to the right of the axes)
LEGEND_CHARS = 36


# ----------------------------------------------------------------------------------------------- layout helpers
def not_private_reason(run: dict[str, Any]) -> str | None:
    """Why a run is not private (``"noise_multiplier = 0"`` or ``"clip = 0"``), or None for a private run: its
    ``summary.json`` says ``"private": false``, or every row does."""
    rows = run.get("rows") or []
    flags = [row["private"] for row in rows if isinstance(row.get("private"), bool)]
    if (run.get("summary") or {}).get("private") is False or (flags and not any(flags)):
        clips = [row.get("clip") for row in rows if row.get("clip") is not None]
        return "clip = 0" if clips and not any(clips) else "noise_multiplier = 0"
    return None


def _wrap_name(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a space, a comma or a slash (words, a sweep's
    settings and its seed); a part longer than a line is split, never cut: the lines joined are ``text``."""
    lines, line = [], ""
    for part in re.split(r"(?<=[ ,/])", text):
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        while len(line) + len(part) > width:
            cut = width - len(line)
            lines.append(line + part[:cut])
            line, part = "", part[cut:]
        line += part
    return [*lines, line] if line else lines


def _title(what: str, run: dict[str, Any], *, width: float = TITLE_WIDTH, note: str | None = None) -> str:
    """What the plot shows, then the run's name in full (wrapped to ``width`` inches), then ``note``, then
    whether the run is not private."""
    chars = max(30, int(width * 72 / (TITLE_SIZE * 0.6)))  # characters of a line at TITLE_SIZE
    lines = [*_wrap_name(what, chars), *_wrap_name(f"run: {run.get('name', '')}", chars)]
    if note:
        lines += textwrap.wrap(note, chars, break_on_hyphens=False)
    reason = not_private_reason(run)
    if reason:
        lines.append(f"not private ({reason}): epsilon is infinite at every round")
    return "\n".join(lines)


def _wrap(label: str, width: int = LEGEND_CHARS) -> str:
    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False, break_long_words=False)) or label


def _legend(ax: Axes, **kwargs: Any) -> Any:
    """The axes' legend, outside them on the right (it covers no data), labels wrapped; None when nothing is
    labelled."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    options = {
        "loc": "upper left",
        "bbox_to_anchor": (1.02, 1.0),
        "borderaxespad": 0.0,
        "fontsize": 8,
        "frameon": True,
        **kwargs,
    }
    return ax.legend(handles, [_wrap(s) for s in labels], **options)


def _round_axis(ax: Axes, rounds: np.ndarray, *, label: bool = True) -> None:
    """Integer ticks, and every round of the run in view (also where a curve has fewer points)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    finite = rounds[np.isfinite(rounds)]
    if finite.size:
        ax.set_xlim(finite.min() - 0.5, finite.max() + 0.5)
    if label:
        ax.set_xlabel("round")


def _message(ax: Axes, text: str, *, width: int = 80) -> None:
    """A boxed message in the middle of the axes (where there is nothing to draw, and why)."""
    wrapped = "\n".join(textwrap.fill(p, width, break_on_hyphens=False) for p in text.split("\n"))
    ax.text(
        0.5,
        0.5,
        wrapped,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=9,
        bbox={"facecolor": "white", "alpha": 0.95, "edgecolor": "grey", "boxstyle": "round,pad=0.5"},
    )


def _empty_values(ax: Axes) -> None:
    """No values on the y axis (a panel that only says why there is nothing to draw)."""
    ax.set_yticks([])


#: a log axis only where the largest value is at least this many times the smallest: over less, a linear axis
#: reads better (its ticks are evenly spaced and every one is labelled)
LOG_RATIO = 4.0
#: the multipliers of each power of ten labelled on a log axis, fewest first: the first that labels at least
#: :data:`MIN_LOG_LABELS` values inside the data is used (1, 10, 100 over many decades; 0.4, 0.5, 0.6, 0.8, 1,
#: 1.5, 2 over less than one)
LOG_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0))
MIN_LOG_LABELS = 5


def _positive_span(ax: Axes, which: str) -> tuple[float, float] | None:
    """The smallest and largest finite positive value drawn as lines or points on ``ax`` along ``which``."""
    values = []
    for line in ax.get_lines():
        v = np.asarray(line.get_ydata() if which == "y" else line.get_xdata(), dtype=float)
        values.append(v[np.isfinite(v) & (v > 0)])
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), dtype=float)
        if offsets.ndim == 2 and offsets.shape[0] and offsets.shape[1] == 2:
            v = offsets[:, 1 if which == "y" else 0]
            values.append(v[np.isfinite(v) & (v > 0)])
    allv = np.concatenate(values) if values else np.empty(0)
    return (float(allv.min()), float(allv.max())) if allv.size else None


def value_scale(ax: Axes, which: str = "y") -> bool:
    """Set ``ax``'s ``which`` axis (``"x"`` or ``"y"``) to a log scale where the values drawn span at least
    :data:`LOG_RATIO`, else a linear one, and returns whether it is log. Call :func:`readable_log_ticks` once the
    axis' limits are final."""
    span = _positive_span(ax, which)
    log = span is not None and span[1] >= LOG_RATIO * span[0]
    (ax.set_yscale if which == "y" else ax.set_xscale)("log" if log else "linear")
    return log


def readable_log_ticks(ax: Axes, which: str = "y") -> None:
    """Label a log axis with enough values to read it over any range: 1, 10, 100 over many decades, down to
    0.4, 0.5, 0.6, 0.8, 1, 1.5, 2 over less than one (:data:`LOG_SUBS`), written plainly (``0.5``, ``20``, not
    ``5x10^-1``), the other minor ticks unlabelled. A linear axis is left as it is."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis = ax.yaxis if which == "y" else ax.xaxis
    if axis.get_scale() != "log":
        return
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    span = _positive_span(ax, which) or (lo, hi)
    lo, hi = max(lo, span[0]), min(hi, span[1])  # the data, not the margins, must carry the labels

    def inside(subs: tuple[float, ...]) -> int:
        decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        return sum(1 for d in decades for s in subs if lo * (1 - 1e-9) <= s * 10.0**d <= hi * (1 + 1e-9))

    subs = next((s for s in LOG_SUBS if inside(s) >= MIN_LOG_LABELS), LOG_SUBS[-1])
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=40))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(float(k) for k in range(1, 10)), numticks=40))
    axis.set_minor_formatter(NullFormatter())


#: where a point's label may go, tried in turn: offset (points) and alignment, up-right first
LABEL_PLACES = (
    ((4, 3), "left", "bottom"),
    ((4, -3), "left", "top"),
    ((-4, 3), "right", "bottom"),
    ((-4, -3), "right", "top"),
)


def label_points(
    ax: Axes, xs: Sequence[float], ys: Sequence[float], texts: Sequence[str], **kwargs: Any
) -> list[Any]:
    """Label points with ``texts``, each beside its point (up-right, else down-right, up-left, down-left) where
    it overlaps no label already placed, no other point and not the axes' edge; a point with no such place stays
    unlabelled. The first and the last point are labelled first. ``kwargs`` go to ``annotate`` (font size,
    colour). Call it once the axes are complete: the figure is laid out first, so the labels are placed in the
    pixels it will be saved in; returns the labels kept."""
    fig = ax.figure
    fig.canvas.draw()  # the layout (constrained or tight) and the axes' limits, as they will be saved
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    ok = [i for i in range(len(texts)) if math.isfinite(xs[i]) and math.isfinite(ys[i])]
    pixels = ax.transData.transform(np.column_stack([np.asarray(xs, float)[ok], np.asarray(ys, float)[ok]]))
    r = 3.5 * fig.dpi / 72  # a marker's half-width, in pixels
    order = [*ok[:1], *ok[-1:], *ok[1:-1]] if len(ok) > 1 else ok
    placed: list[Any] = []
    kept = []
    for i in order:
        others = [p for j, p in zip(ok, pixels, strict=True) if j != i]
        for offset, ha, va in LABEL_PLACES:
            note = ax.annotate(
                texts[i],
                (xs[i], ys[i]),
                textcoords="offset points",
                xytext=offset,
                ha=ha,
                va=va,
                **{"fontsize": 7, "color": "0.25", **kwargs},
            )
            note.set_in_layout(False)
            box = note.get_window_extent(renderer)
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            clear = not any(box.overlaps(other) for other in placed) and not any(
                box.x0 - r <= px <= box.x1 + r and box.y0 - r <= py <= box.y1 + r for px, py in others
            )
            if fits and clear:
                placed.append(box)
                kept.append(note)
                break
            note.remove()
    return kept


# ----------------------------------------------------------------------------------------------------- per run
def _plot_certified(ax: Axes, run: dict[str, Any], r: np.ndarray, delta: float, from_ledger: bool) -> bool:
    """The run's own accountant's certified epsilon per round (its legend entry even with no finite value, and
    saying at how many rounds it is infinite), and the other accountant's from ``ledger.json`` where
    ``from_ledger``. Returns whether a curve was drawn."""
    rows = run["rows"]
    own = str(rows[-1].get("accountant", DEFAULT_ACCOUNTANT)) if rows else DEFAULT_ACCOUNTANT
    eps = _column(rows, "epsilon")
    infinite = sum(1 for row in rows if row.get("epsilon" + REASON_SUFFIX) == INFINITE)
    note = (
        f"; infinite (no finite epsilon at this delta) at {infinite} of {len(rows)} rounds, not drawn"
        if infinite
        else ""
    )
    drawn = False
    ok = np.isfinite(eps)
    if ok.any():
        ax.plot(r[ok], eps[ok], "o-", ms=3, lw=2, label=f"{own} (certified, dp-accounting){note}")
        drawn = True
    else:
        ax.plot([], [], "o-", ms=3, lw=2, label=f"{own} (certified, dp-accounting){note or ': no value'}")
    other = counterpart(own)
    eps_other = (
        _ledger_curve(run.get("ledger"), delta, other, r) if from_ledger else np.full(r.size, math.nan)
    )
    ok = np.isfinite(eps_other)
    if ok.any():
        ax.plot(r[ok], eps_other[ok], "s--", ms=3, label=f"{other} (certified, from ledger.json)")
        drawn = True
    return drawn


def _plot_paper_bounds(ax: Axes, rows: list[dict[str, Any]], r: np.ndarray) -> tuple[bool, list[str]]:
    """The IGMM paper's closed-form epsilons per round, each saying at how many rounds it is undefined.
    Returns whether a curve was drawn and the bounds undefined at every round (not drawn, no legend entry:
    the title says why)."""
    drawn = False
    never: list[str] = []
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
            drawn = True
        elif rows:
            never.append(label.split(" (")[0])
    return drawn, never


def _plot_canary_estimates(ax: Axes, rows: list[dict[str, Any]], r: np.ndarray) -> tuple[bool, Any]:
    """``privacy.canaries``' empirical epsilons per round (Andrew et al.'s estimate, Steinke et al.'s lower
    bound), where positive. Returns whether a curve was drawn and what draws the Andrew et al. estimate's
    confidence band once the y axis is set (:func:`_andrew_band`), or None."""
    drawn = False
    band = None
    for key, label, style in (
        ("andrew_epsilon_all_rounds", "Andrew et al. estimate, all rounds (canaries; an estimate)", "^-"),
        ("steinke_epsilon_lower_bound", "Steinke et al. lower bound (canaries; measured)", "v-"),
    ):
        v = _column(rows, key, "empirical_privacy")
        good = np.isfinite(v) & (v > 0)
        if good.any():
            line = ax.plot(r[good], v[good], style, ms=4, lw=1, label=label)[0]
            drawn = True
            if key == "andrew_epsilon_all_rounds":
                band = _andrew_band(ax, rows, r, line.get_color())
    return drawn, band


def figure_epsilon(run: dict[str, Any], from_ledger: bool = True) -> Figure:
    """Client-level epsilon per round: the certified epsilon of the run's accountant and of the other one (from
    ``ledger.json``), the IGMM paper's closed forms, and the canaries' empirical estimates with their limits,
    on a log axis where they span a wide range. A non-private run, or one without a finite epsilon at any
    round, gets a message rather than an empty axis with made-up ticks."""
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    delta = float(rows[-1]["delta"]) if rows else math.nan
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8), layout="constrained")
    ax.set_title(_title("Client-level privacy spent per round", run), fontsize=TITLE_SIZE)
    _round_axis(ax, r)
    ax.grid(True, which="both", alpha=0.3)
    reason = not_private_reason(run)
    if reason:
        ax.set_ylabel("epsilon")
        _empty_values(ax)
        _message(
            ax,
            f"not private ({reason}): epsilon is infinite at every round\n"
            f"(rounds {_span(r)}: the model updates are released without noise, so no accountant and no "
            "paper bound gives a finite epsilon; nothing to draw)",
        )
        return fig
    certified = _plot_certified(ax, run, r, delta, from_ledger)
    paper, never = _plot_paper_bounds(ax, rows, r)
    canaries, band = _plot_canary_estimates(ax, rows, r)
    drawn = _canary_limits(ax, rows, r) or certified or paper or canaries
    if never:
        bounds = " and ".join(never)
        ax.set_title(
            _title(
                "Client-level privacy spent per round",
                run,
                note=f"({bounds}: undefined at every round of this run, so not drawn; the paper's "
                f"closed form{'s do' if len(never) > 1 else ' does'} not apply at these settings)",
            ),
            fontsize=TITLE_SIZE,
        )
    if drawn:
        log = value_scale(ax, "y")
        if band is not None:  # the estimate's confidence band, its low end clipped to the axis
            band()
        readable_log_ticks(ax, "y")
        ax.set_ylabel(f"epsilon at delta = {delta:g}" + (" (log scale)" if log else ""))
    else:  # a log axis with nothing on it would show made-up ticks
        ax.set_ylabel(f"epsilon at delta = {delta:g}")
        _empty_values(ax)
        _message(ax, f"no finite epsilon at delta = {delta:g} at any round ({_span(r)}): nothing to draw")
    _legend(ax)
    return fig


def _andrew_band(ax: Axes, rows: list[dict[str, Any]], r: np.ndarray, color: Any) -> Any:
    """The Andrew et al. estimate's confidence interval (``andrew_epsilon_all_rounds_ci_low/high``) as a band,
    and its resolution at the run's canary count as a dotted line; returns the function that draws the band
    once the log axis is set (a low end of 0 is drawn at the axis' bottom), or None without intervals."""
    emp = [row.get("empirical_privacy") or {} for row in rows]
    conf = next((e["confidence"] for e in emp if "confidence" in e), 0.95)
    res = _column(rows, "andrew_resolution_all_rounds", "empirical_privacy")
    ok = np.isfinite(res) & (res > 0)
    if ok.any():
        ax.plot(
            r[ok],
            res[ok],
            ":",
            color=color,
            lw=1.2,
            label=f"Andrew et al. resolution ({conf:.0%} of estimates from canaries that reveal nothing are below)",
        )
    low = _column(rows, "andrew_epsilon_all_rounds_ci_low", "empirical_privacy")
    high = _column(rows, "andrew_epsilon_all_rounds_ci_high", "empirical_privacy")
    has = np.isfinite(low)
    if not has.any():
        return None

    def draw() -> None:
        bottom, top = ax.get_ylim()
        hi = np.where(np.isfinite(high), high, top)  # no finite upper end: to the top of the axis
        ax.fill_between(
            r[has],
            np.maximum(low[has], bottom),
            hi[has],
            color=color,
            alpha=0.15,
            label=f"Andrew et al. estimate, {conf:.0%} confidence interval",
        )
        ax.set_ylim(bottom, top)

    return draw


def _canary_limits(ax: Axes, rows: list[dict[str, Any]], r: np.ndarray) -> bool:
    """The one-run lower bound's ceiling (``steinke_epsilon_ceiling``) as a dashed line: the largest lower bound
    the run's canaries can give. False when the rows have none."""
    ceil = _column(rows, "steinke_epsilon_ceiling", "empirical_privacy")
    ok = np.isfinite(ceil) & (ceil > 0)
    if not ok.any():
        return False
    emp = next(row["empirical_privacy"] for row, good in zip(rows, ok, strict=True) if good)
    m = int(emp.get("canaries_inserted", 0)) + int(emp.get("canaries_held_out", 0))
    ax.plot(
        r[ok],
        ceil[ok],
        "--",
        color="0.35",
        lw=1.2,
        label=f"Steinke et al. ceiling: the largest lower bound {m} canary directions can give "
        f"({emp.get('confidence', 0.95):.0%})",
    )
    return True


def _span(r: np.ndarray) -> str:
    finite = r[np.isfinite(r)].astype(int)
    if not finite.size:
        return "no rounds"
    return f"round {finite[0]}" if finite.size == 1 else f"{finite.min()} to {finite.max()}"


def _per_round_with_gap(
    run: dict[str, Any],
    *,
    what: str,
    note: str,
    held_key: str,
    train_key: str,
    gap_key: str,
    ylabel: str,
    gap_label: str,
    gap_ylabel: str,
    scale: float,
) -> Figure:
    """A held-out and a training-client curve per round and, below, their gap (training-client values and the gap
    are non-private, and say so)."""
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(WIDTH, 6.2), sharex=True, height_ratios=[2, 1], layout="constrained"
    )
    held = _column(rows, held_key)
    train = _column(rows, train_key, NON_PRIVATE)
    gap = _column(rows, gap_key, NON_PRIVATE)
    for values, label, style in (
        (train, f"training clients ({NON_PRIVATE_LABEL})", "o-"),
        (held, "held-out clients (never trained on)", "s-"),
    ):
        good = np.isfinite(values)
        if good.any():
            top.plot(r[good], scale * values[good], style, ms=3, label=label)
    top.set_ylabel(ylabel)
    top.set_title(_title(what, run, note=note), fontsize=TITLE_SIZE)
    top.grid(True, alpha=0.3)
    if not top.get_legend_handles_labels()[0]:
        _message(top, "no evaluated round in these rows: nothing to draw")
    _legend(top)
    good = np.isfinite(gap)
    bottom.axhline(0.0, color="grey", lw=0.8)
    if good.any():
        bottom.plot(
            r[good], scale * gap[good], "d-", ms=3, color="C3", label=f"{gap_label} ({NON_PRIVATE_LABEL})"
        )
    _legend(bottom)
    _round_axis(top, r, label=False)
    _round_axis(bottom, r)
    bottom.set_ylabel(gap_ylabel)
    bottom.grid(True, alpha=0.3)
    return fig


def figure_accuracy(run: dict[str, Any]) -> Figure:
    """Accuracy per round (token accuracy for a sequence task: the share of its scored tokens predicted, each
    client's averaged over clients) and the gap."""
    name = accuracy_name(run)
    return _per_round_with_gap(
        run,
        what=f"Client-level {name} per round and the generalization gap",
        note=f"(training-client {name} and the gap: non-private, not covered by epsilon)",
        held_key="heldout_accuracy",
        train_key="train_accuracy",
        gap_key="gap_accuracy",
        ylabel=f"client-level {name} (%)",
        gap_label="gap = train - held-out",
        gap_ylabel="gap (accuracy points,\nnon-private)",
        scale=100.0,
    )


def figure_perplexity(run: dict[str, Any]) -> Figure:
    """Perplexity per round of a sequence task: ``exp`` of the mean over clients of their per-token negative
    log-likelihood (:func:`fedsim.training.evaluation.client_means`), held-out clients and training clients
    (non-private), on a log axis where it spans a factor of :data:`LOG_RATIO` or more (a diverging run reaches
    thousands)."""
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8), layout="constrained")
    ax.set_title(
        _title(
            "Client-level perplexity per round",
            run,
            note="(exp of the mean over clients of their per-token negative log-likelihood; lower is better; "
            "training-client perplexity: non-private, not covered by epsilon)",
        ),
        fontsize=TITLE_SIZE,
    )
    for values, label, style in (
        (_column(rows, "train_perplexity", NON_PRIVATE), f"training clients ({NON_PRIVATE_LABEL})", "o-"),
        (_column(rows, "heldout_perplexity"), "held-out clients (never trained on)", "s-"),
    ):
        good = np.isfinite(values)
        if good.any():
            ax.plot(r[good], values[good], style, ms=3, label=label)
    _round_axis(ax, r)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_lines():
        log = value_scale(ax, "y")
        readable_log_ticks(ax, "y")
        ax.set_ylabel("perplexity" + (" (log scale)" if log else ""))
    else:
        ax.set_ylabel("perplexity")
        _empty_values(ax)
        _message(ax, "no evaluated round reports a perplexity: nothing to draw")
    _legend(ax)
    return fig


def figure_loss(run: dict[str, Any]) -> Figure:
    return _per_round_with_gap(
        run,
        what="Client-level loss per round and the generalization gap",
        note="(training-client loss and the gap: non-private, not covered by epsilon)",
        held_key="heldout_loss",
        train_key="train_loss",
        gap_key="gap_loss",
        ylabel="client-level loss",
        gap_label="gap = held-out - train",
        gap_ylabel="gap (loss,\nnon-private)",
        scale=1.0,
    )


def figure_accuracy_vs_epsilon(run: dict[str, Any]) -> Figure:
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    eps = _column(rows, "epsilon")
    acc = _column(rows, "heldout_accuracy")
    delta = float(rows[-1]["delta"]) if rows else math.nan
    own = str(rows[-1].get("accountant", DEFAULT_ACCOUNTANT)) if rows else DEFAULT_ACCOUNTANT
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8), layout="constrained")
    what = f"Held-out {accuracy_name(run)} against the privacy spent"
    ax.set_ylabel(f"held-out client-level {accuracy_name(run)} (%)")
    ax.set_xlabel(f"certified epsilon at delta = {delta:g} ({own})")
    ax.grid(True, which="both", alpha=0.3)
    evaluated = np.isfinite(acc)
    ok = evaluated & np.isfinite(eps)
    skipped = int((evaluated & ~np.isfinite(eps)).sum())
    reason = not_private_reason(run)
    if reason or not ok.any():
        last = np.flatnonzero(evaluated)
        final = (
            f"held-out {accuracy_name(run)} {100 * acc[last[-1]]:.1f}% after round {int(r[last[-1]])}"
            if last.size
            else "no evaluated round"
        )
        why = (
            f"not private ({reason}): epsilon is infinite at every round"
            if reason
            else f"no evaluated round has a finite epsilon ({skipped} with an infinite one)"
            if skipped
            else "no evaluated round"
        )
        ax.set_title(_title(what, run), fontsize=TITLE_SIZE)
        _empty_values(ax)
        ax.set_xticks([])
        _message(
            ax,
            f"{why},\nso there is no point to draw: accuracy is never drawn at an infinite epsilon\n"
            f"({final}; per round: accuracy.png)",
        )
        return fig
    ax.set_title(_title(what, run, note="(numbers: the round of each point)"), fontsize=TITLE_SIZE)
    ax.plot(eps[ok], 100 * acc[ok], "o-", ms=4, color="C1", label="held-out clients (never trained on)")
    if skipped:
        ax.plot(
            [],
            [],
            " ",
            label=f"{skipped} evaluated round(s) with an infinite epsilon: not drawn (no point at infinity)",
        )
    finite = eps[ok]
    if finite.min() > 0 and finite.max() > 10 * finite.min():
        ax.set_xscale("log")
        readable_log_ticks(ax, "x")
    _legend(ax)
    label_points(ax, list(eps[ok]), list(100 * acc[ok]), [str(int(t)) for t in r[ok]])
    return fig


def figure_generalization(run: dict[str, Any]) -> Figure:
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    a = _column(rows, "a", "generalization")
    b = _column(rows, "b", "generalization")
    status = [str((row.get("generalization") or {}).get("status", "n/a")) for row in rows]
    gap = np.abs(_column(rows, "gap_loss", NON_PRIVATE))
    population = (rows[-1].get("generalization") or {}).get("population") if rows else None
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(WIDTH, 6.2), sharex=True, height_ratios=[2, 1], layout="constrained"
    )
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
        reason = not_private_reason(run)
        last = rows[-1].get("generalization") or {}
        n_min, eps = last.get("n_min"), rows[-1].get("epsilon")
        if reason:
            said = (
                f"not private ({reason}): epsilon is infinite at every round, so Theorem 1 gives no statement"
            )
        elif eps is None:
            said = "no statement at any round:\nthe final epsilon is infinite, so Theorem 1 gives none"
        else:
            need = (
                f"needs at least {n_min:,} clients"
                if isinstance(n_min, int)
                else "gives no statement for any number of clients"
            )
            said = (
                f"no statement at any round:\nat the final epsilon {float(eps):.3g}, Theorem 1 {need}\n"
                f"(this run has {population} training clients)"
            )
        _message(bottom, said)
    top.set_ylabel("generalization gap (loss)")
    top.set_title(
        _title(f"Generalization implied by privacy ({population} training clients)", run), fontsize=TITLE_SIZE
    )
    top.grid(True, alpha=0.3)
    _legend(top)
    if np.isfinite(b).any():
        bottom.plot(r[np.isfinite(b)], b[np.isfinite(b)], "d-", ms=3, color="C2", label="probability b")
        _legend(bottom)
    bottom.set_ylim(0.0, 1.0)
    bottom.set_ylabel("b (probability)")
    _round_axis(top, r, label=False)
    _round_axis(bottom, r)
    bottom.grid(True, alpha=0.3)
    return fig


def has_attack(run: dict[str, Any]) -> bool:
    return any(_attack(row).get("accuracy") is not None for row in run["rows"])


def _attack(row: dict[str, Any]) -> dict[str, Any]:
    value = (row.get(NON_PRIVATE) or {}).get("attack")
    return value if isinstance(value, dict) else {}


def figure_attack(run: dict[str, Any]) -> Figure:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    column = {
        key: np.asarray([math.nan if _attack(x).get(key) is None else float(_attack(x)[key]) for x in rows])
        for key in ("accuracy", "accuracy_train_mean", "auc")
    }
    pairs = max((int(_attack(x).get("pairs") or 0) for x in rows), default=0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH, 7.5), layout="constrained")
    top.set_title(
        _title(
            "Client-level membership inference (loss-threshold attack)",
            run,
            note=f"(members: training clients, non-members: held-out clients, {pairs} of each; the attack reads "
            "training clients' losses: a non-private diagnostic, not covered by epsilon)",
        ),
        fontsize=TITLE_SIZE,
    )
    top.axhline(0.5, color="grey", lw=0.8, ls="--", label="chance (0.5)")
    for key, label, style in (
        ("accuracy", "attack accuracy, best threshold (an upper figure)", "o-"),
        ("accuracy_train_mean", "attack accuracy, threshold = mean training loss (Yeom et al.)", "s-"),
        ("auc", "attack AUC", "d-"),
    ):
        good = np.isfinite(column[key])
        if good.any():
            top.plot(r[good], column[key][good], style, ms=3, label=f"{label} ({NON_PRIVATE_LABEL})")
    top.set_ylabel("attack accuracy / AUC")
    top.grid(True, alpha=0.3)
    _round_axis(top, r)
    _legend(top)
    gap = _column(rows, "gap_loss", NON_PRIVATE)
    acc = column["accuracy"]
    ok = np.isfinite(gap) & np.isfinite(acc)
    if ok.any():
        points = bottom.scatter(gap[ok], acc[ok], c=r[ok], cmap="viridis", s=22, zorder=3)
        # beside the axes, in the room the legend above leaves (a colorbar laid out by the figure would go
        # right of that legend)
        bar = fig.colorbar(points, cax=bottom.inset_axes((1.02, 0.0, 0.025, 1.0)))
        bar.set_label("round")
        bar.locator = MaxNLocator(integer=True)
        bar.update_ticks()
        what = "attack accuracy against the gap, one point per round"
        if ok.sum() >= 3:
            from scipy.stats import spearmanr

            rho = spearmanr(gap[ok], acc[ok]).statistic
            if math.isfinite(rho):
                what += f" (Spearman rank correlation {rho:+.2f})"
        bottom.set_title(what, fontsize=9)
    else:
        _message(bottom, "no round with both the attack and the gap in loss: nothing to draw")
    bottom.axhline(0.5, color="grey", lw=0.8, ls="--")
    bottom.set_xlabel("generalization gap in loss (held-out - train; non-private)")
    bottom.set_ylabel("attack accuracy\n(best threshold, non-private)")
    bottom.grid(True, alpha=0.3)
    return fig


def has_agnostic(run: dict[str, Any]) -> bool:
    return any(isinstance(row.get("lambda_used"), list) for row in run["rows"])


def figure_agnostic(run: dict[str, Any]) -> Figure:
    plt = pyplot()
    rows = run["rows"]
    r = _column(rows, "round")
    domains = max((len(row.get("lambda_used") or []) for row in rows), default=0)

    def per_domain(key: str, field: str | None = None) -> np.ndarray:
        out = np.full((len(rows), domains), math.nan)
        for i, row in enumerate(rows):
            for d, v in enumerate((row.get(key) or [])[:domains]):
                v = v.get(field) if field and isinstance(v, dict) else v
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out[i, d] = float(v)
        return out

    sizes: dict[int, int] = {}
    for row in reversed(rows):  # domain sizes are public (the threat model): training plus held-out clients
        train = (row.get(NON_PRIVATE) or {}).get("domains_train") or []
        held = row.get("domains_heldout") or []
        if train or held:
            for d in range(domains):
                n = sum(int((x[d] or {}).get("clients") or 0) for x in (train, held) if len(x) > d)
                if n:
                    sizes[d] = n
            break
    lam = per_domain("lambda_used")
    noised = per_domain("domain_loss_noised")
    held = per_domain("domains_heldout", "loss")
    panels = 3 if np.isfinite(held).any() else 2
    fig, axes = plt.subplots(
        panels, 1, figsize=(WIDTH, 2.6 * panels + 1.2), sharex=True, layout="constrained"
    )
    top, middle = axes[0], axes[1]
    top.set_title(
        _title(
            "Agnostic FL: the domain mixture lambda and the per-domain losses per round",
            run,
            note="(lambda is computed from the noised domain losses: both are releases covered by epsilon)",
        ),
        fontsize=TITLE_SIZE,
    )
    for d in range(domains):
        color, size = f"C{d}", (f" ({sizes[d]:,} clients)" if d in sizes else "")
        good = np.isfinite(lam[:, d])
        top.plot(r[good], lam[good, d], "o-", ms=3, color=color, lw=1.8, label=f"domain {d}{size}")
        good = np.isfinite(noised[:, d])
        middle.plot(r[good], noised[good, d], "o-", ms=3, color=color, lw=1.2, label=f"domain {d}")
        if panels == 3:
            good = np.isfinite(held[:, d])
            axes[2].plot(r[good], held[good, d], "s--", ms=5, color=color, label=f"domain {d}")
    top.set_ylabel("mixture weight lambda\n(used in the round)")
    top.set_ylim(0.0, 1.0)
    middle.set_ylabel("noised mean client loss\n(each clipped to [0, 1])")
    _legend(top, title="domain (all clients)", title_fontsize=8)
    _legend(middle, title="released each round,\ncovered by epsilon", title_fontsize=8)
    if panels == 3:
        axes[2].set_ylabel("held-out clients' loss")
        _legend(axes[2], title="evaluated rounds\n(held-out clients)", title_fontsize=8)
    for i, ax in enumerate(axes):
        ax.grid(True, alpha=0.3)
        _round_axis(ax, r, label=i == panels - 1)
    return fig


def plot_epsilon(run: dict[str, Any], path: Path, from_ledger: bool = True) -> Path:
    return _save(figure_epsilon(run, from_ledger), path)


def plot_accuracy(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_accuracy(run), path)


def plot_loss(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_loss(run), path)


def plot_perplexity(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_perplexity(run), path)


def plot_accuracy_vs_epsilon(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_accuracy_vs_epsilon(run), path)


def plot_generalization(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_generalization(run), path)


def plot_attack(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_attack(run), path)


def plot_agnostic(run: dict[str, Any], path: Path) -> Path:
    return _save(figure_agnostic(run), path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if (
        fig.get_layout_engine() is None
    ):  # the per-run figures use constrained layout (legends outside the axes)
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def run_plots(run_dir: str | Path, *, from_ledger: bool = True) -> list[Path]:
    """(Re)draw ``RUN_DIR/plots/*.png``; returns the files written. ``from_ledger``: also the other certified
    accountant's curve, recomputed from ``ledger.json`` at up to :data:`LEDGER_POINTS` rounds (seconds: a run
    draws its plots without it, ``fedsim report`` with it)."""
    run = read_run(run_dir)
    out = run["path"] / "plots"
    if not run["rows"]:
        return []
    written = [
        plot_epsilon(run, out / "epsilon.png", from_ledger),
        plot_accuracy(run, out / "accuracy.png"),
        plot_loss(run, out / "loss.png"),
        *([plot_perplexity(run, out / "perplexity.png")] if has_perplexity(run) else []),
        plot_accuracy_vs_epsilon(run, out / "accuracy_vs_epsilon.png"),
        plot_generalization(run, out / "generalization.png"),
    ]
    if has_attack(run):
        written.append(plot_attack(run, out / "attack.png"))
    if has_agnostic(run):
        written.append(plot_agnostic(run, out / "agnostic.png"))
    return written


#: the overlays: the row key drawn, the y label, the file and the scale
OVERLAYS = (
    ("heldout_accuracy", "held-out client-level accuracy (%)", "overlay_accuracy.png", 100.0),
    ("epsilon", "certified epsilon", "overlay_epsilon.png", 1.0),
)
#: an overlay's runs differ in colour and marker; a run whose curve is the same as an earlier one's is dashed over
#: it, the earlier one widened, so that neither hides the other
OVERLAY_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def _run_privacy(run: dict[str, Any]) -> dict[str, Any]:
    """``privacy.sampling`` and ``privacy.mechanism`` of a run's ``config.toml`` (empty if it cannot be read)."""
    import tomllib

    try:
        privacy = tomllib.loads((run["path"] / "config.toml").read_text()).get("privacy")
    except (OSError, ValueError):
        return {}
    return privacy if isinstance(privacy, dict) else {}


def overlay_label(run: dict[str, Any], name: str) -> str:
    """A run's legend entry in an overlay: its name, then ``not private (<why>)``, or its certified epsilon after
    its last round (with delta and the accountant), then its noise mechanism and sampling where its
    ``config.toml`` says them."""
    rows = run["rows"]
    last = rows[-1] if rows else {}
    privacy = _run_privacy(run)
    reason = not_private_reason(run)
    setting = [f"{privacy['sampling']} sampling"] if isinstance(privacy.get("sampling"), str) else []
    if reason:
        return ", ".join([f"{name}: not private ({reason})", *setting])
    eps = last.get("epsilon")
    if isinstance(eps, int | float) and not isinstance(eps, bool) and math.isfinite(eps):
        eps_text = f"epsilon {eps:.3g}"
    elif (isinstance(eps, float) and math.isinf(eps)) or last.get("epsilon" + REASON_SUFFIX) == INFINITE:
        eps_text = "epsilon infinite (no finite value at this delta)"
    else:
        eps_text = "epsilon n/a"
    if "delta" in last and "round" in last:
        eps_text += f" after round {last['round']} (delta {last['delta']:g}, {last.get('accountant', '?')})"
    if privacy:
        mechanism = privacy.get("mechanism")  # a name, or a [privacy.mechanism] table with its options
        name_of = mechanism.get("name") if isinstance(mechanism, dict) else mechanism
        setting.insert(0, f"{name_of or 'independent'} noise")
    elif isinstance((run.get("summary") or {}).get("noise_mechanism"), str):  # no config.toml: its summary
        setting.insert(0, run["summary"]["noise_mechanism"].split(";")[0].split(",")[0])
    return ", ".join([f"{name}: {eps_text}", *setting])


def figure_overlay(runs: Sequence[dict[str, Any]], key: str, names: Sequence[str] | None = None) -> Figure:
    """One overlay (``key``: ``heldout_accuracy`` or ``epsilon``) of several runs (:func:`read_run`'s), one line
    per run, each labelled by :func:`overlay_label`: a run that is not private says so (on the epsilon overlay it
    has no curve)."""
    plt = pyplot()
    ylabel, scale = {k: (y, s) for k, y, _, s in OVERLAYS}[key]
    names = list(names) if names is not None else _labels([run["path"] for run in runs])
    sequence = [is_sequence_task(run) for run in runs]
    if key == "heldout_accuracy" and all(sequence):
        ylabel = "held-out client-level token accuracy (%)"
    elif key == "heldout_accuracy" and any(sequence):
        ylabel = "held-out client-level accuracy (%)\n(token accuracy for the runs marked so)"
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8), layout="constrained")
    drawn = False
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        v = scale * _column(run["rows"], key)
        good = np.isfinite(v)
        label = overlay_label(run, name)
        if key == "heldout_accuracy" and sequence[i] and not all(sequence):
            label += " (token accuracy)"
        if good.any():
            x = _column(run["rows"], "round")[good]
            same = [
                other
                for other, (ox, oy) in curves.items()
                if ox.shape == x.shape
                and np.array_equal(ox, x)
                and np.allclose(oy, v[good], rtol=1e-9, atol=0)
            ]
            if same:  # dashed over the earlier one, which is widened: both show, and the label says so
                label += f" (the same curve as {', '.join(same)})"
                for line in ax.get_lines():
                    if line.get_gid() in same:
                        line.set_linewidth(4.0)
            curves[name] = (x, v[good])
            ax.plot(
                x,
                v[good],
                ls="--" if same else "-",
                marker=OVERLAY_MARKERS[i % len(OVERLAY_MARKERS)],
                ms=3.5,
                lw=1.6,
                color=f"C{i % 10}",
                label=label,
                zorder=2 + i,
                gid=name,
            )
            drawn = True
        elif key == "epsilon":
            reason = not_private_reason(run)
            why = f"not private ({reason})" if reason else "no finite value"
            # no mark in the legend for a curve that is not drawn: only the words
            ax.plot([], [], ls="none", label=f"{name}: {why}, epsilon infinite, not drawn")
        else:
            ax.plot([], [], ls="none", label=f"{label}; no held-out accuracy, not drawn")
    _round_axis(ax, np.concatenate([_column(run["rows"], "round") for run in runs] or [np.array([])]))
    if key == "epsilon" and drawn:
        if value_scale(ax, "y"):
            readable_log_ticks(ax, "y")
            ylabel += " (log scale)"
    elif not drawn:
        _empty_values(ax)
        _message(ax, f"no run has a finite {ylabel.split(' (')[0]}: nothing to draw")
    ax.set_ylabel(ylabel)
    ax.set_title(
        "\n".join(_wrap_name(f"{len(runs)} runs: {ylabel.split(' (')[0]} per round", 100)),
        fontsize=TITLE_SIZE,
    )
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, fontsize=7)
    return fig


def overlay(run_dirs: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Held-out accuracy and certified epsilon per round of several runs, one line per run, each labelled with its
    certified epsilon or ``not private`` (:func:`overlay_label`; a run that is not private has no epsilon curve)."""
    runs = [read_run(d) for d in run_dirs]
    names = _labels([run["path"] for run in runs])
    return [_save(figure_overlay(runs, key, names), Path(out_dir) / fname) for key, _, fname, _ in OVERLAYS]


def _labels(paths: list[Path]) -> list[str]:
    """Short distinct labels: the last path parts that tell the runs apart."""
    for depth in range(1, 4):
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]
