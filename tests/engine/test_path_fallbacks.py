"""Why the trainers took a slower training path is seen once: the engines expose it (``training_fallbacks``),
``summary.json`` records it beside the path (``local_training``, ``local_training_fallbacks``), and ``fedsim run``
prints it in one line before round 1 (the ``fedsim`` logger, WARNING), not once per round or per worker. The rows
are unchanged: they name the path only.

The model is defined here, as a user's would be, and named ``test_path_fallbacks:bilinear`` (this folder is put on
``sys.path``; the CLI's subprocess gets it through ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedsim.engine.local_engine import LocalEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.loop import describe_training
from fedsim.scenarios import load_scenario

HERE = Path(__file__).resolve().parent
SMALL = ["engine.name=local", "data.num_clients=10", "engine.checkpoint_every=0"]
BILINEAR = ["model.name=none", "model.hidden=none", "model.factory=test_path_fallbacks:bilinear"]
LINE = "local training: vmap (per-layer: Bilinear at 'mix' holds parameters"


class Pairwise(nn.Module):
    """Products of the input's features (``nn.Bilinear``): no per-layer rule knows it, vmap trains it."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.mix = nn.Bilinear(features, features, 8)
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.head(torch.tanh(self.mix(x, x)))


def bilinear(input_shape, num_classes):
    return Pairwise(math.prod(input_shape), num_classes)


class Silent:
    """A user's engine that says nothing about its training path (as Flower's GridEngine): the local engine's
    training behind an object with only the protocol's methods."""

    name = "silent"

    def __init__(self, data, settings) -> None:
        self._inner = LocalEngine(data, settings)

    def train(self, plan, weights):
        return self._inner.train(plan, weights)

    def evaluate(self, client_ids, weights):
        return self._inner.evaluate(client_ids, weights)

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # test_path_fallbacks:bilinear, whatever pytest's import mode


def _lines(records) -> list[str]:
    return [r.getMessage() for r in records if r.getMessage().startswith("local training:")]


def test_a_layer_without_a_rule_falls_back_to_vmap_and_says_why_in_the_summary_and_one_line(tmp_path, caplog):
    scenario = load_scenario("quickstart", [*SMALL, *BILINEAR, "rounds=2"])
    exp = build_experiment(scenario)
    engine = LocalEngine(exp.data, exp.settings)
    assert engine.training_path == "vmap"
    assert len(engine.training_fallbacks) == 1 and engine.training_fallbacks[0].startswith(
        "per-layer: Bilinear"
    )
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        result = run_scenario(scenario, tmp_path / "run", engine=engine)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["local_training"] == "vmap"
    assert summary["local_training_fallbacks"] == list(engine.training_fallbacks)
    assert "local_training_fallbacks" in summary["privacy_scope"]  # listed as public
    # once per run (two rounds here), from the fedsim logger, at WARNING
    lines = [r for r in caplog.records if r.getMessage().startswith("local training:")]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].name.startswith("fedsim") and lines[0].levelno == logging.WARNING
    assert lines[0].getMessage().startswith(LINE) and "\n" not in lines[0].getMessage()
    # the rows name the path only, as before
    assert [r["local_training"] for r in result.rows] == ["vmap", "vmap"]
    assert not any("fallback" in key for row in result.rows for key in row)


def test_a_model_on_its_first_path_has_no_fallbacks_and_no_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        run_scenario(load_scenario("quickstart", [*SMALL, "rounds=1"]), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["local_training"] == "per-layer" and summary["local_training_fallbacks"] == []
    assert not _lines(caplog.records)


@pytest.mark.parametrize(
    "vectorize, path, fallbacks", [("auto", None, None), ("vmap", "vmap", [])], ids=["unknown", "forced"]
)
def test_an_engine_that_does_not_say_is_unknown_unless_the_path_is_forced(
    tmp_path, caplog, vectorize, path, fallbacks
):
    scenario = load_scenario("quickstart", [*SMALL, *BILINEAR, "rounds=1", f"engine.vectorize={vectorize}"])
    exp = build_experiment(scenario)
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        result = run_scenario(scenario, tmp_path / "run", engine=Silent(exp.data, exp.settings))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["local_training"] == path and summary["local_training_fallbacks"] == fallbacks
    assert result.rows[0].get("local_training") == path
    assert not _lines(caplog.records)  # nothing guessed


def test_the_line_is_one_line_whatever_the_reasons_hold():
    assert describe_training("vmap", ()) is None and describe_training(None, ("per-layer: x",)) is None
    line = describe_training("loop", ("per-layer: no rule\n  for Foo", "vmap: RuntimeError: " + "x" * 1000))
    assert line is not None and "\n" not in line
    assert line.startswith("local training: loop (per-layer: no rule for Foo; vmap: RuntimeError: xxx")
    assert line.endswith("...)") and len(line) < 1000


def test_fedsim_run_prints_the_line_once_before_round_1_with_two_ray_workers(tmp_path):
    """The CLI end to end, on the Ray engine (its workers report the reason; the driver prints it once)."""
    sets = [*SMALL, *BILINEAR, "rounds=2", "engine.name=ray", "engine.num_workers=2"]
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}  # unbuffered: the merged order is real
    args = [sys.executable, "-m", "fedsim.cli", "run", "quickstart", "--no-progress"]
    args += ["--out", str(tmp_path / "run"), *(x for item in sets for x in ("--set", item))]
    r = subprocess.run(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("local training:") == 1 and LINE in r.stdout, r.stdout
    assert r.stdout.index(LINE) < r.stdout.index("round   1/2"), r.stdout  # before round 1
    assert "falls back" not in r.stdout  # the workers' INFO lines stay in the workers
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["local_training"] == "vmap"
    assert [f.split(":")[0] for f in summary["local_training_fallbacks"]] == ["per-layer"]
