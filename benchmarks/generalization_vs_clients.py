"""Reproduction 1: the generalization gap against the number C of training clients, and UAI Theorem 1's bound.

    fedsim sweep generalization-vs-clients --out runs/gvc          # C = 100 ... 10,000, 3 seeds (scenario file)
    python benchmarks/generalization_vs_clients.py runs/gvc        # table, slope with a 95% interval, plot

For each run: C (the training population, which Theorem 1's N is), the final gap in loss (held-out minus
training clients; a non-private diagnostic) and in accuracy, the certified epsilon. The slope of log(mean gap)
against log(C) is fitted by least squares over the settings; its 95% interval comes from a bootstrap that
resamples the seeds of each C (2,000 resamples). The paper's rate is a slope of -1/2 for the bound; the measured
gap may fall faster, slower or not at all, and is reported whatever it is. Theorem 1's bound ``a`` (in
``P(|gap| > a) < b``) at the runs' epsilon is drawn over C, with the population below which it gives no statement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def load(sweep_dir: Path) -> list[dict]:
    runs = []
    for summary_path in sorted(sweep_dir.glob("*/seed*/summary.json")):
        s = json.loads(summary_path.read_text())
        final, diag = s.get("final") or {}, s.get("final_non_private") or {}
        gen = final.get("generalization") or {}
        if s.get("rounds_completed") != s.get("rounds_planned") or final.get("epsilon") is None:
            continue
        runs.append(
            {
                "C": int(gen["population"]),
                "seed": summary_path.parent.name,
                "gap_loss": diag.get("gap_loss"),
                "gap_accuracy": diag.get("gap_accuracy"),
                "epsilon": float(final["epsilon"]),
                "delta": float(s["delta"]),
                "heldout_accuracy": final.get("heldout_accuracy"),
            }
        )
    return runs


def slope(cs: np.ndarray, gaps: np.ndarray) -> float:
    return float(np.polyfit(np.log(cs), np.log(gaps), 1)[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--metric", choices=["gap_loss", "gap_accuracy"], default="gap_loss")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--out", type=Path, default=None, help="plot file (default: SWEEP_DIR/gap_vs_clients.png)")
    args = p.parse_args(argv)

    from fedsim.privacy.paper.generalization import corollary3_curve, generalization_statement
    from fedsim.report.plots import _legend, _save, pyplot

    runs = load(args.sweep_dir)
    if not runs:
        print(f"no finished runs under {args.sweep_dir}", file=sys.stderr)
        return 2
    by_c: dict[int, list[dict]] = {}
    for r in runs:
        by_c.setdefault(r["C"], []).append(r)
    cs = np.array(sorted(by_c))
    print(
        f"{'C':>7} {'seeds':>5} {'gap loss mean':>13} {'sd':>8} {'gap acc mean':>12} {'held-out acc':>12} "
        f"{'epsilon':>8}  Theorem 1 at this epsilon"
    )
    means, eps = [], []
    for c in cs:
        group = by_c[c]
        g = np.array([r[args.metric] for r in group], dtype=float)
        gl = np.array([r["gap_loss"] for r in group], dtype=float)
        ga = np.array([r["gap_accuracy"] for r in group], dtype=float)
        e = float(np.mean([r["epsilon"] for r in group]))
        st = generalization_statement(e, group[0]["delta"], int(c))
        said = f"P(|gap| > {st['a']:.3g}) < {st['b']:.3g}" if st["status"] == "ok" else st["status"]
        means.append(g.mean())
        eps.append(e)
        print(
            f"{c:7d} {len(group):5d} {gl.mean():13.4f} {gl.std(ddof=1) if gl.size > 1 else 0:8.4f} "
            f"{ga.mean():12.4f} {np.mean([r['heldout_accuracy'] for r in group]):12.4f} {e:8.3f}  {said}"
        )
    means = np.asarray(means)
    rng = np.random.default_rng(0)
    fit, lo, hi = math.nan, math.nan, math.nan
    if (means > 0).all() and cs.size >= 2:
        fit = slope(cs, means)
        boots = []
        for _ in range(args.bootstrap):
            m = np.array(
                [rng.choice([r[args.metric] for r in by_c[c]], size=len(by_c[c])).mean() for c in cs]
            )
            if (m > 0).all():
                boots.append(slope(cs, m))
        lo, hi = np.percentile(boots, [2.5, 97.5])
        print(
            f"log-log slope of mean {args.metric} against C: {fit:+.3f}, 95% bootstrap interval "
            f"[{lo:+.3f}, {hi:+.3f}] ({len(boots)} of {args.bootstrap} resamples with every mean gap > 0); "
            "the bound's rate is -0.5"
        )
    else:
        print(f"no log-log slope: a mean {args.metric} is <= 0 ({', '.join(f'{m:.4f}' for m in means)})")

    # Signed gaps throughout: each seed's gap, their mean (the statistic the slope is fitted to and the table
    # prints) and its spread. A seed whose gap is negative stays below zero: the y axis is symmetric-log when
    # there is one (a log axis would have to hide it or draw its magnitude, which is another statistic).
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.2), layout="constrained")
    seeds = [np.array([r[args.metric] for r in by_c[c]], dtype=float) for c in cs]
    for i, (c, g) in enumerate(zip(cs, seeds, strict=True)):
        ax.scatter(
            [c] * g.size, g, s=14, alpha=0.45, color="C0", label="one seed's signed gap" if i == 0 else None
        )
    sd = np.array([g.std(ddof=1) if g.size > 1 else 0.0 for g in seeds])
    ax.errorbar(
        cs,
        means,
        yerr=sd,
        fmt="o-",
        ms=7,
        capsize=3,
        color="C0",
        label=f"mean signed {args.metric} over seeds, bars: +-1 sd over seeds (non-private)",
    )
    if math.isfinite(fit):
        ax.plot(
            cs,
            np.exp(np.polyval(np.polyfit(np.log(cs), np.log(means), 1), np.log(cs))),
            "--",
            color="C0",
            label=f"fit: slope {fit:+.2f} [{lo:+.2f}, {hi:+.2f}]",
        )
    grid = np.unique(np.logspace(np.log10(cs.min()), np.log10(max(cs.max(), 1e6)), 60).astype(int))
    e, d = float(np.mean(eps)), runs[0]["delta"]
    a = np.array([generalization_statement(e, d, int(n)).get("a") or math.nan for n in grid], dtype=float)
    status = [generalization_statement(e, d, int(n))["status"] for n in grid]
    ok = np.array([s == "ok" for s in status])
    if ok.any():
        ax.plot(grid[ok], a[ok], "-", color="C3", label=f"Theorem 1 bound a at epsilon {e:.2f}")
        first = int(grid[ok][0])
        ax.axvline(first, color="C3", ls=":", lw=1)
        ax.axvspan(grid.min(), first, color="C3", alpha=0.07, label=f"no statement below C = {first:,}")
    else:
        ax.axvspan(
            grid.min(),
            grid.max(),
            color="C3",
            alpha=0.07,
            label=f"Theorem 1: no statement at epsilon {e:.2f} for any C up to {grid.max():,}",
        )
    # Corollary 3: the best statement at each C, for a run that spent no more than the smallest admissible epsilon
    best = corollary3_curve(grid, delta=d)
    good = np.array([s == "ok" for s in best["status"]])
    if good.any():
        ax.plot(
            grid[good],
            best["a"][good],
            "-.",
            color="C2",
            label=f"Corollary 3: best bound a at C (needs epsilon <= eps_min(C); from C = {int(grid[good][0]):,})",
        )
    ref = np.abs(means[0]) * np.sqrt(cs[0] / grid)  # through the first mean's magnitude
    ax.plot(grid, ref, ":", color="grey", label="C^-1/2 through the first point")
    ax.set_xscale("log")
    seen = np.concatenate([*seeds, means, ref, a[np.isfinite(a)], best["a"][good]])
    if (seen <= 0).any():
        smallest = np.abs(seen[seen != 0]).min(initial=1.0)
        ax.set_yscale("symlog", linthresh=10 ** math.floor(math.log10(smallest)), linscale=0.5)
        ax.axhline(0.0, color="grey", lw=0.8)
        scale = "symmetric log scale: a negative gap is below 0"
    else:
        ax.set_yscale("log")
        scale = "log scale"
    ax.set_xlabel("training clients C (log scale)")
    ax.set_ylabel(f"signed generalization gap\n({scale})")
    ax.set_title("Generalization gap vs number of clients (DP-FedAvg, Synthetic(1,1))")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    out = args.out or args.sweep_dir / "gap_vs_clients.png"
    _save(fig, out)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
