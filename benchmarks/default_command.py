"""The default command against its peers, side by side: every system through its own user-facing entry point, one
process each, timed from process start to exit, in interleaved repeats; medians and ratios printed at the end.

Workload (MNIST-1D, 50,000 examples over 1,000 clients with Dirichlet(0.5) labels, Poisson q = 0.1, an MLP
40-100-10, 1 local epoch of batch 16, lr 0.1, clip 1, noise multiplier 1, 30 rounds, no evaluation but the one a
system always does):

* **fedsim, default command**: ``fedsim run quickstart --set ...`` with the workload's settings and nothing about
  the engine (``engine.name = "auto"`` picks; the run's ``summary.json`` says which and why);
* **fedsim, in-process engine** (``--set engine.name=local``) and **fedsim, Ray engine**
  (``--set engine.name=ray``: 2 workers of 1 CPU);
* **Flower 1.42**: ``flwr.simulation.run_simulation`` with its ``DifferentialPrivacyServerSideFixedClipping``
  around ``FedAvg`` (``benchmarks/engine.py``'s ServerApp and ClientApp; 2 CPUs, 1 per ClientApp);
* **pfl-research** (where a Python with ``pfl`` is given, ``--pfl-python``): ``benchmarks/pfl_workload.py`` with 2
  worker processes (and 1).

Steady state: the median seconds per round over rounds 4..29 (fedsim: ``round_time_s`` of ``metrics.jsonl``, the
last round left out because it evaluates the model; Flower: the mean time between its ServerApp's per-round
callbacks over the same rounds, as ``benchmarks/engine.py`` measures it; pfl: its central iterations). End to end: process start to exit, data generation, imports, start-up,
every round and writing the results included (a fedsim run writes its run directory, plots included).

    python benchmarks/default_command.py                              # fedsim and Flower, 3 repeats
    python benchmarks/default_command.py --pfl-python /path/venv/bin/python
    python benchmarks/default_command.py --repeats 1 --skip-flower    # quick look

Run it alone: two CPU-heavy processes at once on a 2-core machine distort every figure. The machine's load is
printed at the start and before each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
STEADY_FIRST = 4  # rounds 1-3 warm up

WORKLOAD = [
    "data.dataset=mnist1d",
    "data.num_clients=1000",
    "data.num_samples=50000",
    "data.partitioner=dirichlet",
    "data.alpha=0.5",
    "data.heldout_fraction=0",
    "model.name=mlp",
    "model.hidden=[100]",
    "client.local_epochs=1",
    "client.batch_size=16",
    "client.lr=0.1",
    "privacy.sampling=poisson",
    "privacy.sampling_rate=0.1",
    "privacy.clip=1.0",
    "privacy.noise_multiplier=1.0",
    "server.lr=1.0",
    "engine.eval_every=1000000",
]


def _env() -> dict[str, str]:
    """This environment with fedsim's offline defaults where it does not set them (what ``fedsim`` itself sets)."""
    from fedsim.env import OFFLINE_DEFAULTS

    return {**OFFLINE_DEFAULTS, **os.environ}


def _timed(cmd: list[str], tmp: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        )
    return wall, r


def _steady(times: list[float]) -> float:
    t = times[STEADY_FIRST - 1 :]
    return float(np.median(t)) if t else float("nan")


def run_fedsim(label: str, engine: str | None, rounds: int, tmp: Path) -> dict[str, Any]:
    """``fedsim run`` as a user types it (the ``fedsim`` console script of this interpreter's environment)."""
    out = tmp / f"fedsim-{engine or 'default'}-{time.monotonic_ns()}"
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    cmd = [fedsim, "run", "quickstart", "--no-progress", "--out", str(out), "--set", f"rounds={rounds}"]
    for s in [*WORKLOAD, *([f"engine.name={engine}"] if engine else [])]:
        cmd += ["--set", s]
    wall, _ = _timed(cmd, tmp)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    times = [r["non_private"]["round_time_s"] for r in rows[:-1]]  # the last round evaluates the model
    timings = summary["non_private"]["timings"]
    return {
        "system": label,
        "s_round": _steady(times),
        "e2e": wall,
        "engine": summary.get("engine") or {},
        "startup": timings.get("startup_s", float("nan")),
        "engine_start": timings.get("engine_start_s", float("nan")),
        "epsilon": rows[-1]["epsilon"],
    }


def run_flower(rounds: int, tmp: Path) -> dict[str, Any]:
    """Flower's Simulation Engine in a process of its own (``--child flower``)."""
    out = tmp / f"flower-{time.monotonic_ns()}.json"
    wall, _ = _timed(
        [sys.executable, str(Path(__file__).resolve()), "--child-flower", str(out), "--rounds", str(rounds)],
        tmp,
    )
    r = json.loads(out.read_text())
    return {
        "system": "Flower 1.42 + DifferentialPrivacyServerSideFixedClipping",
        "s_round": r["s_round"],
        "e2e": wall,
    }


def _flower_child(out: str, rounds: int) -> int:
    sys.path.insert(0, str(HERE))
    import engine as bench  # benchmarks/engine.py: Flower's ServerApp and ClientApp for this workload

    w = bench.workload(argparse.Namespace(quick=False, rounds=rounds))
    data = bench.build_data(w)
    r = bench.run_flower(w, data)
    Path(out).write_text(json.dumps({"s_round": r["s_round"]}))
    return 0


def run_pfl(python: str, processes: int, rounds: int, tmp: Path) -> dict[str, Any]:
    """``benchmarks/pfl_workload.py``: its end to end runs from the workers' launch to their exit (imports, pfl's
    set-up, every round); its data generation (about 10 s here, done once by its launcher) is left out, as fedsim
    reads MNIST-1D from its cache (generated once) inside its end-to-end time."""
    out = tmp / f"pfl-{processes}-{time.monotonic_ns()}.json"
    cmd = [python, str(HERE / "pfl_workload.py"), "--processes", str(processes), "--rounds", str(rounds)]
    _timed([*cmd, "--threads", "1", "--json", str(out)], tmp)
    r = json.loads(out.read_text())
    return {
        "system": f"pfl-research 0.6, {processes} process{'es' if processes > 1 else ''} x 1 thread",
        "s_round": float(r["steady_s_round_median"]),
        "e2e": float(r["e2e_s"]),
        "note": r.get("cohort", ""),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every system (default 3)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--skip-flower", action="store_true")
    p.add_argument("--pfl-python", default=None, help="a Python interpreter with pfl-research installed")
    p.add_argument("--child-flower", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_flower:
        return _flower_child(args.child_flower, args.rounds)

    tmp = Path(tempfile.mkdtemp(prefix="fedsim-bench-"))
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="r", dir="/tmp"))
    os.environ.setdefault("FLWR_HOME", str(tmp / "flwr"))
    systems: list[tuple[str, Any]] = [
        ("fedsim default command", lambda: run_fedsim("fedsim default command", None, args.rounds, tmp)),
        (
            "fedsim in-process",
            lambda: run_fedsim("fedsim in-process (engine.name=local)", "local", args.rounds, tmp),
        ),
        (
            "fedsim Ray 2x1",
            lambda: run_fedsim("fedsim Ray 2 workers x 1 CPU (engine.name=ray)", "ray", args.rounds, tmp),
        ),
    ]
    if not args.skip_flower:
        systems.append(("Flower", lambda: run_flower(args.rounds, tmp)))
    if args.pfl_python:
        for n in (2, 1):
            systems.append((f"pfl {n}", lambda n=n: run_pfl(args.pfl_python, n, args.rounds, tmp)))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    results: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in systems}
    for rep in range(args.repeats):
        print(f"repeat {rep + 1}/{args.repeats} (load {os.getloadavg()[0]:.2f})", flush=True)
        for key, run in systems:
            r = run()
            results[key].append(r)
            print(f"  {r['system']:58s} {r['s_round']:.4f} s/round  {r['e2e']:6.1f} s end to end", flush=True)

    med = {
        k: {
            "s_round": float(np.median([r["s_round"] for r in v])),
            "e2e": float(np.median([r["e2e"] for r in v])),
        }
        for k, v in results.items()
    }
    print(
        f"\nmedians of {args.repeats} repeats (steady state: median of rounds {STEADY_FIRST}..{args.rounds - 1}):"
    )
    print(f"{'system':58s} {'s/round':>9s} {'end to end s':>13s}")
    for key, _ in systems:
        print(f"{results[key][0]['system']:58s} {med[key]['s_round']:9.4f} {med[key]['e2e']:13.1f}")
    engine = results["fedsim default command"][0]["engine"]
    print(f"\nthe default command ran on {engine.get('name')!r}: {engine.get('why')}")
    d = med["fedsim default command"]

    def ratio(text: str, value: float, target: str, ok: bool) -> None:
        print(f"  {text:58s} {value:7.2f}x  target {target:8s} {'PASS' if ok else 'MISS'}")

    if "Flower" in med:
        x = med["Flower"]["s_round"] / d["s_round"]
        ratio("steady state, default command vs Flower", x, ">= 40x", x >= 40)
    if "pfl 2" in med:
        x = med["pfl 2"]["s_round"] / d["s_round"]
        ratio("steady state, default command vs pfl-research 2 processes", x, ">= 5x", x >= 5)
        x = med["pfl 2"]["e2e"] / d["e2e"]
        ratio("end to end, pfl-research 2 processes / default command", x, ">= 1x", x >= 1)
    x = med["fedsim in-process"]["s_round"] / med["fedsim Ray 2x1"]["s_round"]
    ratio("steady state, Ray 2x1 CPU vs in-process (in-process / Ray)", x, ">= 1x", x >= 1)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
