"""Language-model benchmark: the training paths and fedsim's RayEngine vs Flower's Simulation Engine, on LEAF's
Shakespeare with the LSTM and with a small Transformer, side by side in one run.

Workload: the shipped scenarios ``shakespeare-lstm`` and ``shakespeare-transformer`` (their data options, model,
local training and DP settings: next-character prediction on 80-character windows, at most 64 per role, 1 local
epoch of batch 16, plain SGD, clip 1, noise multiplier 0.5), resized: 900 roles as clients (no held-out clients),
Poisson sampling with 100 expected clients per round, 8 rounds (``--quick``: 100 clients, 10 a round, 5 rounds).
The LSTM is LEAF's with 2 x 64 units (``nn.LSTM``), the Transformer 2 ``nn.TransformerEncoderLayer`` (4 heads,
``nn.MultiheadAttention``).

For each model (``--models``):

* training paths: client updates per second of one worker (1 process, 1 thread) training the same cohort of 100
  clients (``--quick``: 10) on the per-layer rules, on ``torch.func`` vmap and on the per-client loop, the median
  of several timed rounds (the paths taking turns round by round), and the vectorised paths' speed-up over the
  loop (target stated by the issue: at least 5x). A path fedsim cannot take for the model is ``n/a (reason)``,
  the reason as fedsim gives it;
* end to end: fedsim's ``run_scenario`` on the Ray engine (2 workers x 1 CPU) with ``engine.vectorize = "auto"``
  and ``"loop"``, and Flower's ``flwr.simulation.run_simulation`` (2 CPUs, 1 CPU per ClientApp, a plain PyTorch
  ClientApp training the same model) with Flower's own ``DifferentialPrivacyServerSideFixedClipping`` wrapping
  ``FedAvg`` (the same clip and noise multiplier, ``fraction_train`` = 100 of the clients): steady-state s/round
  and updates/s (rounds after the first 3, the last round's evaluation excluded), end-to-end time, and the
  ratios. Each fedsim row names the training path its workers took (and why they refused faster ones, as
  ``summary.json``'s ``local_training_fallbacks`` says) and what its rounds' clients ran on.

The pieces are benchmarks/engine.py's (:func:`engine.run_fedsim`, :func:`engine.run_flower`,
:func:`engine.path_rates`). Data preparation (parsing the plays, or reading them from fedsim's cache, and
windowing) is done once per model before anything is timed, excluded from every figure, and printed separately.

    python benchmarks/language.py                       # full size (10-15 minutes on 2 cores)
    python benchmarks/language.py --quick               # smoke run (a couple of minutes)
    python benchmarks/language.py --models lstm --skip-flower --rounds 6
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine as bench  # benchmarks/engine.py; it sets the offline environment before any flwr / ray import

MODELS = {"lstm": "shakespeare-lstm", "transformer": "shakespeare-transformer"}
TARGET = 5.0  # the target: vectorised paths at least 5x the per-client loop, 100 clients a round
_VMAP_FALLBACK = re.compile(r"batching rule for (aten::\w+)")


# ---------------------------------------------------------------- workload
def workload(args: argparse.Namespace, model: str) -> tuple[Any, dict[str, Any]]:
    """The shipped scenario of ``model`` resized for the benchmark, and its figures as engine.py's workload
    dict (what :func:`engine.run_flower` reads)."""
    from fedsim.scenarios import load_scenario

    if args.quick:
        size = {"num_clients": 100, "per_round": 10, "rounds": args.rounds or 5, "cohort": 10, "reps": 3}
    else:
        size = {"num_clients": 900, "per_round": 100, "rounds": args.rounds or 8, "cohort": 100, "reps": 5}
    sc = load_scenario(
        MODELS[model],
        [
            f"rounds={size['rounds']}",
            f"data.num_clients={size['num_clients']}",
            "data.heldout_fraction=0.0",
            "privacy.sampling=poisson",
            "privacy.sampling_rate=none",
            f"privacy.clients_per_round={size['per_round']}",
            "engine.name=ray",
            "engine.num_workers=2",
            "engine.num_cpus_per_worker=1.0",
            f"engine.eval_every={10**9}",
        ],
    )
    if sc.client.optimizer != "sgd":  # Flower's ClientApp here trains with plain SGD
        raise SystemExit(
            f"{MODELS[model]}: client.optimizer={sc.client.optimizer!r}; this benchmark needs sgd"
        )
    w = {
        **size,
        "model": sc.model.name,
        "model_kwargs": sc.model.options(),
        "epochs": sc.client.local_epochs,
        "batch": sc.client.batch_size,
        "lr": sc.client.lr,
        "clip": sc.privacy.clip,
        "z": sc.privacy.noise_multiplier,
        "seed": sc.seed,
    }
    return sc, w


def with_vectorize(sc: Any, vectorize: str) -> Any:
    return sc.model_copy(update={"engine": sc.engine.model_copy(update={"vectorize": vectorize})})


# ---------------------------------------------------------------- training paths
def paths(data: Any, w: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """:func:`engine.path_rates` on one thread, and the ops vmap ran one client at a time (no batching rule:
    PyTorch's performance warning, collected here instead of printed)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = bench.path_rates(data, w["model"], w["model_kwargs"], w, w["cohort"], w["reps"])
    finally:
        torch.set_num_threads(threads)
    unbatched = sorted({m[1] for c in caught if (m := _VMAP_FALLBACK.search(str(c.message)))})
    for c in caught:
        if not _VMAP_FALLBACK.search(str(c.message)):
            warnings.warn_explicit(c.message, c.category, c.filename, c.lineno)
    return res, unbatched


def print_paths(model: str, w: dict[str, Any], res: dict[str, dict[str, Any]], unbatched: list[str]) -> None:
    print(
        f"\n[{model}] training paths, one worker (1 process, 1 thread), a cohort of {w['cohort']} clients,"
        f" median of {w['reps']} rounds (the paths take turns round by round):"
    )
    print(f"  {'path':22s} {'updates/s':>10s} {'s/round':>9s} {'vs loop':>8s}")
    loop = res["loop"]["rate"]
    for path, r in res.items():
        if r["rate"] is None:
            print(f"  {path:22s} n/a ({r['reason']})")
            continue
        print(
            f"  {bench.path_label(path, r):22s} {r['rate']:10.1f} {r['s_round']:9.4f} {r['rate'] / loop:7.2f}x",
            flush=True,
        )
    if unbatched:
        print(f"  vmap has no batching rule for {', '.join(unbatched)}: it runs them one client at a time")


# ---------------------------------------------------------------- end to end
def fedsim_row(sc: Any, w: dict[str, Any], data: Any, vectorize: str) -> dict[str, Any]:
    r = bench.run_fedsim(w, data, vectorize != "loop", sc=with_vectorize(sc, vectorize))
    used = ",".join(r["used"]) or "?"
    r["name"] = f"fedsim Ray 2x1 CPU, vectorize={vectorize}"
    r["path_text"] = r["path"] if used == r["path"] else f"{r['path']} (ran: {used})"
    print(
        f"  done: {r['name']} -> {r['path_text']}: {r['s_round']:.4f} s/round, e2e {r['e2e']:.1f} s",
        flush=True,
    )
    return r


def flower_row(w: dict[str, Any], data: Any, model: str) -> dict[str, Any]:
    r = bench.run_flower(w, data, tag=f"language-{model}")
    r["name"] = "Flower sim + DP server-side fixed clip"
    r["path_text"] = "loop (plain PyTorch ClientApp)"
    print(f"  done: {r['name']}: {r['s_round']:.4f} s/round, e2e {r['e2e']:.1f} s", flush=True)
    return r


def print_engines(model: str, w: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(
        f"\n[{model}] end to end, {w['num_clients']} clients, Poisson {w['per_round']} expected a round,"
        f" {w['rounds']} rounds; steady state = mean over rounds {bench.STEADY_SKIP + 1}.. (the last round's"
        " evaluation excluded); end to end = engine start-up + all rounds + shutdown (fedsim's includes its"
        " final evaluation of every client, 'final eval s'; Flower evaluates nothing); startup: fedsim ="
        " run_scenario set-up + Ray start, Flower = until the ServerApp's first evaluate_fn call (its workers"
        " start during round 1)"
    )
    print(
        f"  {'engine':40s} {'training path':28s} {'updates/s':>10s} {'s/round':>9s} {'train s/rnd':>11s}"
        f" {'end-to-end s':>12s} {'startup s':>9s} {'final eval s':>12s}"
    )
    for r in rows:
        final = f"{r['final_eval_s']:.2f}" if "final_eval_s" in r else "-"
        print(
            f"  {r['name']:40s} {r['path_text']:28s} {r['updates_s']:10.2f} {r['s_round']:9.4f}"
            f" {r['train_s_round']:11.4f} {r['e2e']:12.1f} {r['startup']:9.1f}"
            f" {final:>12s}"
        )
    for r in rows:
        for reason in r.get("fallbacks") or ():
            print(f"  {r['name']}: fell back from {reason}")


# ---------------------------------------------------------------- summary
def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def summary(results: dict[str, dict[str, Any]]) -> None:
    models = list(results)
    width = 30
    print("\nratios, side by side (timings of this machine at this hour: see the load averages)")
    print(f"  {'':58s}" + "".join(f" {m:>{width}s}" for m in models))

    def line(label: str, cells: list[str]) -> None:
        print(f"  {label:58s}" + "".join(f" {c:>{width}s}" for c in cells))

    for path in ("per-layer", "vmap"):
        if any(results[m]["paths"] is None for m in models):
            break
        cells = []
        for m in models:
            res = results[m]["paths"]
            rate = res[path]["rate"]
            if rate is None:
                cells.append("n/a (see its paths table)")
                continue
            x = rate / res["loop"]["rate"]
            cells.append(f"{x:.2f}x {'PASS' if x >= TARGET else 'MISS'}")
        line(f"{path} / loop, updates/s, 1 thread (target >= {TARGET:g}x)", cells)
    engines = {m: results[m]["engines"] for m in models}
    if all(engines.values()):
        line(
            "fedsim path taken with vectorize=auto",
            [engines[m]["auto"]["path_text"] if "auto" in engines[m] else "-" for m in models],
        )
        line(
            "fedsim s/round, loop / auto (> 1: auto is faster)",
            [_ratio(e["loop"]["s_round"], e["auto"]["s_round"]) for e in engines.values()],
        )
        for key in ("auto", "loop") if any("flower" in e for e in engines.values()) else ():
            line(
                f"updates/s, fedsim {key} / Flower (steady state)",
                [
                    _ratio(e[key]["updates_s"], e["flower"]["updates_s"]) if "flower" in e else "-"
                    for e in engines.values()
                ],
            )
            line(
                f"end to end, Flower / fedsim {key}",
                [
                    _ratio(e["flower"]["e2e"], e[key]["e2e"]) if "flower" in e else "-"
                    for e in engines.values()
                ],
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.common_options(p, "default 8; quick: 5", "per-path updates/s of one worker")
    p.add_argument("--models", default="lstm,transformer", help="comma-separated, of: " + ", ".join(MODELS))
    p.add_argument("--skip-engines", action="store_true", help="skip the end-to-end runs (fedsim and Flower)")
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        p.error(f"--models: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(MODELS)}")
    if args.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    # vmap's "performance drop" warning, once per process and op, from every Ray worker: the paths table says it
    os.environ.setdefault("PYTHONWARNINGS", "ignore:There is a performance drop")
    print(
        f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} torch threads,"
        f" load average {os.getloadavg()[0]:.2f} at start,"
        f" RAY_worker_niceness={os.environ.get('RAY_worker_niceness', '(Ray default 15)')}"
    )
    from fedsim import experiment
    from fedsim.models import build_model, num_parameters

    results: dict[str, dict[str, Any]] = {}
    for model in models:
        sc, w = workload(args, model)
        print(f"\n=== {model} ({MODELS[model]}) workload: {w}")
        t = time.perf_counter()
        data = experiment.build_data(sc)
        sizes = data.num_examples_array(np.arange(data.num_clients))
        params = num_parameters(
            build_model(w["model"], data.input_shape, data.num_classes, **w["model_kwargs"])
        )
        print(
            f"data prepared once in {time.perf_counter() - t:.2f} s (excluded from every figure): "
            f"{data.num_clients} clients, {int(sizes.sum())} windows of {data.input_shape[0]} characters, "
            f"per client min {sizes.min()} median {np.median(sizes):.0f} max {sizes.max()}; "
            f"{w['model']}: {params:,} parameters",
            flush=True,
        )
        out: dict[str, Any] = {"paths": None, "engines": {}}
        if not args.skip_paths:
            res, unbatched = paths(data, w)
            print_paths(model, w, res, unbatched)
            out["paths"] = res
        if not args.skip_engines:
            eng = out["engines"]
            eng["auto"] = fedsim_row(sc, w, data, "auto")
            eng["loop"] = fedsim_row(sc, w, data, "loop")
            if not args.skip_flower:
                eng["flower"] = flower_row(w, data, model)
            print_engines(model, w, list(eng.values()))
        results[model] = out
    if not args.skip_paths or not args.skip_engines:
        summary(results)
    print(
        f"load average at the end: {os.getloadavg()[0]:.2f} (other processes on this machine skew all figures)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
