"""Engine benchmark: fedsim's RayEngine vs Flower's Simulation Engine, side by side in one run.

Workload: MNIST-1D generated with 50,000 examples over 1,000 clients (Dirichlet), an MLP with one hidden
layer of 100 units, Poisson sampling with 100 expected clients per round, 1 local epoch of batch 16, clip 1,
noise multiplier 1, 30 rounds.

* fedsim: ``run_scenario`` with the Ray engine on the same 2 CPUs: 2 workers x 1 CPU (the per-client loop,
  and ``vectorize = "auto"``, which takes the per-layer path for this MLP) and 1 worker x 2 CPUs (auto); the
  ratios use the fastest;
* Flower: ``flwr.simulation.run_simulation`` (2 CPUs, 1 CPU per ClientApp) with Flower's own
  ``DifferentialPrivacyServerSideFixedClipping`` wrapping ``FedAvg`` (fraction_train=0.1 of 1,000 nodes);
* floors: a plain single-process PyTorch loop and a plain single-process ``torch.func`` version.

Data generation and partitioning are done once, before any engine is timed, and are excluded from every
end-to-end figure (Flower's ClientApps load the same partition from an ``.npz`` file; fedsim gets the
same ``FederatedData`` object); their time is printed separately.

Also: client updates per second of the Conv2d CNN on the digits (1x8x8 images) and of CNN1D on MNIST-1D on
each training path (per-layer rules, torch.func vmap, per-client loop), one worker, one thread.

    python benchmarks/engine.py                 # full size (several minutes)
    python benchmarks/engine.py --quick         # smoke run
    python benchmarks/engine.py --skip-flower --rounds 10
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from typing import Any

# ---------------------------------------------------------------- environment (before flwr / ray imports)
from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-bench-")
_TMP = tempfile.mkdtemp(prefix="fedsim-bench-")  # the benchmark's own files (partitions, timestamps)

import numpy as np
import torch

STEADY_SKIP = 3  # rounds excluded from the steady state


# ---------------------------------------------------------------- workload
def workload(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        size = {"num_samples": 5000, "num_clients": 100, "per_round": 10, "rounds": args.rounds or 6}
    else:
        size = {"num_samples": 50_000, "num_clients": 1000, "per_round": 100, "rounds": args.rounds or 30}
    return {
        **size,
        "alpha": 0.5,
        "hidden": 100,
        "epochs": 1,
        "batch": 16,
        "lr": 0.1,
        "clip": 1.0,
        "z": 1.0,
        "seed": 0,
    }


def build_data(w: dict[str, Any]) -> Any:
    from fedsim.data import build_federated_data

    return build_federated_data(
        "mnist1d",
        num_clients=w["num_clients"],
        partitioner="dirichlet",
        alpha=w["alpha"],
        heldout_fraction=0.0,
        num_samples=w["num_samples"],
        seed=w["seed"],
    )


def scenario(w: dict[str, Any], vectorize: bool, engine: str = "ray", workers: int = 2) -> Any:
    from fedsim.scenarios import Scenario

    return Scenario.model_validate(
        {
            "name": "bench-engine",
            "seed": w["seed"],
            "rounds": w["rounds"],
            "data": {
                "dataset": "mnist1d",
                "num_clients": w["num_clients"],
                "partitioner": "dirichlet",
                "alpha": w["alpha"],
                "heldout_fraction": 0.0,
                "num_samples": w["num_samples"],
            },
            "model": {"name": "mlp", "hidden": [w["hidden"]]},
            "client": {
                "local_epochs": w["epochs"],
                "batch_size": w["batch"],
                "lr": w["lr"],
                "optimizer": "sgd",
            },
            "privacy": {
                "sampling": "poisson",
                "clients_per_round": w["per_round"],
                "clip": w["clip"],
                "noise_multiplier": w["z"],
                "accountant": "pld",
            },
            "engine": {
                "name": engine,
                "num_workers": workers,
                "num_cpus_per_worker": 2.0 / workers,
                "vectorize": "auto" if vectorize else "loop",
                "eval_every": 10**9,
            },
        }
    )


def steady(times: list[float]) -> float:
    t = times[STEADY_SKIP:] or times
    return float(np.mean(t)) if t else math.nan


# ---------------------------------------------------------------- fedsim
def run_fedsim(
    w: dict[str, Any],
    data: Any,
    vectorize: bool,
    engine: str = "ray",
    workers: int = 2,
    sc: Any = None,
) -> dict[str, Any]:
    """One ``run_scenario`` on the prepared ``data``: ``sc`` (default: :func:`scenario`'s MLP on MNIST-1D).

    Besides the timings, the training path the engine's trainers took (``path``), why they refused the faster
    ones (``fallbacks``, as ``summary.json`` publishes them) and what the rounds' clients ran on (``used``)."""
    import ray

    from fedsim import experiment
    from fedsim.engine import runner

    sc = scenario(w, vectorize, engine, workers) if sc is None else sc
    original, build_engine = experiment.build_data, runner.build_engine
    started: list[Any] = []

    def capture(*a: Any, **k: Any) -> Any:  # the engine run_scenario starts: it says which path it took
        started.append(build_engine(*a, **k))
        return started[-1]

    experiment.build_data = lambda _s: data  # the prepared data (its preparation is timed separately)
    runner.build_engine = capture
    t0 = time.perf_counter()
    try:
        res = runner.run_scenario(sc, write=False)
    finally:
        experiment.build_data, runner.build_engine = original, build_engine
    e2e = time.perf_counter() - t0
    if ray.is_initialized():
        ray.shutdown()
    rows = res.rows
    # the last round always evaluates the model (run_scenario); keep it out of the steady state
    body = rows[:-1] if len(rows) > STEADY_SKIP + 1 else rows
    rt = [r["non_private"]["round_time_s"] for r in body]
    tt = [r["non_private"]["train_time_s"] for r in body]
    cohorts = [r["non_private"]["cohort"] for r in body]
    s = steady(rt)
    eng = started[0] if started else None
    path = str(getattr(eng, "training_path", None) or (rows[0].get("local_training") if rows else None))
    used = sorted(
        {u for r in rows for u in str(r["non_private"].get("local_training_used", "")).split(",") if u}
    )
    last = rows[-1]["non_private"] if rows else {}
    return {
        "name": (f"fedsim Ray {workers}x{2 // workers} CPU" if engine == "ray" else "fedsim Local (1 proc)")
        + f" ({f'auto: {path}' if vectorize else 'loop'})",
        "s_round": s,
        "train_s_round": steady(tt),
        "updates_s": float(np.mean(cohorts[STEADY_SKIP:] or cohorts)) / s,
        "e2e": e2e,
        "startup": res.timings.get("setup_s", 0.0) + res.timings.get("engine_start_s", 0.0),
        "first": float(sum(rt[:STEADY_SKIP])),
        "rounds": len(rows),
        "path": path,
        "fallbacks": tuple(getattr(eng, "training_fallbacks", None) or ()),
        "used": used,
        # the last round's evaluation of the model (every training client: diagnostics), in the end-to-end time
        "final_eval_s": float(last.get("round_time_s", math.nan) - last.get("train_time_s", math.nan)),
    }


# ---------------------------------------------------------------- Flower
def _bench_cache() -> dict:
    """A per-process cache that survives however Flower ships the ClientApp (by reference or by value)."""
    import types

    mod = sys.modules.get("_fedsim_bench_cache")
    if mod is None:
        mod = types.ModuleType("_fedsim_bench_cache")
        mod.store = {}  # type: ignore[attr-defined]
        sys.modules["_fedsim_bench_cache"] = mod
    return mod.store  # type: ignore[attr-defined]


def flower_model(w: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The model both engines train: ``w["model"]`` with ``w["model_kwargs"]``, else the MLP of ``w["hidden"]``."""
    if "model" in w:
        return str(w["model"]), dict(w.get("model_kwargs", {}))
    return "mlp", {"hidden": [w["hidden"]]}


def make_flower_client_app():
    """Our ClientApp: trains the workload's model (:func:`flower_model`) on its partition (``partition-id``) with
    plain SGD, returns the whole model."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        import json

        import numpy as np
        import torch

        from fedsim.models import build_model

        cache = _bench_cache()
        path = os.environ["FEDSIM_BENCH_DATA"]
        if cache.get("path") != path:
            torch.set_num_threads(1)
            z = np.load(path)
            cache.clear()
            cache["path"], cache["data"] = path, {k: z[k] for k in z.files}
        d = cache["data"]
        pid = int(context.node_config["partition-id"])
        x = torch.as_tensor(d["x"][d["offsets"][pid] : d["offsets"][pid + 1]])
        y = torch.as_tensor(d["y"][d["offsets"][pid] : d["offsets"][pid + 1]])
        lr, batch, epochs = float(d["lr"]), int(d["batch"]), int(d["epochs"])
        model = cache.get("model")
        if model is None:
            kwargs = json.loads(str(d["model_kwargs"]))
            shape = tuple(int(v) for v in d["input_shape"])
            model = cache["model"] = build_model(str(d["model"]), shape, int(d["num_classes"]), **kwargs)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        n = int(y.shape[0])
        model.train()
        for _ in range(epochs):
            order = torch.randperm(n)
            for s in range(0, n, batch):
                idx = order[s : s + batch]
                opt.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                opt.step()
        content = RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": n})}
        )
        return Message(content=content, reply_to=msg)

    return app


def make_flower_server_app(
    w: dict[str, Any], stamps_path: str, input_shape: tuple[int, ...] = (40,), num_classes: int = 10
):
    from flwr.app import ArrayRecord, Context, MetricRecord
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from fedsim.models import build_model

    app = ServerApp()
    name, kwargs = flower_model(w)

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(w["seed"])
        model = build_model(name, input_shape, num_classes, **kwargs)
        fedavg = FedAvg(
            fraction_train=w["per_round"] / w["num_clients"],
            fraction_evaluate=0.0,
            min_train_nodes=w["per_round"],
            min_evaluate_nodes=0,
            min_available_nodes=w["num_clients"],
        )
        strategy = DifferentialPrivacyServerSideFixedClipping(
            fedavg, noise_multiplier=w["z"], clipping_norm=w["clip"], num_sampled_clients=w["per_round"]
        )

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            with open(stamps_path, "a") as f:
                f.write(f"{server_round} {time.time()}\n")
            return None

        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=w["rounds"],
            evaluate_fn=evaluate_fn,
        )

    return app


def run_flower(w: dict[str, Any], data: Any, tag: str = "partition") -> dict[str, Any]:
    """Flower's Simulation Engine on the prepared ``data`` (client ``c`` is the node of ``partition-id`` c), the
    workload's model (:func:`flower_model`) wrapped in Flower's server-side fixed-clipping DP strategy."""
    import json
    import logging

    import ray
    from flwr.simulation import run_simulation

    path = os.path.join(_TMP, f"{tag}.npz")
    clients = [data.client_data(c) for c in range(data.num_clients)]
    name, kwargs = flower_model(w)
    np.savez(
        path,
        x=np.concatenate([x for x, _ in clients]),
        y=np.concatenate([y for _, y in clients]),
        offsets=np.concatenate([[0], np.cumsum([len(y) for _, y in clients])]).astype(np.int64),
        model=name,
        model_kwargs=json.dumps(kwargs),
        input_shape=np.asarray(data.input_shape, dtype=np.int64),
        num_classes=data.num_classes,
        lr=w["lr"],
        batch=w["batch"],
        epochs=w["epochs"],
    )
    os.environ["FEDSIM_BENCH_DATA"] = path
    stamps = os.path.join(_TMP, f"{tag}-flower-stamps.txt")
    if os.path.exists(stamps):
        os.remove(stamps)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    wall0 = time.time()
    run_simulation(
        server_app=make_flower_server_app(w, stamps, tuple(data.input_shape), data.num_classes),
        client_app=make_flower_client_app(),
        num_supernodes=w["num_clients"],
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "num_gpus": 0},
        },
    )
    e2e = time.perf_counter() - t0
    if ray.is_initialized():
        ray.shutdown()
    marks = []
    if os.path.exists(stamps):
        with open(stamps) as fh:
            marks = sorted((int(a), float(b)) for a, b in (ln.split() for ln in fh if ln.strip()))
    ts = [b for _, b in marks]
    per_round = list(np.diff(ts))
    if len(per_round) < w["rounds"]:
        print(f"WARNING: Flower completed {len(per_round)} of {w['rounds']} rounds", flush=True)
    s = steady(per_round)
    return {
        "name": "Flower sim + DP server-side fixed clipping",
        "s_round": s,
        "train_s_round": s,
        "updates_s": w["per_round"] / s,
        "e2e": e2e,
        "startup": ts[0] - wall0 if ts else math.nan,
        "first": float(sum(per_round[:STEADY_SKIP])),
        "rounds": len(per_round),
    }


# ---------------------------------------------------------------- floors
class _Floor:
    """Shared set-up of the floors: the client tensors in memory, the same sampling and noise rule."""

    def __init__(self, w: dict[str, Any], data: Any) -> None:
        from fedsim.models import build_model

        self.w, self.data = w, data
        self.ids = np.arange(data.num_clients)
        self.q = w["per_round"] / data.num_clients
        self.xs = [torch.as_tensor(data.client_data(int(c))[0]) for c in self.ids]
        self.ys = [torch.as_tensor(data.client_data(int(c))[1]) for c in self.ids]
        torch.manual_seed(w["seed"])
        self.model = build_model("mlp", data.input_shape, data.num_classes, hidden=[w["hidden"]])
        self.params = list(self.model.parameters())
        self.flat = torch.nn.utils.parameters_to_vector(self.params).detach().clone()
        self.rng = np.random.default_rng(123)
        self.gen = torch.Generator().manual_seed(123)

    def cohort(self) -> np.ndarray:
        return self.ids[self.rng.random(self.ids.size) < self.q]

    def finish(self, total: torch.Tensor) -> None:
        noise = torch.randn(total.shape, generator=self.gen) * (self.w["z"] * self.w["clip"])
        self.flat += (total + noise) / self.w["per_round"]


def floor_loop(w: dict[str, Any], data: Any, rounds: int) -> dict[str, Any]:
    f = _Floor(w, data)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, cohorts = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        cohort = f.cohort()
        total = torch.zeros_like(f.flat)
        for c in cohort:
            torch.nn.utils.vector_to_parameters(f.flat.clone(), f.params)
            opt = torch.optim.SGD(f.params, lr=w["lr"])
            x, y = f.xs[c], f.ys[c]
            n = y.shape[0]
            for _e in range(w["epochs"]):
                order = torch.randperm(n, generator=f.gen)
                for s in range(0, n, w["batch"]):
                    idx = order[s : s + w["batch"]]
                    opt.zero_grad()
                    loss_fn(f.model(x[idx]), y[idx]).backward()
                    opt.step()
            delta = torch.nn.utils.parameters_to_vector(f.params).detach() - f.flat
            total += delta * min(1.0, w["clip"] / (float(delta.norm()) + 1e-12))
        f.finish(total)
        times.append(time.perf_counter() - t)
        cohorts.append(cohort.size)
    s = steady(times)
    return {
        "name": "floor: plain PyTorch loop (1 proc, 1 thr)",
        "s_round": s,
        "train_s_round": s,
        "updates_s": float(np.mean(cohorts[STEADY_SKIP:])) / s,
        "e2e": math.nan,
        "startup": math.nan,
        "first": float(sum(times[:STEADY_SKIP])),
        "rounds": rounds,
    }


def floor_func(w: dict[str, Any], data: Any, rounds: int) -> dict[str, Any]:
    from torch.func import functional_call, grad, vmap

    f = _Floor(w, data)
    names = [n for n, _ in f.model.named_parameters()]
    shapes = [p.shape for p in f.params]
    numels = [p.numel() for p in f.params]
    bsz = w["batch"]

    def loss(p, x, y, m):
        out = functional_call(f.model, p, (x,))
        return (torch.nn.functional.cross_entropy(out, y, reduction="none") * m).sum() / m.sum().clamp_min(1)

    step = vmap(grad(loss))
    times, cohorts = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        cohort = f.cohort()
        k = cohort.size
        x_all = torch.cat([f.xs[c] for c in cohort])
        y_all = torch.cat([f.ys[c] for c in cohort])
        sizes = [f.ys[c].shape[0] for c in cohort]
        n_steps = max(math.ceil(n / bsz) for n in sizes)
        params = {
            nm: t_.reshape(sh).expand(k, *sh).clone()
            for nm, t_, sh in zip(names, torch.split(f.flat, numels), shapes, strict=True)
        }
        for _e in range(w["epochs"]):
            idx = torch.zeros(k, n_steps * bsz, dtype=torch.long)
            msk = torch.zeros(k, n_steps * bsz)
            off = 0
            for j, n in enumerate(sizes):
                idx[j, :n] = torch.randperm(n, generator=f.gen) + off
                msk[j, :n] = 1
                off += n
            idx = idx.view(k, n_steps, bsz)
            msk = msk.view(k, n_steps, bsz)
            for s in range(n_steps):
                bi = idx[:, s]
                g = step(params, x_all[bi], y_all[bi], msk[:, s])
                for nm in names:
                    params[nm].sub_(g[nm], alpha=w["lr"])  # a client with no real example has zero grad
        delta = torch.cat([params[nm].reshape(k, -1) for nm in names], 1) - f.flat
        scale = (w["clip"] / (delta.norm(dim=1) + 1e-12)).clamp(max=1.0)
        f.finish((delta * scale[:, None]).sum(0))
        times.append(time.perf_counter() - t)
        cohorts.append(k)
    s = steady(times)
    return {
        "name": "floor: plain torch.func vmap (1 proc, 1 thr)",
        "s_round": s,
        "train_s_round": s,
        "updates_s": float(np.mean(cohorts[STEADY_SKIP:])) / s,
        "e2e": math.nan,
        "startup": math.nan,
        "first": float(sum(times[:STEADY_SKIP])),
        "rounds": rounds,
    }


# ---------------------------------------------------------------- training paths
PATHS = ("per-layer", "vmap", "loop")


def path_rates(
    data: Any,
    model: str,
    model_kwargs: dict[str, Any],
    w: dict[str, Any],
    cohort: int,
    reps: int,
) -> dict[str, dict[str, Any]]:
    """Client updates per second of one worker (the calling process, as many torch threads as it has) training
    the same ``cohort`` clients of ``data`` with the same SGD on each training path of :data:`PATHS`; the median
    of ``reps`` timed rounds after one warm-up round, the paths taking turns round by round, so that a machine
    that slows down slows them all.

    Per path: ``rate`` (updates/s), ``s_round`` (median seconds), ``times``, ``used`` (what the clients' metrics
    say they ran on: a vectorised chunk that raises is trained again on the loop); a path that cannot train the
    model has ``rate`` None and ``reason``: why, as fedsim says it (the ``ValueError`` of ``engine.vectorize``
    naming that path)."""
    from fedsim.models import MODEL_FACTORIES
    from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights

    cids = [int(c) for c in data.train_clients[:cohort]]
    out: dict[str, dict[str, Any]] = {}
    trainers = {}
    for path in PATHS:
        s = TrainSettings(
            model=MODEL_FACTORIES.get(model, model),
            model_kwargs=dict(model_kwargs),
            local_epochs=w["epochs"],
            batch_size=w["batch"],
            lr=w["lr"],
            seed=0,
            vectorize=path,
        )
        try:
            trainer = ClientTrainer(data, s, device="cpu")
        except ValueError as exc:  # this path cannot train this model: fedsim says why
            reason = str(exc).split("cannot train this model: ", 1)[-1]
            out[path] = {"rate": None, "s_round": None, "times": [], "used": [], "reason": reason}
            continue
        weights = initial_weights(s, data.input_shape, data.num_classes)
        trainer.train(ClientPlan(1, cids, w["clip"]), weights)  # warm-up (first-call costs)
        trainers[path] = (trainer, weights)
        out[path] = {"times": [], "used": set(), "reason": None}
    for r in range(reps):
        for path, (trainer, weights) in trainers.items():
            t = time.perf_counter()
            _, metrics = trainer.train(ClientPlan(2 + r, cids, w["clip"]), weights)
            out[path]["times"].append(time.perf_counter() - t)
            out[path]["used"] |= {str(m.get("trainer")) for m in metrics}
    for path in trainers:
        o = out[path]
        o["s_round"] = float(np.median(o["times"]))
        o["rate"] = len(cids) / o["s_round"]
        o["used"] = sorted(o["used"])
    return out


def path_label(path: str, r: dict[str, Any]) -> str:
    """``path``, and what its clients ran on when that differs (a chunk retried on the loop)."""
    used = r.get("used") or []
    return path if not used or used == [path] else f"{path} (ran: {','.join(used)})"


def paths_report(w: dict[str, Any], cohort: int, reps: int) -> None:
    """Client updates per second of one worker (1 process, 1 thread) training a cohort, per training path:
    the Conv2d CNN on the digits as 1x8x8 images and CNN1D on MNIST-1D, each on the per-layer path, on vmap and
    on the per-client loop (the same clients, the same SGD; only the path differs)."""
    from fedsim.data import build_federated_data

    cases = [
        ("cnn2d", build_federated_data("digits", num_clients=max(cohort, 100), partitioner="iid", seed=0)),
        (
            "cnn1d",
            build_federated_data(
                "mnist1d",
                num_clients=w["num_clients"],
                partitioner="dirichlet",
                alpha=w["alpha"],
                num_samples=w["num_samples"],
                seed=w["seed"],
                heldout_fraction=0.0,
            ),
        ),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(
        f"\ntraining paths, one worker (1 process, 1 thread), cohort of {cohort} clients, median of {reps} rounds"
        " (the paths take turns round by round):"
    )
    print(f"{'model':8s} {'data':18s} {'path':10s} {'updates/s':>10s} {'s/round':>9s}")
    try:
        for model, data in cases:
            res = path_rates(data, model, {}, w, cohort, reps)
            label = f"{data.dataset} {'x'.join(map(str, data.input_shape))}"
            for path, r in res.items():
                if r["rate"] is None:
                    print(f"{model:8s} {label:18s} {path:10s} n/a ({r['reason']})", flush=True)
                    continue
                print(
                    f"{model:8s} {label:18s} {path_label(path, r):10s} {r['rate']:10.1f} {r['s_round']:9.4f}",
                    flush=True,
                )
            for path in ("per-layer", "vmap"):
                rate = res[path]["rate"]
                speed = "n/a" if rate is None else f"{rate / res['loop']['rate']:.2f}x"
                print(f"{'':8s} {'':18s} {path:10s} speed-up over the loop: {speed}")
    finally:
        torch.set_num_threads(threads)


def common_options(p: argparse.ArgumentParser, rounds: str, paths: str) -> None:
    """The options this benchmark shares with benchmarks/language.py."""
    p.add_argument("--rounds", type=int, default=None, help=f"rounds per engine ({rounds})")
    p.add_argument("--skip-flower", action="store_true", help="do not run Flower's Simulation Engine")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--skip-paths", action="store_true", help=f"skip the {paths}")
    p.add_argument(
        "--worker-niceness",
        type=int,
        default=None,
        help="set RAY_worker_niceness for both engines (Ray's default: 15, which starves Ray workers "
        "on a machine shared with other busy processes)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_options(p, "default 30; quick: 6", "per-path report of the CNNs")
    args = p.parse_args(argv)
    if args.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    w = workload(args)
    print(f"workload: {w}")
    print(
        f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} torch threads,"
        f" load average {os.getloadavg()[0]:.2f} at start,"
        f" RAY_worker_niceness={os.environ.get('RAY_worker_niceness', '(Ray default 15)')}"
    )
    t = time.perf_counter()
    data = build_data(w)
    sizes = data.num_examples_array(np.arange(data.num_clients))
    print(
        f"data prepared once in {time.perf_counter() - t:.1f} s (excluded from end-to-end figures); "
        f"examples per client min {sizes.min()} median {np.median(sizes):.0f} max {sizes.max()}",
        flush=True,
    )

    results = []
    for vec in (False, True):
        r = run_fedsim(w, data, vec)
        print(f"  done: {r['name']}: {r['s_round']:.4f} s/round, e2e {r['e2e']:.1f} s", flush=True)
        results.append(r)
    # one actor holding both CPUs (2 torch threads): one Ray dispatch a round instead of two
    r = run_fedsim(w, data, True, workers=1)
    print(f"  done: {r['name']}: {r['s_round']:.4f} s/round, e2e {r['e2e']:.1f} s", flush=True)
    results.append(r)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = run_fedsim(w, data, True, engine="local")
    finally:
        torch.set_num_threads(threads)
    print(f"  done: {local['name']}: {local['s_round']:.4f} s/round, e2e {local['e2e']:.1f} s", flush=True)
    flower = None
    if not args.skip_flower:
        flower = run_flower(w, data)
        print(
            f"  done: {flower['name']}: {flower['s_round']:.4f} s/round, e2e {flower['e2e']:.1f} s",
            flush=True,
        )
        results.append(flower)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # single process, single thread: OpenMP threads thrash on a busy 2-core machine
    try:
        loop = floor_loop(w, data, w["rounds"])
        func = floor_func(w, data, w["rounds"])
    finally:
        torch.set_num_threads(threads)
    results += [local, loop, func]

    print(
        f"\nsteady state = mean over rounds {STEADY_SKIP + 1}..; end to end = engine start-up + all rounds"
        " + shutdown; startup: fedsim = run_scenario set-up + Ray start, Flower = until the ServerApp's first"
        " evaluate_fn call (its workers start during round 1)"
    )
    print(
        f"{'engine':46s} {'updates/s':>10s} {'s/round':>9s} {'train s/rnd':>11s} {'end-to-end s':>12s}"
        f" {'startup s':>9s} {'rounds 1-3 s':>12s}"
    )
    for r in results:
        print(
            f"{r['name']:46s} {r['updates_s']:10.1f} {r['s_round']:9.4f} {r['train_s_round']:11.4f}"
            f" {r['e2e']:12.1f} {r['startup']:9.1f} {r['first']:12.3f}"
        )

    best = min(results[:3], key=lambda r: r["s_round"])
    print(f"\nfedsim configuration used for the ratios: {best['name']}")
    if flower is not None:
        up = best["updates_s"] / flower["updates_s"]
        e2e = flower["e2e"] / best["e2e"]
        print(
            f"  updates/s, fedsim / Flower (steady state) : {up:7.1f}x  target >= 40x  {'PASS' if up >= 40 else 'MISS'}"
        )
        print(
            f"  end to end, Flower / fedsim               : {e2e:7.1f}x  target >= 4x   {'PASS' if e2e >= 4 else 'MISS'}"
        )
    fl = best["s_round"] / func["s_round"]
    print(
        f"  s/round, fedsim / torch.func floor        : {fl:7.2f}x  target <= 1.5x {'PASS' if fl <= 1.5 else 'MISS'}"
    )
    print(
        f"  (fedsim engine-only train time / floor    : {best['train_s_round'] / func['s_round']:7.2f}x;"
        " the rest of a fedsim round is noise, server step and privacy accounting)"
    )
    print(f"  s/round, plain loop floor / torch.func floor: {loop['s_round'] / func['s_round']:7.2f}x")
    print(
        f"  s/round, fedsim LocalEngine (1 thread) / torch.func floor: {local['s_round'] / func['s_round']:7.2f}x"
        " (same run_scenario loop, no Ray)"
    )
    if not args.skip_paths:
        paths_report(w, cohort=w["per_round"], reps=3 if args.quick else 5)
    print(
        f"load average at the end: {os.getloadavg()[0]:.2f} (other processes on this machine skew all figures)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
