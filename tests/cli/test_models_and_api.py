"""The Python API and the models a run leaves: ``fedsim.run`` returns the run's result, ``model.pt`` is the final
model's ``state_dict``, ``fedsim.load_model`` rebuilds it from the run directory, the documentation's example
(docs/how-to/python-api.md) runs as printed, and ``import fedsim`` stays light."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedsim
from fedsim.scenarios import ScenarioError
from fedsim.training.trainer import TrainSettings, make_model

PYTHON_API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "python-api.md"
# a Conv2d CNN with GroupNorm (tests/user_models.py): parameters of several layer types, in the trainer's order
SMALL = [
    "rounds=2",
    "engine.name=local",
    "data.num_clients=20",
    "model.name=none",
    "model.hidden=none",
    "model.factory=user_models:cnn",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    result = fedsim.run("quickstart", out, overrides=SMALL)
    assert result.run_dir == out and [r["round"] for r in result.rows] == [1, 2]
    return out, result


def _from_flat(out: Path, weights: np.ndarray) -> nn.Module:
    """The scenario's model with the flat weights put in by torch's own vector_to_parameters (the order of
    ``parameters()``), independently of fedsim's writer."""
    scenario = fedsim.load_scenario(str(out / "config.toml"))
    data = json.loads((out / "data.json").read_text())
    module = make_model(
        TrainSettings.from_scenario(scenario), tuple(data["input_shape"]), data["num_classes"]
    )
    nn.utils.vector_to_parameters(torch.as_tensor(weights, dtype=torch.float32), module.parameters())
    return module.eval()


def _inputs(out: Path) -> torch.Tensor:
    shape = json.loads((out / "data.json").read_text())["input_shape"]
    return torch.randn((7, *shape), generator=torch.Generator().manual_seed(0))


def test_model_pt_is_the_final_model_and_load_model_rebuilds_it(run_dir):
    out, result = run_dir
    flat = np.load(out / "model.npz")["weights"]
    np.testing.assert_array_equal(flat, result.weights)
    expected = _from_flat(out, flat)

    # the state_dict loads strictly into a freshly built module
    fresh = make_model(
        TrainSettings.from_scenario(fedsim.load_scenario(str(out / "config.toml"))),
        tuple(json.loads((out / "data.json").read_text())["input_shape"]),
        10,
    )
    fresh.load_state_dict(torch.load(out / "model.pt", weights_only=True), strict=True)
    fresh.eval()

    model = fedsim.load_model(out)
    assert isinstance(model, nn.Module) and not model.training
    x = _inputs(out)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected(x), rtol=0, atol=0)
        torch.testing.assert_close(fresh(x), expected(x), rtol=0, atol=0)


def test_load_model_falls_back_to_model_npz_and_to_building_the_data(run_dir, tmp_path):
    out, _ = run_dir
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.toml", "model.npz"):  # no model.pt (an older run), no data.json
        (copy / name).write_bytes((out / name).read_bytes())
    x = _inputs(out)
    with torch.no_grad():
        torch.testing.assert_close(fedsim.load_model(copy)(x), fedsim.load_model(out)(x), rtol=0, atol=0)
    (copy / "model.npz").unlink()
    with pytest.raises(FileNotFoundError, match="holds no model"):
        fedsim.load_model(copy)


def test_load_model_leaves_torch_random_state_alone(run_dir):
    out, _ = run_dir
    torch.manual_seed(123)
    a = torch.rand(3)
    torch.manual_seed(123)
    fedsim.load_model(out)  # the model factory seeds torch: not the caller's generator
    torch.testing.assert_close(torch.rand(3), a)


def test_run_takes_a_scenario_object_with_overrides_and_leaves_it_as_it_was():
    scenario = fedsim.load_scenario("quickstart", ["engine.name=local", "data.num_clients=20"])
    result = fedsim.run(scenario, overrides=["rounds=1", "privacy.noise_multiplier=2.0"], write=False)
    assert result.run_dir is None and len(result.rows) == 1
    assert scenario.rounds == 30 and scenario.privacy.noise_multiplier == 1.0
    assert isinstance(scenario, fedsim.Scenario)
    with pytest.raises(ScenarioError, match="rounds"):
        fedsim.run(scenario, overrides=["rounds=0"], write=False)


def test_a_callable_from_main_is_refused_before_anything_is_written(tmp_path):
    def factory(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    factory.__module__ = "__main__"  # what a script's own function is
    scenario = fedsim.load_scenario("quickstart", ["engine.name=local", "rounds=1", "model.hidden=none"])
    scenario.model.name = None
    scenario.model.factory = factory
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"cannot be written to the run directory's config\.toml"):
        fedsim.run(scenario, out, overrides=["data.num_clients=20"])
    assert not out.exists()


def _python_api_example() -> str:
    """The first ```python block of the Python API how-to, the example a reader copies first."""
    block = re.search(r"```python\n(.*?)```", PYTHON_API_PAGE.read_text(), re.S)
    assert block, f"{PYTHON_API_PAGE} has no ```python block"
    return block.group(1)


def test_the_python_api_example_runs_as_printed(tmp_path, monkeypatch, capsys):
    code = _python_api_example()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/how-to/python-api.md", "exec"), {"__name__": "python_api_example"})
    printed = capsys.readouterr().out
    assert "epsilon" in printed and "held-out accuracy" in printed, printed
    runs = [p for p in tmp_path.rglob("model.pt")]
    assert len(runs) == 1 and (runs[0].parent / "summary.json").is_file()


def test_import_fedsim_stays_light():
    code = (
        "import sys, fedsim; heavy = [m for m in ('torch', 'ray', 'flwr', 'pydantic', 'fedsim.api') "
        "if m in sys.modules]; print(heavy); print(sorted(set(fedsim.__all__) - set(dir(fedsim))))"
    )
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout
    assert fedsim.run is fedsim.api.run and fedsim.load_model is fedsim.api.load_model
    assert fedsim.RunResult.__name__ == "RunResult"
    with pytest.raises(AttributeError):
        fedsim.no_such_name  # noqa: B018
