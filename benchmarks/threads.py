"""Threads benchmark: seconds per round of each engine and training path at 1 and 2 torch threads and at what
``engine.torch_threads = "auto"`` chooses (:mod:`fedsim.engine.threads`), side by side in one run.

Workloads (``--models``): the shipped scenarios ``quickstart`` (an MLP with 32 hidden units on the digits, 3 local
epochs of batch 8) and ``shakespeare-transformer`` (2 encoder layers over 80-character windows, 1 local epoch of
batch 16), each training the same cohort of its first training clients (``--cohort``, default 20) every round.

For each engine (``--engines``):

* ``local``: the in-process engine (:class:`~fedsim.engine.local_engine.LocalEngine`), one per path and thread
  count, the configurations taking turns round by round (so a machine that slows down slows them all); each
  engine sets its thread count around its ``train`` call;
* ``ray``: the Ray engine (:class:`~fedsim.engine.ray_engine.RayEngine`) with ``--ray-workers`` workers of
  ``--ray-cpus`` CPUs each (default 2 x 1 on Ray's own local instance, started once), one engine per path and
  thread count started in turn (a round of each, untimed, first).

Each figure is the median seconds of ``--rounds`` timed rounds (after one warm-up round) of ``engine.train``: the
cohort's local training and clipped sum, no evaluation, no accounting. The table gives, per engine and path, the
seconds at 1 thread, at 2 threads, at ``auto`` (its thread count in brackets; a count already measured is not
measured twice), fedsim's behaviour before ``engine.torch_threads`` existed (``before``: the in-process engine
left torch at its default, one thread per core; each Ray worker got ``floor(num_cpus_per_worker)``), and the
ratios ``before / auto`` (above 1: auto is faster) and ``2 threads / 1 thread``.

The load average at the start and the end is printed: on a machine shared with other busy processes a second
thread competes for a core that is not free, so run it on an idle machine for figures to quote.

    python benchmarks/threads.py                       # both models, both engines (a few minutes on 2 cores)
    python benchmarks/threads.py --quick               # smoke run
    python benchmarks/threads.py --models mlp --engines local --rounds 9
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
import warnings
from typing import Any

# ---------------------------------------------------------------- environment (before flwr / ray imports)
from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-bench-")

import numpy as np
import torch

PATHS = ("per-layer", "vmap", "loop")
MODELS = {"mlp": "quickstart", "transformer": "shakespeare-transformer"}
COUNTS = (1, 2)


# ---------------------------------------------------------------- workload
def workload(model: str, args: argparse.Namespace) -> tuple[Any, Any, list[int]]:
    """The scenario's data, its training settings and the cohort every round trains."""
    from fedsim.experiment import build_data
    from fedsim.scenarios import load_scenario
    from fedsim.training.trainer import TrainSettings

    sets = ["data.heldout_fraction=0.1"]
    if model == "transformer":
        sets.append(f"data.num_clients={max(2 * args.cohort, 40)}")
    sc = load_scenario(MODELS[model], sets)
    data = build_data(sc)
    cohort = [int(c) for c in np.asarray(data.train_clients)[: args.cohort]]
    return data, TrainSettings.from_scenario(sc), cohort


def plan(round_: int, cohort: list[int]) -> Any:
    from fedsim.training.trainer import ClientPlan

    return ClientPlan(round_, np.asarray(cohort, dtype=np.int64), 1.0)


# ---------------------------------------------------------------- engines
def time_local(data: Any, settings: Any, cohort: list[int], rounds: int) -> dict[str, dict[str, Any]]:
    """Per path: ``{count: median s}`` for 1 and 2 threads and auto's count, ``auto`` (its count, why); the
    configurations take turns round by round."""
    from fedsim.engine.local_engine import LocalEngine
    from fedsim.training.trainer import initial_weights

    weights = initial_weights(settings, data.input_shape, data.num_classes)
    out: dict[str, dict[str, Any]] = {}
    engines: list[tuple[str, int, Any]] = []
    for path in PATHS:
        s = dataclasses.replace(settings, vectorize=path)
        try:
            auto = LocalEngine(data, s)  # what auto chooses for this path here
        except ValueError as exc:  # this path cannot train this model: fedsim says why
            out[path] = {"reason": str(exc).split("cannot train this model: ", 1)[-1][:100]}
            continue
        out[path] = {"auto": (auto.torch_threads, auto.torch_threads_why), "times": {}}
        for n in sorted({*COUNTS, auto.torch_threads}):
            engine = auto if n == auto.torch_threads else LocalEngine(data, s, torch_threads=n)
            engines.append((path, n, engine))
            out[path]["times"][n] = []
    for r in range(rounds + 1):  # round 0: warm-up, untimed
        for path, n, engine in engines:
            t = time.perf_counter()
            engine.train(plan(r + 1, cohort), weights)  # on its thread count (set around the call)
            dt = time.perf_counter() - t
            if r:
                out[path]["times"][n].append(dt)
    return out


def time_ray(
    data: Any, settings: Any, cohort: list[int], rounds: int, workers: int, cpus: float
) -> dict[str, dict[str, Any]]:
    """As :func:`time_local`, on the Ray engine: one engine per path and thread count, started in turn."""
    from fedsim.engine.ray_engine import RayEngine
    from fedsim.training.trainer import initial_weights

    weights = initial_weights(settings, data.input_shape, data.num_classes)
    out: dict[str, dict[str, Any]] = {}
    for path in PATHS:
        s = dataclasses.replace(settings, vectorize=path)
        done: list[int] = []
        out[path] = {"times": {}}
        for n in ("auto", *COUNTS):
            if n in done:
                continue
            try:
                engine = RayEngine(data, s, num_workers=workers, num_cpus=cpus, torch_threads=n)
            except ValueError as exc:  # this path cannot train this model: the workers say why
                out[path] = {"reason": str(exc).split("cannot train this model: ", 1)[-1][:100]}
                break
            except Exception as exc:  # the machine (a worker killed for memory, ...): said, not hidden
                out[path] = {"reason": f"failed: {type(exc).__name__}: {str(exc)[:100]}"}
                break
            try:
                if n == "auto":
                    out[path]["auto"] = (engine.torch_threads, engine.torch_threads_why)
                count = engine.torch_threads
                engine.train(plan(1, cohort), weights)  # warm-up
                times = []
                for r in range(rounds):
                    t = time.perf_counter()
                    engine.train(plan(r + 2, cohort), weights)
                    times.append(time.perf_counter() - t)
                out[path]["times"][count] = times
                done.append(count)
            finally:
                engine.close()
    return out


# ---------------------------------------------------------------- report
def row(engine: str, model: str, path: str, res: dict[str, Any], before: int) -> str:
    if "reason" in res:
        return f"{engine:6s} {model:12s} {path:10s} n/a ({res['reason']})"
    med = {n: float(np.median(t)) for n, t in res["times"].items()}
    auto_n = res["auto"][0]

    def cell(n: int) -> str:
        return f"{med[n]:9.4f}" if n in med else f"{'-':>9s}"

    ratio_before = med.get(before, math.nan) / med[auto_n]
    ratio_two = med.get(2, math.nan) / med.get(1, math.nan)
    return (
        f"{engine:6s} {model:12s} {path:10s} {cell(1)} {cell(2)} {med[auto_n]:9.4f} ({auto_n}) "
        f"{cell(before)} ({before}) {ratio_before:9.2f}x {ratio_two:9.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,transformer", help="comma-separated: mlp, transformer")
    p.add_argument("--engines", default="local,ray", help="comma-separated: local, ray")
    p.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per configuration (default 7; quick 3)"
    )
    p.add_argument("--cohort", type=int, default=20, help="clients trained every round (default 20)")
    p.add_argument("--ray-workers", type=int, default=2)
    p.add_argument("--ray-cpus", type=float, default=1.0, help="CPUs per Ray worker (default 1)")
    p.add_argument("--quick", action="store_true", help="3 rounds, a cohort of 8")
    args = p.parse_args(argv)
    if args.quick:
        args.cohort = min(args.cohort, 8)
    rounds = args.rounds or (3 if args.quick else 7)
    models = [m for m in args.models.split(",") if m]
    engines = [e for e in args.engines.split(",") if e]
    default_threads = torch.get_num_threads()
    print(
        f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {default_threads} torch threads by default "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), load average "
        f"{os.getloadavg()[0]:.2f} at start"
    )
    print(
        f"cohort of {args.cohort} clients a round, median of {rounds} timed rounds after 1 warm-up; Ray: "
        f"{args.ray_workers} workers x {args.ray_cpus:g} CPUs"
    )
    results: list[str] = []
    whys: set[str] = set()
    owns = False  # Ray is started (once) when its first configuration runs
    try:
        for model in models:
            t = time.perf_counter()
            data, settings, cohort = workload(model, args)
            print(f"[{model}] data prepared in {time.perf_counter() - t:.1f} s (not timed)", flush=True)
            for engine in engines:
                # vmap's missing batching rules, once per process: not news here
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*batching rule.*")
                    if engine == "local":
                        res, before = time_local(data, settings, cohort, rounds), default_threads
                    else:
                        from fedsim.engine.ray_engine import init_ray

                        owns = init_ray(num_cpus=max(1, math.ceil(args.ray_workers * args.ray_cpus))) or owns
                        res = time_ray(data, settings, cohort, rounds, args.ray_workers, args.ray_cpus)
                        before = max(1, math.floor(args.ray_cpus))
                for path in PATHS:
                    line = row(engine, model, path, res[path], before)
                    results.append(line)
                    print("  " + line, flush=True)
                    if "auto" in res[path]:
                        whys.add(f"{engine} {path}: {res[path]['auto'][0]} ({res[path]['auto'][1]})")
    finally:
        if owns:
            import ray

            ray.shutdown()
    print(
        f"\nload average {os.getloadavg()[0]:.2f} at the end; seconds per round (median), ratios above 1 favour"
    )
    print("the denominator: before/auto > 1 means auto is faster than fedsim's old default")
    print(
        f"{'engine':6s} {'model':12s} {'path':10s} {'1 thread':>9s} {'2 threads':>9s} {'auto':>9s} {'(n)':3s} "
        f"{'before':>9s} {'(n)':3s} {'before/auto':>10s} {'2 thr/1 thr':>10s}"
    )
    for line in results:
        print(line)
    print("\nauto's choices:")
    for why in sorted(whys):
        print(f"  {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
