"""Ordinary mistakes end in exit 2 with a message that names the field and what is allowed, before anything is
written: never a traceback, never an empty run directory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsim.cli import main
from fedsim.engine.runner import run_scenario
from fedsim.scenarios import ScenarioError, load_scenario

FAST = ["--set", "engine.name=local", "--set", "rounds=1", "--no-progress"]


def _sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["model.hidden=nan"], "model.hidden=nan: nan and inf are not allowed"),
        (["model.hidden=[inf]"], "model.hidden=inf: nan and inf are not allowed"),
        (
            ["data.dataset=user_models:stripes", "data.partitioner=iid", "data.options.size=nan"],
            "data.options.size=nan: nan and inf are not allowed",
        ),
        (
            ["model.hidden=none", "model.name=cnn1d", "model.kernel_size=[3]"],
            "invalid model.kernel_size=[3]: the function's annotation is int",
        ),
        (
            [
                "model.hidden=none",
                "model.name=none",
                "model.factory=user_models:cnn",
                "data.dataset=synthetic",
            ],
            "the model 'user_models:cnn' does not fit the data (inputs [60] per example, one label per example, "
            "10 classes): the forward pass failed: RuntimeError",
        ),
        (
            [
                "model.hidden=none",
                "model.name=none",
                "model.factory=user_models:custom",
                "engine.vectorize=per-layer",
            ],
            "engine.vectorize='per-layer' cannot train this model: Scale",
        ),
        (["privacy.noise_multipler=1"], "did you mean privacy.noise_multiplier?"),
        (["model.hiden=[3]"], "did you mean model.hidden?"),
    ],
)
def test_an_ordinary_mistake_is_exit_2_naming_the_field_before_anything_is_written(
    tmp_path, capsys, items, message
):
    out = tmp_path / "run"
    assert main(["run", "quickstart", *FAST, "--out", str(out), *_sets(*items)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error:") and message in err, err
    assert "Traceback" not in err
    assert not out.exists()  # refused before the run directory was made


def test_an_explicit_path_that_cannot_train_the_model_is_refused_before_ray_starts(tmp_path, capsys):
    """Under Ray the same refusal used to be an ActorDiedError: the workers failed in their constructor."""
    items = [
        "model.hidden=none",
        "model.name=none",
        "model.factory=user_models:custom",
        "engine.vectorize=per-layer",
    ]
    out = tmp_path / "ray"
    args = ["run", "quickstart", "--set", "rounds=1", "--no-progress", "--out", str(out), *_sets(*items)]
    assert main(args) == 2
    assert "cannot train this model" in capsys.readouterr().err and not out.exists()


def test_a_callable_from_main_is_refused_before_anything_is_written(tmp_path):
    def factory(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), num_classes))

    factory.__module__ = "__main__"  # what a script's own function is
    scenario = load_scenario("quickstart", ["engine.name=local", "rounds=1", "model.hidden=none"])
    scenario.model.name = None
    scenario.model.factory = factory
    out = tmp_path / "run"
    with pytest.raises(
        ValueError, match=r"cannot be written to the run directory's config.toml.*module level"
    ):
        run_scenario(scenario, out)
    assert not out.exists()
    # without a run directory to write, the same callable trains (nothing needs its reference)
    assert len(run_scenario(scenario, write=False).rows) == 1


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["run", "quickstart", *FAST, "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_the_schema_error_for_a_scenario_file_also_suggests(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[privacy]\nclipp = 1.0\n')
    with pytest.raises(ScenarioError, match=r"did you mean privacy.clip\?"):
        load_scenario(str(path))


def test_a_ray_client_address_is_refused_with_what_to_use_instead():
    with pytest.raises(ScenarioError, match=r"Ray Client address.*ray_address = 'auto' or the GCS address"):
        load_scenario("quickstart", ["engine.ray_address=ray://head:10001"])
    assert load_scenario("quickstart", ["engine.ray_address=auto"]).engine.ray_address == "auto"


def test_the_fit_check_reads_labels_as_training_does():
    """int32 labels (what a data function may return) train, so the check before the run must not refuse them."""
    from types import SimpleNamespace

    import numpy as np

    from fedsim.training.trainer import TrainSettings, check_fits

    x, y = np.zeros((4, 5), np.float32), np.array([0, 1, 0, 1], np.int32)
    data = SimpleNamespace(input_shape=(5,), num_classes=2, train_clients=[0], client_data=lambda c: (x, y))
    check_fits(TrainSettings(model="fedsim.models.registry:mlp", model_kwargs={}), data)
