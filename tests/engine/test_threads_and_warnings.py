"""torch's thread count per engine and training path (``engine.torch_threads``), and torch's warnings kept in the
run's ``run.log`` instead of the console."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.engine import threads
from fedsim.engine.local_engine import LocalEngine
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data
from fedsim.report.rundir import RUN_LOG
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.training import trainer as trainer_module
from fedsim.training.trainer import TrainSettings, initial_weights

SMALL = ["rounds=2", "data.num_clients=20", "engine.name=local", "engine.eval_every=1"]
ATTENTION = ["model.name=none", "model.hidden=none", "model.factory=test_threads_and_warnings:attention"]


class Attention(nn.Module):
    """The digits' 8x8 pixels as 8 tokens of 8 features, one self-attention, a linear head. vmap has no batching
    rule for CPU flash attention, so torch warns on the vmap path; forward also warns in the user's own words."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)
        tokens = x.reshape(x.shape[0], 1, 8, 8)  # [batch, heads, tokens, features]
        return self.head(F.scaled_dot_product_attention(tokens, tokens, tokens).mean((1, 2)))


def attention(input_shape, num_classes):
    return Attention(num_classes)


@pytest.fixture
def two_threads():
    """The caller's torch runs 2 threads (whatever the machine), as it is given back after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_auto_takes_one_thread_on_the_loop_and_the_cpus_on_vectorised_paths():
    assert threads.choose_threads("auto", "loop", cpus=16, current=16)[0] == 1
    assert threads.choose_threads("auto", "loop", worker_cpus=4)[0] == 1
    # in process: the usable CPUs less one for the driver, never more than the process had
    assert threads.choose_threads("auto", "per-layer", cpus=16, current=16)[0] == 15
    n, why = threads.choose_threads("auto", "vmap", cpus=16, current=4)
    assert n == 4 and "at most the 4 this process had" in why
    assert threads.choose_threads("auto", "per-layer", cpus=2, current=2)[0] == 1
    assert threads.choose_threads("auto", "per-layer", cpus=1, current=1)[0] == 1
    # a Ray worker: the CPUs Ray reserved for it, at least 1
    assert threads.choose_threads("auto", "vmap", worker_cpus=3)[0] == 3
    assert threads.choose_threads("auto", "per-layer", worker_cpus=0.5)[0] == 1
    # a number is taken as it is, on every path
    assert threads.choose_threads(3, "loop", cpus=2, current=2) == (3, "engine.torch_threads=3")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "many", 1025])
def test_torch_threads_must_be_auto_or_a_whole_number(value):
    with pytest.raises(ValueError, match=r"engine.torch_threads"):
        threads.check_setting(value)
    with pytest.raises(ScenarioError, match=r"torch_threads"):
        load_scenario("quickstart", [f"engine.torch_threads={str(value).lower()}"])


def test_local_engine_trains_on_its_count_and_gives_the_callers_back(two_threads, monkeypatch):
    scenario = load_scenario("quickstart", [*SMALL, "engine.vectorize=loop"])
    data = build_data(scenario)
    engine = LocalEngine(data, TrainSettings.from_scenario(scenario))
    assert engine.torch_threads == 1 and torch.get_num_threads() == 2  # auto on the loop; nothing set yet
    seen = []
    evaluate = trainer_module.ClientTrainer.evaluate
    monkeypatch.setattr(
        trainer_module.ClientTrainer,
        "evaluate",
        lambda self, *a: seen.append(torch.get_num_threads()) or evaluate(self, *a),
    )
    settings = TrainSettings.from_scenario(scenario)
    engine.evaluate(data.heldout_clients, initial_weights(settings, data.input_shape, data.num_classes))
    assert seen == [1] and torch.get_num_threads() == 2  # given back after the call, closed or not


def test_a_run_trains_with_the_count_it_records_and_restores_the_callers(tmp_path, monkeypatch, two_threads):
    seen: list[int] = []
    train = trainer_module.ClientTrainer.train

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return train(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module.ClientTrainer, "train", spy)
    for setting, want in (("auto", 1), (3, 3)):  # auto: the loop path on one thread
        seen.clear()
        sets = [*SMALL, "engine.vectorize=loop", f"engine.torch_threads={setting}"]
        result = run_scenario(load_scenario("quickstart", sets), tmp_path / f"run-{setting}")
        summary = json.loads((tmp_path / f"run-{setting}" / "summary.json").read_text())
        assert set(seen) == {want} and summary["engine"]["torch_threads"] == want
        assert summary["engine"]["torch_threads_why"] and result.engine["torch_threads"] == want
        assert torch.get_num_threads() == 2  # the caller's


def test_torch_warnings_go_to_the_run_log_and_one_line_to_the_console(tmp_path, caplog):
    scenario = load_scenario("quickstart", [*SMALL, *ATTENTION, "engine.vectorize=vmap"])
    with warnings.catch_warnings(record=True) as shown, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")  # every warning, every time: each of torch's is counted once
        run_scenario(scenario, tmp_path / "run")
    logged = (tmp_path / "run" / RUN_LOG).read_text().splitlines()
    assert logged and all("from torch" in line for line in logged)
    assert any("batching rule" in line and "flash_attention" in line for line in logged)
    # none of torch's reached the console; the user's own did, as they would have
    assert not [w for w in shown if "batching rule" in str(w.message)]
    assert any("the user's own warning" in str(w.message) for w in shown)
    said = [r.getMessage() for r in caplog.records if "from torch" in r.getMessage()]
    assert said == [f"{len(logged)} warnings from torch, see {tmp_path / 'run' / RUN_LOG}"]


def test_without_a_run_directory_torch_warnings_are_shown_as_before():
    scenario = load_scenario("quickstart", [*SMALL, *ATTENTION, "engine.vectorize=vmap", "rounds=1"])
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        run_scenario(scenario, write=False)
    assert any("batching rule" in str(w.message) for w in shown)
