"""Scale benchmark: a population of 1,000,000 Synthetic(1, 1) clients, 1,000 Poisson-sampled per round.

The round loop is fedsim's: ``DPFedAvg.begin_round`` (sample, fix the clip), the engine trains and clips
(a partial sum per worker), ``DPFedAvg.finish_round`` (noise, average, server step, accounting). Prints the
time of every round and the peak resident memory of this process and of all its descendants (Ray's GCS,
raylet and workers) against the 6 GB target.

Peak memory is measured three ways: a sampler that sums the current RSS (``/proc/<pid>/status`` VmRSS) of
the process tree every 0.2 s (the figure compared with the target), the sum of each process's own peak
(VmHWM; an upper bound, as the peaks need not coincide), and ``resource.getrusage`` ``ru_maxrss`` of self and
of waited-for children (Ray's processes are not waited for, so this misses them).

    python benchmarks/scale.py                        # RayEngine, 2 workers x 1 CPU, 5 rounds
    python benchmarks/scale.py --engine local --vectorize
    python benchmarks/scale.py --vectorize --per-round 10000 --rounds 3   # the load round: 10,000 clients
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-scale-")

import numpy as np

TARGET_GB = 6.0


# ---------------------------------------------------------------- memory of the process tree (no psutil)
def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(name))
    return out


def _tree(root: int) -> list[int]:
    kids = _children_map()
    todo, seen = [root], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeMemory:
    """Samples the summed RSS of this process and its descendants in a background thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_kb = 0
        self.hwm_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        pids = _tree(os.getpid())
        total = 0
        for p in pids:
            total += _status_kb(p, "VmRSS")
            self.hwm_kb[p] = max(self.hwm_kb.get(p, 0), _status_kb(p, "VmHWM"))
        self.peak_kb = max(self.peak_kb, total)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def gb(kb: float) -> float:
    return kb / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=1_000_000)
    p.add_argument("--per-round", type=int, default=1000, help="expected cohort (Poisson)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--engine", choices=["ray", "local"], default="ray")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="logreg", choices=["logreg", "mlp"])
    p.add_argument("--vectorize", action="store_true")
    args = p.parse_args(argv)

    from fedsim.data import build_federated_data
    from fedsim.models import MODEL_FACTORIES
    from fedsim.strategies import DPFedAvg
    from fedsim.training.trainer import TrainSettings, initial_weights

    mem = TreeMemory()
    with mem:
        t0 = time.perf_counter()
        data = build_federated_data(
            "synthetic", num_clients=args.clients, heldout_fraction=0.0, synthetic_alpha=1, synthetic_beta=1
        )
        train_ids = np.asarray(data.train_clients)
        settings = TrainSettings(
            model=MODEL_FACTORIES[args.model],
            model_kwargs={"hidden": [32]} if args.model == "mlp" else {},
            local_epochs=1,
            batch_size=16,
            lr=0.05,
            seed=0,
            vectorize="auto" if args.vectorize else "loop",
        )
        strategy = DPFedAvg(
            sampling="poisson",
            clients_per_round=args.per_round,
            clip=1.0,
            noise_multiplier=1.0,
            seed=0,
            population=int(train_ids.size),
        )
        weights = initial_weights(settings, data.input_shape, data.num_classes)
        t_data = time.perf_counter() - t0
        if args.engine == "ray":
            from fedsim.engine.ray_engine import RayEngine

            engine = RayEngine(data, settings, num_workers=args.workers, num_cpus=1.0)
        else:
            from fedsim.engine.ray_engine import LocalEngine

            engine = LocalEngine(data, settings, device="cpu")
        t_engine = time.perf_counter() - t0 - t_data
        print(
            f"population {data.num_clients:,} synthetic(1,1) clients, dim {data.input_dim}, model {args.model} "
            f"({weights.size} parameters), engine {args.engine}"
            + (f" ({args.workers} workers x 1 CPU)" if args.engine == "ray" else "")
            + f", vectorize={args.vectorize}"
        )
        print(
            f"set-up: data + strategy {t_data:.2f} s, engine start {t_engine:.2f} s, "
            f"tree RSS now {gb(mem.sample()):.2f} GB",
            flush=True,
        )
        print(
            f"{'round':>5s} {'cohort':>6s} {'examples':>9s} {'sample s':>8s} {'train s':>8s} {'finish s':>8s} "
            f"{'round s':>8s} {'tree RSS GB':>11s} {'epsilon':>8s}"
        )
        times = []
        try:
            for t in range(1, args.rounds + 1):
                a = time.perf_counter()
                plan = strategy.begin_round(t, train_ids)
                b = time.perf_counter()
                partial, metrics = engine.train(plan, weights)
                c = time.perf_counter()
                weights, m = strategy.finish_round(plan, weights, partial)
                d = time.perf_counter()
                times.append(d - a)
                examples = sum(int(x["num_examples"]) for x in metrics)
                print(
                    f"{t:5d} {plan.cohort.size:6d} {examples:9d} {b - a:8.3f} {c - b:8.3f} {d - c:8.3f} "
                    f"{d - a:8.3f} {gb(mem.sample()):11.2f} {m['epsilon']:8.4f}",
                    flush=True,
                )
        finally:
            hwm_sum = sum(mem.hwm_kb.values())
            nproc = len(mem.hwm_kb)
            engine.close()
    total = time.perf_counter() - t0
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak = gb(mem.peak_kb)
    print(f"rounds: mean {np.mean(times):.3f} s/round, total {sum(times):.2f} s; end to end {total:.2f} s")
    print(
        f"peak resident memory, process tree (sampled sum of RSS, {nproc} processes seen): {peak:.2f} GB "
        f"vs target {TARGET_GB:.0f} GB -> {'PASS' if peak <= TARGET_GB else 'MISS'}"
    )
    print(
        f"  sum of per-process peaks (VmHWM, upper bound): {gb(hwm_sum):.2f} GB; "
        f"ru_maxrss self {gb(self_kb):.2f} GB, largest waited-for child {gb(child_kb):.2f} GB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
