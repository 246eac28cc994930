"""`ray_address`: the engine joins an existing multi-node Ray cluster and trains clients on every node; docs/how-to/ray-cluster.md's
`ray start --head` / `ray start --address` / `fedsim run --set engine.ray_address=...` sequence, as typed."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from fedsim.engine.ray_engine import RayEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data
from fedsim.scenarios import load_scenario
from fedsim.training.trainer import TrainSettings


@pytest.fixture
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_clients_are_trained_on_both_nodes(two_node_cluster):
    scenario = load_scenario(
        "quickstart",
        [
            "rounds=2",
            "data.num_clients=12",
            "privacy.sampling=all",
            "privacy.sampling_rate=none",
            "engine.eval_every=2",
            f"engine.ray_address={two_node_cluster.address!r}",
        ],
    )
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    engine = RayEngine(data, settings, num_workers=2, num_cpus=1, address=scenario.engine.ray_address)
    try:
        assert len({info["node_id"] for info in engine.infos}) == 2  # one actor per 1-CPU node
        nodes = []
        result = run_scenario(scenario, write=False, engine=_Recording(engine, nodes))
    finally:
        engine.close()
    assert len(set(nodes)) == 2
    assert engine.training_path == "per-layer"  # the MLP's per-layer rules, on every node's workers
    assert {info["path"] for info in engine.infos} == {"per-layer"}
    assert all(
        r["non_private"]["received"] == r["non_private"]["cohort"] == len(data.train_clients)
        for r in result.rows
    )
    assert np.all(np.isfinite(result.weights))


class _Recording:
    """Wraps the engine to record which node trained each client."""

    def __init__(self, engine, nodes):
        self.engine, self.nodes = engine, nodes

    def train(self, plan, weights):
        partial, metrics = self.engine.train(plan, weights)
        self.nodes.extend(m["node"] for m in metrics)
        return partial, metrics

    def evaluate(self, ids, weights):
        return self.engine.evaluate(ids, weights)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_documented_ray_start_sequence_runs_a_scenario_on_the_cluster(tmp_path):
    """Two nodes started with Ray's own command line (each a foreground `ray start --block`, stopped by its PID),
    then `fedsim run` on the cluster: the summary says the Ray engine trained there, and both nodes' workers did."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # the nodes' own temporary folder (short: Ray's socket paths): `ray start` leaves the cluster's address there,
    # where a later ray.init() in this process would find it and try to join a cluster that is gone
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="r", dir="/tmp"),
    }
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    nodes = [
        subprocess.Popen(
            [ray_cli, "start", "--head", f"--port={port}", "--include-dashboard=false", *common],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        _wait_for_cpus(address, 1)
        nodes.append(
            subprocess.Popen(
                [ray_cli, "start", f"--address={address}", *common],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        _wait_for_cpus(address, 2)
        out = tmp_path / "run"
        r = subprocess.run(
            [
                str(Path(sys.executable).with_name("fedsim")),
                "run",
                "quickstart",
                "--no-progress",
                "--out",
                str(out),
                "--set",
                "rounds=2",
                "--set",
                f"engine.ray_address={address!r}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        for node in reversed(nodes):  # what this test started, by its process group
            try:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(node.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"]["name"] == "ray" and "ray_address" in summary["engine"]["why"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["local_training"] == "per-layer"
    assert "ray_start_s" in summary["non_private"]["timings"]


def _wait_for_cpus(address: str, cpus: int, timeout: float = 90.0) -> None:
    """Until the cluster at ``address`` has ``cpus`` CPUs (its nodes have joined), asked from a separate process."""
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="r", dir="/tmp")}
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
        "print(int(ray.cluster_resources().get('CPU', 0)))"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(
            [sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=60, env=env
        )
        if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(cpus)]:
            return
        time.sleep(1.0)
    raise AssertionError(f"the Ray cluster at {address} did not reach {cpus} CPUs within {timeout:.0f} s")
