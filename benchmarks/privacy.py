"""Speed of the privacy accountants (printed ratios, not a timed test).

    python benchmarks/privacy.py [--rounds 10000] [--pld-rounds 1000] [--scratch-sample 40]

1. Every accountant's whole per-round curve for T = --rounds (default 10,000).
   Targets: each closed form < 50 ms, rdp < 1 s.
2. The per-round PLD curve for T = --pld-rounds (default 1,000) against recomputing dp-accounting's
   PLD from scratch at every round (``PLDAccountant().compose(event, t).get_epsilon(delta)``).
   Target: < 10 s and >= 20x faster, and never below the from-scratch epsilon. The from-scratch
   cost is measured on --scratch-sample rounds spread over 1..T (all of them with --scratch-all)
   and extrapolated to every round; the "never below" check compares every sampled round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedsim.privacy import ACCOUNTANTS, Mechanism, compute_curve

CLOSED_FORMS = ("igmm", "igmm-corrected", "dp-fl-thm8", "kairouz", "basic")


def timed(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10_000)
    ap.add_argument("--pld-rounds", type=int, default=1_000)
    ap.add_argument("--scratch-sample", type=int, default=40)
    ap.add_argument("--scratch-all", action="store_true")
    ap.add_argument("--delta", type=float, default=1e-5)
    a = ap.parse_args(argv)

    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    mech = Mechanism(population=60_000, sampling="poisson", sampling_rate=0.01, noise_multiplier=1.1)
    fixed = Mechanism(population=60_000, sampling="fixed", clients_per_round=600, noise_multiplier=1.1)
    T, delta = a.rounds, a.delta
    compute_curve(mech, 10, delta, "pld")  # warm imports and caches
    print(f"mechanism: population 60000, q=0.01, z=1.1, delta={delta:g}")
    print(f"\n1. whole per-round curves, T = {T}")
    print(f"{'method':<16}{'seconds':>10}{'target':>10}{'ratio to target':>18}{'eps(T)':>12}")
    for m in ACCOUNTANTS:
        if m == "pld":
            continue
        rep = 3 if m in CLOSED_FORMS else 1
        sec, c = timed(lambda: compute_curve(mech, T, delta, m), rep)
        target = 0.05 if m in CLOSED_FORMS else 1.0
        e = c.epsilon[-1]
        print(f"{m:<16}{sec:>10.4f}{target:>10.2f}{sec / target:>17.2f}x{e:>12.4g}")
    sec, c = timed(lambda: compute_curve(mech, T, delta, "pld"))
    print(
        f"{'pld':<16}{sec:>10.4f}{'-':>10}{'-':>18}{c.epsilon[-1]:>12.4g}   ({int(c.exact.sum())} exact checkpoints)"
    )
    sec, c = timed(lambda: compute_curve(fixed, T, delta, "rdp"))
    print(f"{'rdp (fixed)':<16}{sec:>10.4f}{1.0:>10.2f}{sec:>17.2f}x{c.epsilon[-1]:>12.4g}")

    Tp = a.pld_rounds
    print(f"\n2. per-round PLD curve, T = {Tp}, against dp-accounting from scratch at every round")
    sec_curve, curve = timed(lambda: compute_curve(mech, Tp, delta, "pld"))
    ts = (
        np.arange(1, Tp + 1) if a.scratch_all else np.unique(np.linspace(1, Tp, a.scratch_sample).astype(int))
    )
    ev = mech.to_dp_event()
    scratch = {}
    t0 = time.perf_counter()
    for t in ts:
        scratch[int(t)] = PLDAccountant().compose(ev, int(t)).get_epsilon(delta)
    sec_sample = time.perf_counter() - t0
    per_round = sec_sample / len(ts)
    sec_scratch = per_round * Tp if not a.scratch_all else sec_sample
    diffs = np.array([curve.epsilon[t - 1] - scratch[t] for t in scratch])
    below = int((diffs < 0).sum())
    print(f"ours (per-round curve)      {sec_curve:8.3f} s   target < 10 s")
    print(
        f"from scratch, every round   {sec_scratch:8.3f} s   ({'measured' if a.scratch_all else f'{per_round:.4f} s/round x {Tp}, from {len(ts)} sampled rounds'})"
    )
    print(f"speed-up                    {sec_scratch / sec_curve:8.1f}x  target >= 20x")
    print(
        f"rounds compared             {len(ts)}; ours below from-scratch at {below} of them; "
        f"min(ours - scratch) = {diffs.min():.3g}, max = {diffs.max():.3g}, "
        f"max relative = {np.max(diffs / np.array(list(scratch.values()))):.3%}"
    )
    print(f"eps(T): ours {curve.epsilon[-1]:.5f}, from scratch {scratch[Tp]:.5f}")
    return 0 if below == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
