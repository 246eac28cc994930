"""The engine seam: an engine defined outside fedsim, registered by name (fedsim.registry.register_engine), runs a
scenario end to end through fedsim.engine.runner.run_scenario, touching no fedsim file; and the registry itself
(lazy targets, duplicates refused, the shipped engines)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.engine.threads import torch_threads
from fedsim.registry import (
    ENGINES,
    EngineEntry,
    check_engine_name,
    engine_entry,
    engine_names,
    register_engine,
    resolve_engine,
)
from fedsim.round import PartialSum
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.training.trainer import ClientTrainer

TOY = "one-at-a-time"
#: the loop path trains client by client, so training the cohort one client at a time sums the same updates in
#: the same order: the model is the local engine's bit for bit
SMALL = ["rounds=2", "data.num_clients=20", "privacy.sampling_rate=0.3", "engine.vectorize=loop"]


class OneAtATimeEngine:
    """A toy engine: trains the cohort one client per call, last client first, and merges the clients' partial
    sums in the cohort's order (each client's randomness comes from (seed, round, client), so the order in which
    they train changes nothing). Counts its calls."""

    name = TOY

    def __init__(self, data, settings) -> None:
        self.trainer = ClientTrainer(data, settings)
        self.calls = {"train": 0, "clients": 0, "evaluate": 0, "close": 0}

    @classmethod
    def start(cls, scenario, data, settings) -> OneAtATimeEngine:
        engine = cls(data, settings)
        STARTED.append(engine)
        return engine

    def train(self, plan, weights):
        self.calls["train"] += 1
        cohort = [int(c) for c in plan.cohort]
        done = {}
        for c in reversed(cohort):
            done[c] = self.trainer.train(plan, weights, [c])
            self.calls["clients"] += 1
        total, metrics = PartialSum(self.trainer.dim), []
        for c in cohort:
            partial, new = done[c]
            total.merge(partial)
            metrics.extend(new)
        return total, metrics

    def evaluate(self, client_ids, weights):
        self.calls["evaluate"] += 1
        return self.trainer.evaluate(client_ids, weights)

    def close(self) -> None:
        self.calls["close"] += 1


STARTED: list[OneAtATimeEngine] = []


@pytest.fixture
def toy_engine():
    STARTED.clear()
    entry = register_engine(TOY, OneAtATimeEngine, "trains the cohort one client at a time (a test's engine)")
    try:
        yield entry
    finally:
        ENGINES.pop(TOY, None)


def test_an_engine_registered_from_outside_runs_a_scenario_like_the_local_engine(toy_engine, tmp_path):
    assert TOY in engine_names() and resolve_engine(TOY) is OneAtATimeEngine
    # the local engine trains the loop on 1 torch thread (fedsim.engine.threads); an outside engine runs on its
    # caller's threads: the same count, so that the two sum in the same order, bit for bit
    with torch_threads(1):
        toy = run_scenario(load_scenario("quickstart", [*SMALL, f"engine.name={TOY}"]), tmp_path / "toy")
    local = run_scenario(load_scenario("quickstart", [*SMALL, "engine.name=local"]), tmp_path / "local")

    (engine,) = STARTED
    cohorts = [r["non_private"]["cohort"] for r in toy.rows]
    assert engine.calls["train"] == 2 and engine.calls["clients"] == sum(cohorts) > 0
    assert engine.calls["close"] == 1  # the runner started it, so the runner closed it
    assert engine.calls["evaluate"] >= 2
    assert toy.weights.dtype == local.weights.dtype and np.array_equal(toy.weights, local.weights)
    for a, b in zip(toy.rows, local.rows, strict=True):
        timings = ("train_time_s", "round_time_s")
        strip = {k: v for k, v in a["non_private"].items() if k not in timings}
        assert strip == {k: v for k, v in b["non_private"].items() if k not in timings}
        assert {k: v for k, v in a.items() if k != "non_private"} == {
            k: v for k, v in b.items() if k != "non_private"
        }
    assert (tmp_path / "toy" / "ledger.json").read_text() == (tmp_path / "local" / "ledger.json").read_text()
    assert "one-at-a-time" in (tmp_path / "toy" / "config.toml").read_text()


def test_an_unregistered_engine_is_refused_by_the_scenario_with_the_registered_names():
    with pytest.raises(ScenarioError) as err:
        load_scenario("quickstart", [f"engine.name={TOY}"])
    assert "engine.name" in str(err.value) and TOY in str(err.value)
    assert all(name in str(err.value) for name in ("ray", "local", "flower"))  # what it accepts
    with pytest.raises(ValueError, match=r"registered: 'ray', 'local', 'flower'"):
        check_engine_name(TOY)


def test_a_name_registered_twice_is_refused_unless_replaced(toy_engine):
    with pytest.raises(
        ValueError, match=rf"engine '{TOY}' is registered already \(registered: 'ray', 'local', "
    ):
        register_engine(TOY, OneAtATimeEngine)
    again = register_engine(TOY, "tests_nowhere:Engine", replace=True)
    assert engine_entry(TOY) is again and isinstance(again, EngineEntry)
    with pytest.raises(ValueError, match=r"is not a 'package\.module:attribute' reference"):
        register_engine("broken", "no_colon_here")
    assert "broken" not in ENGINES


def test_the_shipped_engines_resolve_to_their_factories():
    from fedsim.engine.flower_engine import FlowerEngine
    from fedsim.engine.local_engine import LocalEngine
    from fedsim.engine.ray_engine import RayEngine

    assert engine_names()[:3] == ("ray", "local", "flower")
    assert resolve_engine("ray") is RayEngine and resolve_engine("local") is LocalEngine
    assert resolve_engine("flower") is FlowerEngine
    assert not engine_entry("local").drives_loop and not engine_entry("ray").drives_loop
    # Flower's engine runs the round loop itself, inside its ServerApp: the registry says so, and it has the hook
    assert engine_entry("flower").drives_loop and callable(FlowerEngine.run_scenario)
    assert all(callable(getattr(resolve_engine(n), "start", None)) for n in ("ray", "local"))


def test_the_registry_imports_no_engine():
    code = (
        "import sys, fedsim.registry as r; r.engine_names(); "
        "print(sorted(m for m in ('ray', 'flwr', 'torch', 'fedsim.engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
