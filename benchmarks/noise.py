"""Correlated-noise benchmark: what one round's noise costs, in time and memory, for each mechanism, at a model of
1M parameters over 2,000 rounds (issue 24's cost target), with independent noise as the baseline run side by side.

For each mechanism (``independent``; ``tree`` with both estimators; ``banded-mf`` with 2 to 64 bands; ``blt`` with
1 to 4 buffers), the noise source fedsim's strategy uses (:mod:`fedsim.round.correlated`, seeded) is asked for
every round's model-update noise, as the strategy asks it (``noise(t, "model", size, std)``), for ``--rounds``
rounds of ``--size`` numbers:

* ms/round: the median over the rounds, and the median over the first and the last 10% of rounds (flat: the cost
  does not grow with the round);
* the ratio to independent noise's median, which draws the same Gaussian vector and adds nothing to it (the draw
  itself costs most of a round);
* state: the bytes of the state a checkpoint saves (``state_dict``'s arrays), which is all the memory the mechanism
  keeps between rounds: ``(bands - 1) x size`` for banded-mf, ``buffers x size`` for blt, at most
  ``log2(rounds) x size`` for the tree;
* the time to fix the strategy for the schedule (``prepare``: optimising the banded coefficients or the BLT for the
  rounds, ``--min-separation`` and no cap), and to compute every prefix's sensitivity (what the ledger needs).

Run it alone (the machine's load is printed): two CPU-heavy processes on 2 cores distort every timing.

    python benchmarks/noise.py                       # 1M parameters, 2,000 rounds (a few minutes on 2 cores)
    python benchmarks/noise.py --size 100000 --rounds 200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from fedsim.round import make_noise_source

MECHANISMS = [
    ("independent", {}),
    ("tree", {"estimator": "standard"}),
    ("tree", {"estimator": "honaker"}),
    ("banded-mf", {"bands": 2}),
    ("banded-mf", {"bands": 8}),
    ("banded-mf", {"bands": 32}),
    ("banded-mf", {"bands": 64}),
    ("blt", {"buffers": 1}),
    ("blt", {"buffers": 2}),
    ("blt", {"buffers": 4}),
]


def state_bytes(state: dict) -> int:
    return sum(v.nbytes for v in state.values() if isinstance(v, np.ndarray))


def measure(name: str, options: dict, size: int, rounds: int, min_sep: int) -> dict:
    noise = make_noise_source(name, 0, **options)
    start = time.perf_counter()
    noise.prepare(rounds, min_sep, None)
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    _, exact = noise.prefix_sensitivity_squared(rounds, min_sep, None, cyclic=True)
    sens_s = time.perf_counter() - start
    times = np.empty(rounds)
    peak_state = 0
    for t in range(1, rounds + 1):
        start = time.perf_counter()
        out = noise.noise(t, "model", size, 1.0)
        times[t - 1] = time.perf_counter() - start
        assert out.shape == (size,)
        if t % max(1, rounds // 20) == 0 or t == rounds:
            peak_state = max(peak_state, state_bytes(noise.state_dict()))
    tenth = max(1, rounds // 10)
    label = name + "".join(f" {k}={v}" for k, v in options.items())
    return {
        "label": label,
        "median_ms": 1e3 * float(np.median(times)),
        "first_ms": 1e3 * float(np.median(times[:tenth])),
        "last_ms": 1e3 * float(np.median(times[-tenth:])),
        "state_mb": peak_state / 2**20,
        "prepare_s": prepare_s,
        "sensitivity_s": sens_s,
        "exact": exact,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1_000_000, help="model parameters (default 1,000,000)")
    p.add_argument("--rounds", type=int, default=2000, help="rounds (default 2,000)")
    p.add_argument("--min-separation", type=int, default=64, help="the schedule's b (default 64)")
    args = p.parse_args(argv)
    print(
        f"noise per round: {args.size:,} parameters, {args.rounds:,} rounds, min separation {args.min_separation}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )
    rows = [measure(n, o, args.size, args.rounds, args.min_separation) for n, o in MECHANISMS]
    base = rows[0]["median_ms"]
    head = (
        "| mechanism | ms/round (median) | first / last 10% of rounds | vs independent | state (MiB) "
        "| prepare (s) | sensitivity, every prefix (s) |"
    )
    print(head)
    print("|" + "---|" * 7)
    for r in rows:
        exact = "" if r["exact"] else " (bound)"
        print(
            f"| {r['label']} | {r['median_ms']:.2f} | {r['first_ms']:.2f} / {r['last_ms']:.2f} | "
            f"{r['median_ms'] / base:.2f}x | {r['state_mb']:.1f} | {r['prepare_s']:.2f} | "
            f"{r['sensitivity_s']:.3f}{exact} |"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
