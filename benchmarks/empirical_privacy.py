"""Empirical privacy against the certified epsilon: the table and the plot of ``fedsim sweep empirical-privacy``.

For each noise multiplier of the sweep: the certified epsilon (dp-accounting, PLD), the IGMM bound as printed
(UAI Theorem 7; ``undefined`` where it makes no statement), Andrew et al.'s epsilon estimate from the canaries
(all-rounds and final-model statistics) and Steinke et al.'s one-run lower bound at 95% confidence, each the mean
over the seeds with its range; beside them what the canary count lets them say: the estimate's 95% confidence
interval (the mean over the seeds of each run's interval ends) and its resolution (the estimate that canaries
revealing nothing exceed 5% of the time), and the lower bound's ceiling (the largest it can be with this many
canaries, every guess right); then the canaries' cost to the model: held-out accuracy (mean of the last ``--last``
evaluated rounds) with and without canaries, paired by seed.

    fedsim sweep empirical-privacy --out runs/ep
    python benchmarks/empirical_privacy.py runs/ep --plot docs/img/empirical-privacy.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np


def _runs(root: Path) -> list[dict[str, Any]]:
    out = []
    for summary_path in sorted(root.glob("**/summary.json")):
        run = summary_path.parent
        config = tomllib.loads((run / "config.toml").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out.append(
            {
                "z": float(config["privacy"]["noise_multiplier"]),
                "canaries": int(config["privacy"].get("canaries", 0)),
                "seed": int(config.get("seed", 0)),
                "summary": json.loads(summary_path.read_text()),
                "rows": rows,
            }
        )
    return out


def _last_accuracy(rows: list[dict[str, Any]], last: int) -> float:
    acc = [r["heldout_accuracy"] for r in rows if r.get("heldout_accuracy") is not None]
    return float(np.mean(acc[-last:])) if acc else math.nan


def _inf(emp: dict[str, Any], key: str) -> float | None:
    """An interval's high end: None in the row means no finite epsilon bounds it (infinity), unless absent."""
    if key not in emp:
        return None
    v = emp[key]
    return math.inf if v is None else v


def _count(emp: dict[str, Any]) -> float | None:
    if "canaries_inserted" not in emp:
        return None
    return float(emp["canaries_inserted"] + emp["canaries_held_out"])


def _stat(values: list[float | None]) -> tuple[float, float, float]:
    v = np.array([math.nan if x is None else float(x) for x in values], dtype=float)
    if not np.isfinite(v).any():
        return math.nan, math.nan, math.nan
    return float(np.nanmean(v)), float(np.nanmin(v)), float(np.nanmax(v))


def _fmt(stat: tuple[float, float, float]) -> str:
    mean, lo, hi = stat
    if not math.isfinite(mean):
        return "undefined"
    return f"{mean:.3g} [{lo:.3g}, {hi:.3g}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir")
    p.add_argument("--last", type=int, default=2, help="evaluated rounds averaged for held-out accuracy")
    p.add_argument("--plot", default=None, help="write the plot here (PNG)")
    args = p.parse_args(argv)
    runs = _runs(Path(args.sweep_dir))
    if not runs:
        print(f"no runs under {args.sweep_dir}", file=sys.stderr)
        return 2
    zs = sorted({r["z"] for r in runs})
    table = []
    print(
        "noise multiplier | canaries inserted + held out | certified epsilon | IGMM as printed | Andrew et al. "
        "estimate, all rounds [its 95% CI] (resolution) | final model | Steinke et al. lower bound (95%) | its "
        "ceiling | held-out acc, no canaries | with canaries"
    )
    for z in zs:
        with_c = [r for r in runs if r["z"] == z and r["canaries"] > 0]
        without = {r["seed"]: r for r in runs if r["z"] == z and r["canaries"] == 0}
        final = [r["summary"]["final"] for r in with_c]
        emp = [r["summary"].get("empirical_privacy") or {} for r in with_c]
        row = {
            "z": z,
            "certified": _stat([f.get("epsilon") for f in final]),
            "igmm": _stat([f.get("paper_epsilon_igmm") for f in final]),
            "andrew_all": _stat([e.get("andrew_epsilon_all_rounds") for e in emp]),
            "andrew_final": _stat([e.get("andrew_epsilon_final") for e in emp]),
            "steinke": _stat([e.get("steinke_epsilon_lower_bound") for e in emp]),
            "ceiling": _stat([e.get("steinke_epsilon_ceiling") for e in emp]),
            "ci_low": _stat([e.get("andrew_epsilon_all_rounds_ci_low") for e in emp]),
            "ci_high": _stat([_inf(e, "andrew_epsilon_all_rounds_ci_high") for e in emp]),
            "resolution": _stat([e.get("andrew_resolution_all_rounds") for e in emp]),
            "canaries": _stat([_count(e) for e in emp]),
            "acc_without": _stat([_last_accuracy(r["rows"], args.last) for r in without.values()]),
            "acc_with": _stat([_last_accuracy(r["rows"], args.last) for r in with_c]),
            "acc_diff": _stat(
                [
                    _last_accuracy(r["rows"], args.last)
                    - _last_accuracy(without[r["seed"]]["rows"], args.last)
                    for r in with_c
                    if r["seed"] in without
                ]
            ),
            "seeds": len(with_c),
        }
        table.append(row)
        print(
            f"{z:g} | {row['canaries'][0]:.0f} | {_fmt(row['certified'])} | {_fmt(row['igmm'])} | "
            f"{_fmt(row['andrew_all'])} [{row['ci_low'][0]:.3g}, {row['ci_high'][0]:.3g}] "
            f"({row['resolution'][0]:.3g}) | {_fmt(row['andrew_final'])} | {_fmt(row['steinke'])} | "
            f"{row['ceiling'][0]:.3g} | {_fmt(row['acc_without'])} | "
            f"{_fmt(row['acc_with'])} (paired difference {_fmt(row['acc_diff'])})"
        )
    print(f"means over {max(r['seeds'] for r in table)} seeds, [min, max] over the seeds")
    if args.plot:
        from matplotlib.ticker import NullLocator

        from fedsim.report.plots import pyplot

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(8, 7), layout="constrained")
        # the smallest positive value drawn: an interval whose low end is 0 is drawn down to half of it
        positive = [r[k][0] for r in table for k in ("andrew_all", "andrew_final", "steinke") if r[k][0] > 0]
        floor = 0.5 * min(positive) if positive else 1e-3
        x = np.array(zs)
        for key, label, style in (
            ("certified", "certified epsilon (dp-accounting, PLD)", "o-"),
            ("igmm", "IGMM Theorem 7 as printed (not a certificate)", "s-."),
            ("andrew_all", "Andrew et al. estimate, all rounds (canaries)", "^--"),
            ("andrew_final", "Andrew et al. estimate, final model (canaries)", "^:"),
            ("steinke", "Steinke et al. lower bound, 95% (canaries)", "v-"),
        ):
            mean = np.array([r[key][0] for r in table])
            lo = np.array([r[key][1] for r in table])
            hi = np.array([r[key][2] for r in table])
            ok = np.isfinite(mean) & (mean > 0)
            if not ok.any():
                ax.plot([], [], style, label=f"{label}: undefined (or 0) at every noise multiplier")
                continue
            line = ax.plot(x[ok], mean[ok], style, label=label)[0]
            ax.fill_between(x[ok], lo[ok], hi[ok], color=line.get_color(), alpha=0.15)
            if key == "andrew_all":  # each run's 95% CI (mean of its ends over the seeds) and the resolution
                ci_lo = np.array([r["ci_low"][0] for r in table])
                ci_hi = np.array([r["ci_high"][0] for r in table])
                has = ok & np.isfinite(ci_lo) & np.isfinite(ci_hi)
                bottom = np.maximum(ci_lo[has], floor)
                ax.errorbar(
                    x[has],
                    mean[has],
                    yerr=[mean[has] - bottom, ci_hi[has] - mean[has]],
                    fmt="none",
                    ecolor=line.get_color(),
                    capsize=4,
                    lw=1,
                    label="Andrew et al. estimate: 95% confidence interval (mean of each run's ends)",
                )
                res = np.array([r["resolution"][0] for r in table])
                good = np.isfinite(res) & (res > 0)
                ax.plot(
                    x[good],
                    res[good],
                    ":",
                    color=line.get_color(),
                    lw=1.5,
                    label="Andrew et al. resolution: estimates below it cannot be told from no privacy loss",
                )
        ceiling = np.array([r["ceiling"][0] for r in table])
        good = np.isfinite(ceiling) & (ceiling > 0)
        if good.any():
            m = np.array([r["canaries"][0] for r in table])[good]
            ax.plot(
                x[good],
                ceiling[good],
                "k--",
                lw=1.2,
                label=f"Steinke et al. ceiling, 95%: the largest lower bound {m.mean():.0f} canary directions can give",
            )
        ax.set_xscale("log")
        ax.set_xticks(zs, [f"{z:g}" for z in zs])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("noise multiplier z")
        delta = table and runs[0]["summary"].get("delta")
        ax.set_ylabel(f"epsilon at delta = {delta:g} (log scale)")
        ax.set_title(
            "Empirical privacy from canary clients against the certified epsilon\n"
            "(scenario empirical-privacy; mean over seeds, band: min to max; lower bounds of 0 not drawn;\n"
            "bars: the estimate's 95% confidence interval, a low end of 0 drawn at the bottom)",
            fontsize=10,
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=1)
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
