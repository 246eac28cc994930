"""Evaluation that scales: what an evaluated round costs against a plain one, with and without
``engine.eval_clients``, as the population grows.

Workload: Synthetic(1, 1) clients generated on demand (``data.dataset = "synthetic"``, 10% held out), an MLP with
one hidden layer of 100 units, Poisson sampling of 1,000 clients a round, 1 local epoch of batch 16, clip 1, noise
multiplier 1, the in-process engine (one process: no other process on the machine's cores), 12 rounds per setting:

* plain: ``engine.eval_every`` beyond the run (only the last round evaluates, left out of the figure);
* every client: ``engine.eval_every = 1``, every training and held-out client evaluated each round;
* a sample: ``engine.eval_every = 1`` and ``engine.eval_clients = K`` (K training and K held-out clients, the
  same every round).

Printed: the median seconds of rounds 2..11 of each (``round_time_s``: training, release and evaluation), and the
evaluated rounds' cost over the plain rounds'.

    python benchmarks/evaluation.py                          # 20,000 clients, K = 1,000
    python benchmarks/evaluation.py --clients 100000 --eval-clients 500
"""

from __future__ import annotations

import argparse
import os
import sys

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-eval-")

import numpy as np


def run(clients: int, per_round: int, extra: list[str], rounds: int) -> float:
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    scenario = load_scenario(
        "quickstart",
        [
            "data.dataset=synthetic",
            f"data.num_clients={clients}",
            "data.heldout_fraction=0.1",
            "model.name=mlp",
            "model.hidden=[100]",
            "client.local_epochs=1",
            "client.batch_size=16",
            f"privacy.sampling_rate={per_round / (0.9 * clients):.6g}",
            "engine.name=local",
            f"rounds={rounds}",
            *extra,
        ],
    )
    rows = run_scenario(scenario, write=False).rows
    times = [r["non_private"]["round_time_s"] for r in rows[1:-1]]
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=20_000)
    p.add_argument("--per-round", type=int, default=1000)
    p.add_argument("--eval-clients", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args(argv)
    print(
        f"{args.clients:,} clients, {args.per_round:,} a round; load average {os.getloadavg()[0]:.2f} at start"
    )
    settings = {
        "plain (no evaluation)": ["engine.eval_every=1000000"],
        "every client evaluated": ["engine.eval_every=1"],
        f"eval_clients={args.eval_clients}": [
            "engine.eval_every=1",
            f"engine.eval_clients={args.eval_clients}",
        ],
    }
    out = {}
    for label, extra in settings.items():
        out[label] = run(args.clients, args.per_round, extra, args.rounds)
        print(f"  {label:28s} {out[label]:.3f} s a round (median of rounds 2..{args.rounds - 1})", flush=True)
    plain = out["plain (no evaluation)"]
    for label, value in list(out.items())[1:]:
        ratio = value / plain
        verdict = f"target <= 2x {'PASS' if ratio <= 2 else 'MISS'}" if "eval_clients" in label else ""
        print(f"  {label:28s} {ratio:5.2f}x a plain round  {verdict}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
