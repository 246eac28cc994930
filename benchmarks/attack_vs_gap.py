"""Reproduction 2: the UAI paper's Table 1, per round instead of per epoch.

    fedsim sweep attack-vs-gap --out runs/avg             # 4 noise multipliers (scenario file)
    python benchmarks/attack_vs_gap.py runs/avg           # the table

For every run (one per noise multiplier and seed) the rows give, per round, the client-level membership-inference
attack's accuracy (``non_private.attack``: loss threshold, members = training clients, non-members = held-out
clients, balanced) and the generalization gap (held-out loss minus training loss, or with ``--gap accuracy``
training accuracy minus held-out accuracy). Spearman's rank correlation,
with its two-sided p-value (scipy), is computed for (attack accuracy, gap), (attack accuracy, round) and
(gap, round), as the paper's Table 1 does with epochs. ``--attack auc`` uses the attack's AUC instead of its
best-threshold accuracy.

Rounds are not independent samples: every quantity that trends with training correlates with the round and with
every other trending quantity, so the p-values (which assume independent pairs) overstate the evidence.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--attack", choices=["accuracy", "auc", "accuracy_train_mean"], default="accuracy")
    p.add_argument(
        "--gap",
        choices=["loss", "accuracy"],
        default="loss",
        help="the gap in loss (held-out minus training) or in accuracy (training minus held-out)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    args = p.parse_args(argv)
    gap_key = f"gap_{args.gap}"
    table = []
    for metrics in sorted(args.sweep_dir.glob("*/seed*/metrics.jsonl")):
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        pts = [
            (r["round"], r["non_private"]["attack"][args.attack], r["non_private"][gap_key])
            for r in rows
            if (r.get("non_private") or {}).get("attack", {}).get(args.attack) is not None
            and r["non_private"].get(gap_key) is not None
        ]
        if len(pts) < 3:
            continue
        rnd, att, gap = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
        config = (metrics.parent / "config.toml").read_text()
        z = next(
            line.split("=", 1)[1].strip()
            for line in config.splitlines()
            if line.startswith("noise_multiplier")
        )
        entry = {
            "run": str(metrics.parent.relative_to(args.sweep_dir)),
            "noise_multiplier": float(z),
            "epsilon": rows[-1]["epsilon"],
            "rounds": len(pts),
            "attack_first_last": [float(att[0]), float(att[-1])],
            "gap_first_last": [float(gap[0]), float(gap[-1])],
        }
        for name, (x, y) in {
            "attack~gap": (att, gap),
            "attack~round": (att, rnd),
            "gap~round": (gap, rnd),
        }.items():
            res = spearmanr(x, y)
            entry[name] = [float(res.statistic), float(res.pvalue)]
        table.append(entry)
    if not table:
        print(f"no runs with attack rows under {args.sweep_dir}", file=sys.stderr)
        return 2
    table.sort(key=lambda e: e["noise_multiplier"])
    print(
        f"Spearman rank correlation (SCC) and two-sided p-value per run; attack = {args.attack}, gap = held-out "
        "minus training loss, time = round"
    )
    print(
        f"{'z':>5} {'epsilon':>9} {'rounds':>6} | {'attack~gap SCC':>14} {'p':>9} | {'attack~round SCC':>16} "
        f"{'p':>9} | {'gap~round SCC':>13} {'p':>9} | attack first->last, gap first->last"
    )
    for e in table:
        print(
            f"{e['noise_multiplier']:5.2f} {e['epsilon']:9.2f} {e['rounds']:6d} | {e['attack~gap'][0]:14.3f} "
            f"{e['attack~gap'][1]:9.2g} | {e['attack~round'][0]:16.3f} {e['attack~round'][1]:9.2g} | "
            f"{e['gap~round'][0]:13.3f} {e['gap~round'][1]:9.2g} | "
            f"{e['attack_first_last'][0]:.3f}->{e['attack_first_last'][1]:.3f}, "
            f"{e['gap_first_last'][0]:+.3f}->{e['gap_first_last'][1]:+.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
