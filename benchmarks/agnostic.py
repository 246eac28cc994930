"""Private agnostic FL (DPAgnosticFedAvg) vs DP-FedAvg at the same certified epsilon: worst-domain loss.

Both strategies run the same scenario (``scenarios/agnostic-domains.toml`` unless ``--scenario``), seed by seed, on
the in-process engine. The scenario describes the AFL run; DP-FedAvg gets the noise multiplier that gives it
*exactly* AFL's certified epsilon:

An AFL round makes two Gaussian releases on one cohort, the lambda-weighted model update (noise multiplier
``z_model``, relative to its sensitivity) and the per-domain loss sums (``z_loss``). Two Gaussian mechanisms
on the same sampled cohort compose exactly to one Gaussian mechanism with
``z_eff = (z_model^-2 + z_loss^-2)^-1/2`` (the sensitivities add in quadrature), so DP-FedAvg with noise
``z = z_eff`` has the same privacy loss distribution per round, hence the same epsilon after any number of
rounds. The benchmark asserts that the two ledgers certify the same epsilon.

Printed per seed and on average: the certified epsilon of each, the final worst-domain loss over the
training clients and over the held-out clients of each domain (client-level means, as fedsim reports them),
the per-domain losses, the mean accuracy, and AFL's final lambda; then the verdict.

    python benchmarks/agnostic.py                          # seeds 0 1 2 (the reported comparison)
    python benchmarks/agnostic.py --seeds 10 11            # tuning seeds
    python benchmarks/agnostic.py --set agnostic.lambda_lr=0.05 --set rounds=20
    python benchmarks/agnostic.py --target-z 1.0           # fix DP-FedAvg's z; AFL's z_model follows
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsim.engine.runner import run_scenario
from fedsim.scenarios import load_scenario

DEFAULT_SCENARIO = str(ROOT / "scenarios" / "agnostic-domains.toml")


def composed_z(z_model: float, z_loss: float) -> float:
    """The single Gaussian noise multiplier equivalent to two releases on one cohort."""
    return (z_model**-2 + z_loss**-2) ** -0.5


def afl_z_model(z_target: float, z_loss: float) -> float:
    """AFL's model noise multiplier that, with loss noise ``z_loss``, composes to ``z_target``."""
    if z_loss <= z_target:
        raise ValueError(f"loss noise multiplier {z_loss} must exceed the target z {z_target}")
    return 1.0 / math.sqrt(z_target**-2 - z_loss**-2)


def scenarios(path: str, overrides: list[str], seed: int, target_z: float | None) -> tuple[Any, Any]:
    """(AFL scenario, DP-FedAvg scenario) at the same certified epsilon."""
    base = [
        *overrides,
        f"seed={seed}",
        "engine.name=local",
        "engine.eval_every=1000000",
    ]  # evaluate the last round only
    afl = load_scenario(path, [*base, "agnostic.enabled=true"])
    z_loss = afl.agnostic.loss_noise_multiplier
    if target_z is not None:
        afl = load_scenario(
            path,
            [*base, "agnostic.enabled=true", f"privacy.noise_multiplier={afl_z_model(target_z, z_loss)!r}"],
        )
    z_avg = composed_z(afl.privacy.noise_multiplier, z_loss)
    avg = load_scenario(path, [*base, "agnostic.enabled=false", f"privacy.noise_multiplier={z_avg!r}"])
    return afl, avg


def summarize(result: Any) -> dict[str, Any]:
    last = result.rows[-1]
    tr, ho = last["non_private"]["domains_train"], last.get("domains_heldout")
    out = {
        "epsilon": float(result.strategy.epsilon()),
        "z": result.strategy.noise_multiplier,
        "worst_train": float(last["non_private"]["worst_domain_train_loss"]),
        "worst_heldout": float(last.get("worst_domain_heldout_loss", math.nan)),
        "loss_train": [d["loss"] for d in tr],
        "loss_heldout": [d["loss"] for d in ho] if ho else [],
        "acc_train": float(last["non_private"]["train_accuracy"]),
        "acc_heldout": float(last.get("heldout_accuracy", math.nan)),
        "acc_dom_train": [d["accuracy"] for d in tr],
        "rounds": len(result.rows),
    }
    lam = getattr(result.strategy, "lam", None)
    if lam is not None:
        out["lambda"] = [float(x) for x in lam]
        out["z_loss"] = result.strategy.loss_noise_multiplier
        out["max_weight_scale"] = max(h["weight_scale"] for h in result.strategy.history)
        out["mean_weight_scale"] = float(np.mean([h["weight_scale"] for h in result.strategy.history]))
    return out


def fmt(xs: list[float], spec: str = ".3f") -> str:
    return "[" + " ".join(format(x, spec) for x in xs) + "]"


def show(tag: str, s: dict[str, Any]) -> None:
    line = (
        f"  {tag:<8} eps {s['epsilon']:.4f} (z={s['z']:.4f}"
        + (f", z_loss={s['z_loss']:.4f}" if "z_loss" in s else "")
        + f") | worst-domain loss train {s['worst_train']:.4f} held-out {s['worst_heldout']:.4f}"
        f" | domain loss train {fmt(s['loss_train'])} held-out {fmt(s['loss_heldout'])}"
        f" | acc train {s['acc_train']:.3f} held-out {s['acc_heldout']:.3f} domains {fmt(s['acc_dom_train'])}"
    )
    if "lambda" in s:
        line += (
            f" | lambda {fmt(s['lambda'])} (weight scale / FedAvg's: mean {s['mean_weight_scale_ratio']:.2f})"
        )
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=DEFAULT_SCENARIO)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scenario override, as `fedsim run --set` (repeatable)",
    )
    ap.add_argument(
        "--target-z",
        type=float,
        default=None,
        help="DP-FedAvg's noise multiplier; AFL's model noise is derived from it and z_loss",
    )
    ap.add_argument("--quiet", action="store_true", help="only the summary lines")
    a = ap.parse_args(argv)

    afl0, avg0 = scenarios(a.scenario, a.overrides, a.seeds[0], a.target_z)
    p, ag, d = afl0.privacy, afl0.agnostic, afl0.data
    print(
        f"scenario {a.scenario} ({afl0.name}): {d.dataset}, {d.num_clients} clients, domains {d.domains}, "
        f"shift {d.domain_shift}, noise {d.domain_noise}, held out {d.heldout_fraction}; {afl0.rounds} rounds, "
        f"q={p.sampling_rate}, clip {p.clip}, delta {p.delta}"
    )
    print(
        f"AFL: z_model={p.noise_multiplier:.6f}, z_loss={ag.loss_noise_multiplier:.6f}, "
        f"lambda_lr={ag.lambda_lr}  ->  DP-FedAvg: z = (z_model^-2 + z_loss^-2)^-1/2 = "
        f"{avg0.privacy.noise_multiplier:.6f}"
    )
    print(f"overrides: {a.overrides or 'none'}; seeds {a.seeds}\n", flush=True)

    res: dict[str, list[dict[str, Any]]] = {"DPFedAvg": [], "AFL": []}
    t0 = time.perf_counter()
    for seed in a.seeds:
        afl_sc, avg_sc = scenarios(a.scenario, a.overrides, seed, a.target_z)
        t = time.perf_counter()
        avg = summarize(run_scenario(avg_sc, write=False))
        t_avg = time.perf_counter() - t
        t = time.perf_counter()
        afl_run = run_scenario(afl_sc, write=False)
        afl = summarize(afl_run)
        t_afl = time.perf_counter() - t
        # FedAvg's weight scale is 1 / (q * N): AFL's noise on the mean relative to FedAvg's (same z) is the ratio
        fedavg_scale = 1.0 / (afl_run.strategy.mechanism(afl_run.strategy.population).expected_cohort)
        afl["mean_weight_scale_ratio"] = afl["mean_weight_scale"] / fedavg_scale
        assert math.isclose(afl["epsilon"], avg["epsilon"], rel_tol=1e-6), (afl["epsilon"], avg["epsilon"])
        assert afl["rounds"] == avg["rounds"] == afl_sc.rounds, "a run stopped early"
        res["DPFedAvg"].append(avg)
        res["AFL"].append(afl)
        print(
            f"seed {seed} ({t_avg:.0f} s + {t_afl:.0f} s)  certified epsilon equal: "
            f"{afl['epsilon']:.6f} == {avg['epsilon']:.6f} (delta={afl_sc.privacy.delta:g})"
        )
        show("DPFedAvg", avg)
        show("AFL", afl)

    print(f"\nmean over seeds {a.seeds} ({time.perf_counter() - t0:.0f} s):")
    keys = ("epsilon", "worst_train", "worst_heldout", "acc_train", "acc_heldout")
    for name, rs in res.items():
        m = {k: float(np.mean([r[k] for r in rs])) for k in keys}
        lt = np.mean([r["loss_train"] for r in rs], axis=0).tolist()
        lh = np.mean([r["loss_heldout"] for r in rs], axis=0).tolist()
        extra = (
            f" | lambda {fmt(np.mean([r['lambda'] for r in rs], axis=0).tolist())}" if name == "AFL" else ""
        )
        print(
            f"  {name:<8} eps {m['epsilon']:.4f} | worst-domain loss train {m['worst_train']:.4f} held-out "
            f"{m['worst_heldout']:.4f} | domain loss train {fmt(lt)} held-out {fmt(lh)} | acc train "
            f"{m['acc_train']:.3f} held-out {m['acc_heldout']:.3f}{extra}"
        )

    n = len(a.seeds)
    verdict = []
    for key, label in (("worst_train", "training clients"), ("worst_heldout", "held-out clients")):
        diff = np.array([f[key] - g[key] for f, g in zip(res["AFL"], res["DPFedAvg"], strict=True)])
        wins = int(np.sum(diff < 0))
        mean_avg = float(np.mean([g[key] for g in res["DPFedAvg"]]))
        sd = float(np.std(diff, ddof=1)) if n > 1 else math.nan
        verdict.append(wins == n and np.mean(diff) < 0)
        print(
            f"verdict ({label}): AFL worst-domain loss - DPFedAvg's = {np.mean(diff):+.4f} on average "
            f"({np.mean(diff) / mean_avg:+.1%}; per seed {fmt(diff.tolist(), '+.4f')}, sd {sd:.4f}); "
            f"AFL lower in {wins}/{n} seeds"
        )
    print(
        "AFL lowers the worst-domain loss at equal certified epsilon: "
        + (
            "YES (every seed, train and held-out)"
            if all(verdict)
            else "NOT in every seed / split (see above)"
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
