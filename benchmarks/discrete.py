"""Distributed discrete noise benchmark (issue 36): what a client's quantise-and-noise pipeline for secure
aggregation costs per round, next to the continuous Gaussian share it replaces, and what it adds to a whole round
with many clients on the vectorised training path.

1. One client, ``--size`` parameters (default 1M; padded to 2^20 by the rotation): per client, the median over
   ``--reps`` repetitions of what :meth:`fedsim.training.trainer.ClientTrainer._add_one` does with the update of
   one client, starting from the float32 tensor training left:

   * baseline, distributed continuous Gaussian: ``clip_update``, the client's Gaussian share of the same std
     (``NoiseSource.noise(round, "share", ...)``), added to the partial sum;
   * ``ddgauss`` and ``skellam`` at 16 bits: ``NoiseSource.encode`` (:func:`fedsim.round.discrete.encode`) and
     ``PartialSum.add_encoded``;

   each broken into its stages, timed by calling the stage functions of :mod:`fedsim.round.discrete` directly
   (clip + randomized Hadamard rotation; scaling + conditional stochastic rounding; local integer noise; modular
   reduction); and the server's side: decoding the sum (``decoded_mean``) against ``private_mean``'s for the
   Gaussian shares. The release is a real one: Poisson sampling of 100 expected clients out of 10,000, clip 1,
   z = 1 (``PrivacySettings.mechanism_at``), so each client's noise std is ``z c / sqrt(100)``.

2. A round with ``--clients`` clients (default 1,000 of 2,000, Poisson) on the in-process engine
   (:class:`fedsim.engine.local_engine.LocalEngine`, ``engine.vectorize = "auto"``): MNIST-1D, an MLP with one
   hidden layer of ``--hidden`` units, 1 local epoch. Per round, the median over ``--rounds`` rounds (after one
   warm-up round) of the strategy's ``begin_round`` (sampling, the budget check), ``engine.train(plan, weights)``
   (training, clipping, noising or encoding, summing) and ``finish_round`` (decoding or server noise, the server
   step, recording the releases; the epsilon is left to the background thread, as the round loop does), for
   central Gaussian (the chunk summed on the device),
   distributed continuous Gaussian shares (row by row), ``ddgauss`` and ``skellam`` at 16 bits (row by row, each
   client encodes). Every configuration uses the ``rdp`` accountant. The data are generated once, outside every
   timing.

BLAS: the rotation's first six butterfly levels are one matrix product (:func:`fedsim.round.discrete.fwht`), which
NumPy hands to OpenBLAS with as many threads as it started with. On a few busy cores those threads wait for each
other far longer than the small product takes (at 8,192 numbers, 7.8 ms a transform with 2 threads against 0.25 ms
with one, measured under load), so the trainer encodes with BLAS limited to one thread
(``fedsim.training.trainer.blas_threads``); the client pipeline of part 1 runs with ``--blas-threads`` (default:
BLAS's own count) to show the difference.

Run it alone (the machine's load is printed at the start and the end): two CPU-heavy processes on 2 cores distort
every timing. The first run generates MNIST-1D (about 2 minutes for 40,000 examples on 2 busy cores; cached after).

    python benchmarks/discrete.py                                  # 1M parameters; 1,000 clients a round
    python benchmarks/discrete.py --blas-threads 1                 # the same, BLAS on one thread
    python benchmarks/discrete.py --size 100000 --clients 200 --rounds 2
    python benchmarks/discrete.py --skip-round                     # the client pipeline only
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-bench-")

import numpy as np
import torch

from fedsim.privacy import PrivacySettings
from fedsim.round import PartialSum, clip_update
from fedsim.round import discrete as dd
from fedsim.round.noise import decoded_mean, noise_share_std, private_mean
from fedsim.round.randomness import STREAM_NOISE_SHARE, STREAM_ROUNDING

BITS = 16
EXPECTED_COHORT = 100
POPULATION = 10_000
CLIP = 1.0
Z = 1.0
ROUND = 1


def load() -> float:
    return os.getloadavg()[0]


def median_ms(fn: Callable[[int], Any], reps: int) -> tuple[float, Any]:
    """The median wall time of ``fn(rep)`` over ``reps`` calls, in ms, and the last call's result."""
    times, out = [], None
    for rep in range(reps):
        start = time.perf_counter()
        out = fn(rep)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)), out


def settings(mechanism: str | None) -> PrivacySettings:
    """Distributed noise over a Poisson cohort of 100 expected clients: Gaussian shares (``None``) or a discrete
    mechanism at 16 bits."""
    extra: dict[str, Any] = {}
    if mechanism is not None:
        extra = {"mechanism": mechanism, "mechanism_options": {"bits": BITS}}
    return PrivacySettings(
        sampling="poisson",
        clients_per_round=EXPECTED_COHORT,
        clip=CLIP,
        noise_multiplier=Z,
        noise_placement="distributed",
        accountant="rdp",
        **extra,
    )


# ---------------------------------------------------------------- 1. one client's pipeline
def client_updates(size: int, reps: int) -> list[torch.Tensor]:
    """One float32 update per repetition, of norm about 2 (above the clip: every path clips)."""
    rng = np.random.default_rng(0)
    return [
        torch.from_numpy(rng.normal(0.0, 2.0 / math.sqrt(size), size).astype(np.float32)) for _ in range(reps)
    ]


def gaussian_client(size: int, reps: int) -> dict[str, Any]:
    """``_add_one`` with Gaussian shares: clip, the client's share of the same std, add to the partial sum."""
    s = settings(None)
    release = s.mechanism_at(POPULATION)
    noise, std = s.noise_source(0), noise_share_std(release)
    updates = client_updates(size, reps)
    partial = PartialSum(size)

    def whole(rep: int) -> None:
        clipped, _, _ = clip_update(updates[rep].double(), CLIP)
        share = noise.noise(ROUND, "share", size, std, client=rep)
        partial.add(clipped.cpu().numpy() + share, CLIP, already_clipped_and_noised=True)

    total, _ = median_ms(whole, reps)
    clipped = [clip_update(u.double(), CLIP)[0].cpu().numpy() for u in updates]
    shares = [noise.noise(ROUND, "share", size, std, client=r) for r in range(reps)]
    stages = {
        "clip": median_ms(lambda r: clip_update(updates[r].double(), CLIP)[0].cpu().numpy(), reps)[0],
        "noise": median_ms(lambda r: noise.noise(ROUND, "share", size, std, client=r), reps)[0],
        "add": median_ms(
            lambda r: PartialSum(size).add(clipped[r] + shares[r], CLIP, already_clipped_and_noised=True),
            reps,
        )[0],
    }
    server, _ = median_ms(lambda r: private_mean(partial, release, noise, ROUND), reps)
    return {"label": "Gaussian shares (continuous)", "total": total, "stages": stages, "server": server}


def discrete_client(mechanism: str, size: int, reps: int) -> dict[str, Any]:
    """``_add_one`` with a discrete mechanism (``encode`` and ``add_encoded``), its stages, and the decoding."""
    s = settings(mechanism)
    release = s.mechanism_at(POPULATION)
    noise = s.noise_source(0)
    noise.set_model_size(size)
    encoding = {**noise.encoding(release, size), **noise.public_randomness(ROUND)}
    updates = client_updates(size, reps)
    partial = PartialSum(size)
    tries: list[int] = []

    def whole(rep: int) -> None:
        encoded, info = noise.encode(ROUND, rep, updates[rep].detach().double().cpu().numpy(), CLIP, encoding)
        partial.add_encoded(encoded, info["norm"], info.get("sums"))
        tries.append(int(info["tries"]))

    total, _ = median_ms(whole, reps)

    # the stages, as dd.encode runs them, on the same inputs and streams
    scale, seed = float(encoding["scale"]), int(encoding["rotation_seed"])
    xs = [u.detach().double().cpu().numpy() for u in updates]

    def rotation(rep: int) -> np.ndarray:
        x = xs[rep]
        norm = float(np.linalg.norm(x))
        return dd.rotate(x * (CLIP / norm) if norm > CLIP else x, seed)

    rotation_ms, _ = median_ms(rotation, reps)
    rotated = [rotation(r) for r in range(reps)]
    bound = dd.inflated_l2_bound(CLIP * scale, float(encoding["beta"]), int(encoding["dim"]))

    def rounding(rep: int) -> np.ndarray:
        return dd.conditional_round(rotated[rep] * scale, noise.rng(ROUND, STREAM_ROUNDING, rep), bound)[0]

    rounding_ms, _ = median_ms(rounding, reps)
    rounded = [rounding(r) for r in range(reps)]
    std = float(encoding["local_std_grid"])

    def local(rep: int) -> np.ndarray:
        return dd.local_noise(
            noise.noise_kind, noise.rng(ROUND, STREAM_NOISE_SHARE, rep), std, rounded[rep].size
        )

    noise_ms, _ = median_ms(local, reps)
    signed = [rounded[r] + local(r) for r in range(reps)]
    modular_ms, _ = median_ms(lambda r: dd.to_modular(signed[r], BITS), reps)
    stages = {"rotation": rotation_ms, "rounding": rounding_ms, "noise": noise_ms, "modular": modular_ms}
    server, _ = median_ms(lambda r: decoded_mean(partial, release, noise, ROUND, encoding), reps)
    return {
        "label": f"{mechanism} {BITS} bits",
        "total": total,
        "stages": stages,
        "server": server,
        "tries": float(np.mean(tries)),
        "local_std_grid": std,
    }


def client_pipeline(args: argparse.Namespace) -> None:
    size, reps = args.size, args.reps
    print(
        f"\n## 1. one client's pipeline: {size:,} parameters (padded to {dd.padded_dim(size):,}), median of "
        f"{reps} clients; Poisson, {EXPECTED_COHORT} expected of {POPULATION:,}, clip {CLIP:g}, z {Z:g}, "
        f"load {load():.2f}",
        flush=True,
    )
    base = gaussian_client(size, reps)
    rows = [discrete_client(m, size, reps) for m in ("ddgauss", "skellam")]
    print("\n| per client | ms | vs Gaussian shares |")
    print("|---|---|---|")
    for r in [base, *rows]:
        print(f"| {r['label']} | {r['total']:.1f} | {r['total'] / base['total']:.1f}x |")
    print("\n| stages (ms) | clip + rotation | scale + conditional rounding | local noise | mod 2^b |")
    print("|---|---|---|---|---|")
    g = base["stages"]
    print(f"| Gaussian shares | {g['clip']:.1f} (clip) | - | {g['noise']:.1f} | {g['add']:.1f} (add) |")
    for r in rows:
        st = r["stages"]
        print(
            f"| {r['label']} | {st['rotation']:.1f} | {st['rounding']:.1f} (tries {r['tries']:.2f}) | "
            f"{st['noise']:.1f} (std {r['local_std_grid']:.0f} grid steps) | {st['modular']:.1f} |"
        )
    print("\n| server, per round | ms | vs Gaussian shares |")
    print("|---|---|---|")
    print(f"| Gaussian shares: private_mean | {base['server']:.1f} | 1.0x |")
    for r in rows:
        print(f"| {r['label']}: decode | {r['server']:.1f} | {r['server'] / base['server']:.1f}x |")


# ---------------------------------------------------------------- 2. a round with many clients
ROUND_CONFIGS = [
    ("central Gaussian (chunk sum)", ["privacy.noise_placement=central"]),
    ("distributed Gaussian shares", ["privacy.noise_placement=distributed"]),
    *[
        (
            f"{m} {BITS} bits",
            [
                "privacy.noise_placement=distributed",
                f"privacy.mechanism.name={m}",
                f"privacy.mechanism.bits={BITS}",
            ],
        )
        for m in ("ddgauss", "skellam")
    ],
]


def overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"rounds={args.rounds + 1}",
        "data.dataset=mnist1d",
        f"data.num_clients={args.population}",
        f"data.num_samples={args.population * args.examples}",
        "data.heldout_fraction=0",
        f"model.hidden=[{args.hidden}]",
        "client.local_epochs=1",
        "client.batch_size=16",
        "privacy.sampling=poisson",
        "privacy.sampling_rate=none",
        f"privacy.clients_per_round={args.clients}",
        "privacy.accountant=rdp",
        "engine.name=local",
        "engine.vectorize=auto",
    ]


def one_config(label: str, extra: list[str], args: argparse.Namespace, data: Any) -> dict[str, Any]:
    from fedsim import experiment
    from fedsim.engine.local_engine import LocalEngine
    from fedsim.scenarios import load_scenario

    original = experiment.build_data
    experiment.build_data = lambda _s: data  # generated once, outside the timings
    try:
        exp = experiment.build_experiment(load_scenario("quickstart", [*overrides(args), *extra]))
    finally:
        experiment.build_data = original
    engine = LocalEngine(exp.data, exp.settings)
    weights = exp.initial_weights
    begin, train, finish, means, cohorts = [], [], [], [], []
    try:
        for t in range(1, args.rounds + 2):
            begin_start = time.perf_counter()
            plan = exp.strategy.begin_round(t, exp.train_ids)
            start = time.perf_counter()
            partial, _ = engine.train(plan, weights)
            mid = time.perf_counter()
            weights_before = weights
            # account=False as the round loop does (it computes epsilon in a background thread while the next
            # round trains): the round's own work, not the accountant's
            weights, _ = exp.strategy.finish_round(plan, weights, partial, account=False)
            end = time.perf_counter()
            # the mean alone (decoding, or the server's noise), timed again outside the round: it draws from the
            # round's own streams, so the round's figures are unchanged by it
            mean_start = time.perf_counter()
            if plan.encodes:
                enc = plan.encoding_for(weights_before.size)
                decoded_mean(partial, plan.mechanism, exp.strategy.noise, plan.round, enc)
            else:
                private_mean(partial, plan.mechanism, exp.strategy.noise, plan.round)
            mean_s = time.perf_counter() - mean_start
            if t > 1:  # the first round warms up the training path
                begin.append(start - begin_start)
                train.append(mid - start)
                finish.append(end - mid)
                means.append(mean_s)
                cohorts.append(int(plan.cohort.size))
    finally:
        engine.close()
    return {
        "label": label,
        "train": float(np.median(train)),
        "finish": float(np.median(finish)),
        "mean": float(np.median(means)),
        "begin": float(np.median(begin)),
        "round": float(np.median(np.add(np.add(begin, train), finish))),
        "cohort": float(np.mean(cohorts)),
        "path": f"{engine.trainer.path.name}, {engine.torch_threads} torch thread(s)",
        "dim": int(weights.size),
    }


def many_clients(args: argparse.Namespace) -> None:
    from fedsim.data import build_federated_data

    start = time.perf_counter()
    data = build_federated_data(
        "mnist1d",
        num_clients=args.population,
        partitioner="dirichlet",
        alpha=0.5,
        heldout_fraction=0.0,
        num_samples=args.population * args.examples,
        seed=0,
    )
    prep = time.perf_counter() - start
    print(
        f"\n## 2. a round: {args.clients:,} expected clients of {args.population:,} (Poisson), MNIST-1D "
        f"({args.examples} examples a client), MLP hidden {args.hidden}, 1 local epoch, in-process engine; median "
        f"of {args.rounds} rounds after a warm-up; data generated in {prep:.1f} s (not timed); load {load():.2f}",
        flush=True,
    )
    rows = [one_config(label, extra, args, data) for label, extra in ROUND_CONFIGS]
    dim = rows[0]["dim"]
    print(f"\nmodel: {dim:,} parameters (padded to {dd.padded_dim(dim):,}); training path: {rows[0]['path']}")
    base = rows[0]
    print(
        "\n| mechanism | clients | begin_round (s) | engine.train (s) | per client (ms) | finish_round (s) | of "
        "which decode / noise (s) | round (s) | vs central: train / round |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['cohort']:.0f} | {r['begin']:.3f} | {r['train']:.2f} | "
            f"{1e3 * r['train'] / r['cohort']:.2f} | "
            f"{r['finish']:.3f} | {r['mean']:.3f} | {r['round']:.2f} | {r['train'] / base['train']:.1f}x / "
            f"{r['round'] / base['round']:.2f}x |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--size", type=int, default=1_000_000, help="client pipeline: parameters (default 1,000,000)"
    )
    p.add_argument("--reps", type=int, default=5, help="client pipeline: clients timed (default 5)")
    p.add_argument(
        "--clients", type=int, default=1000, help="round: expected clients a round (default 1,000)"
    )
    p.add_argument("--population", type=int, default=2000, help="round: clients sampled from (default 2,000)")
    p.add_argument("--examples", type=int, default=20, help="round: examples a client (default 20)")
    p.add_argument("--hidden", type=int, default=100, help="round: the MLP's hidden units (default 100)")
    p.add_argument("--rounds", type=int, default=3, help="round: rounds timed after the warm-up (default 3)")
    p.add_argument(
        "--blas-threads",
        type=int,
        default=None,
        help="limit BLAS's threads (threadpoolctl) for the whole run; default: as NumPy starts",
    )
    p.add_argument("--skip-client", action="store_true", help="skip the client pipeline")
    p.add_argument("--skip-round", action="store_true", help="skip the round with many clients")
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(args.blas_threads, user_api="blas"):
        blas = ", ".join(
            f"{i['internal_api']} {i['num_threads']} threads"
            for i in threadpool_info()
            if i["user_api"] == "blas"
        )
        print(
            f"discrete noise benchmark: {os.cpu_count()} CPUs, BLAS: {blas or 'none found'}, "
            f"load average {load():.2f} at start",
            flush=True,
        )
        if not args.skip_client:
            client_pipeline(args)
        if not args.skip_round:
            many_clients(args)
    print(f"\nload average at the end: {load():.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
