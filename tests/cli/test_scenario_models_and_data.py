"""Scenarios name models, losses and data by reference; the Python API also takes callables. Bad references and
options are clear errors at load time."""

from __future__ import annotations

import tomllib

import pytest
import torch
from torch import nn

from fedsim.cli import main
from fedsim.scenarios import ScenarioError, load_scenario, scenario_to_toml
from fedsim.scenarios.schema import ModelConfig


def tiny_linear(input_shape, num_classes, scale: float = 1.0):
    """A module-level factory: importable back as 'test_scenario_models_and_data:tiny_linear'."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.Size(input_shape).numel()), num_classes))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.factory=user_models:mlp"], "give model.name (a shipped model) or model.factory, not both"),
        (
            ["model.hidden=[8]", "model.name=cnn2d"],
            "invalid model.hidden=[8]: the model factory 'fedsim.models.registry:cnn2d' takes channels, kernel_size, groups",
        ),
        (
            ["model.name=none", "model.factory=user_models:nothing"],
            "'user_models' has no attribute 'nothing'",
        ),
        (["model.name=none", "model.factory=not a reference"], "allowed 'package.module:function'"),
        (["model.loss=hinge"], "allowed 'cross_entropy' or 'package.module:function'"),
        (["data.options={a=1}"], "data.options are the keyword arguments of a data function"),
        (["engine.vectorize=fast"], "'auto', 'per-layer', 'vmap' or 'loop'"),
    ],
)
def test_bad_models_and_data_are_named_at_load_time(overrides, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario("quickstart", overrides)
    assert message in str(err.value)


def test_factory_options_are_the_sections_other_keys():
    sc = load_scenario(
        "quickstart",
        ["model.name=none", "model.factory=user_models:mlp", "model.width=5", "model.hidden=none"],
    )
    assert sc.model.reference() == "user_models:mlp" and sc.model.options() == {"width": 5}
    assert load_scenario("quickstart").model.reference() == "fedsim.models.registry:mlp"
    assert load_scenario("quickstart").model.options() == {"hidden": [32]}


def test_a_callable_factory_is_written_as_its_reference():
    sc = load_scenario("quickstart")
    sc.model = ModelConfig(factory=tiny_linear, scale=2.0)
    text = tomllib.loads(scenario_to_toml(sc))
    assert text["model"] == {
        "factory": "test_scenario_models_and_data:tiny_linear",
        "loss": "cross_entropy",
        "scale": 2.0,
    }
    sc.model = ModelConfig(factory=lambda s, c: tiny_linear(s, c))
    with pytest.raises(ValueError, match="define it at module level"):
        scenario_to_toml(sc)


def test_a_callable_factory_and_loss_run_through_the_api(tmp_path):
    from fedsim.engine.runner import run_scenario

    sc = load_scenario("quickstart", ["rounds=2", "engine.name=local", "data.num_clients=20"])
    sc.model = ModelConfig(factory=tiny_linear, loss="user_models:smooth_loss")
    res = run_scenario(sc, tmp_path / "run")
    assert [r["local_training"] for r in res.rows] == ["per-layer"] * 2
    written = tomllib.loads((tmp_path / "run" / "config.toml").read_text())["model"]
    assert written["factory"] == "test_scenario_models_and_data:tiny_linear"


def test_the_image_scenario_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "cnn"
    code = main(["run", "digits_cnn", "--set", "rounds=2", "--set", "engine.name=local", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = [__import__("json").loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["local_training"] for r in rows] == ["per-layer", "per-layer"]
    assert __import__("json").loads((out / "data.json").read_text())["input_shape"] == [1, 8, 8]
