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
CYCLIC_TREE = [
    "privacy.sampling=cyclic",
    "privacy.min_separation=5",
    "privacy.sampling_rate=none",
    "privacy.mechanism=tree",
]


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
        # numbers past what the accountants and the noise draws handle (an OverflowError or ZeroDivisionError in the
        # first round before), with independent noise and with tree aggregation on a cyclic schedule
        (["privacy.noise_multiplier=1e300"], "privacy.noise_multiplier: must be 0 (no noise"),
        (["privacy.noise_multiplier=1e-300"], "or a number in [1e-06, 1e+06], the range where"),
        (
            [*CYCLIC_TREE, "privacy.noise_multiplier=1e-300"],
            "privacy.noise_multiplier: must be 0 (no noise",
        ),
        ([*CYCLIC_TREE, "privacy.noise_multiplier=1e300"], "or a number in [1e-06, 1e+06]"),
        (["privacy.clip=1e300"], "must be at most 3.403e+38, float32's largest number"),
        # a boolean is not read as 1 (canaries = true was one canary)
        (["privacy.canaries=true"], "privacy.canaries: must be a whole number >= 0, not true or false"),
        (["privacy.max_epsilon=false"], "privacy.max_epsilon: must be a number > 0, not true or false"),
        # two releases at the least noise multiplier compose to less (refused in round 1 before)
        (
            [
                "privacy.adaptive_clip=true",
                "privacy.noise_multiplier=1e-6",
                "privacy.count_noise_multiplier=1e-6",
            ],
            "the round's releases compose to one Gaussian of noise multiplier 7.07e-07, below 1e-06",
        ),
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


@pytest.mark.parametrize("target", ["1e-9", "1e9"])
@pytest.mark.parametrize("schedule", [[], CYCLIC_TREE], ids=["independent", "cyclic-tree"])
def test_a_target_epsilon_out_of_reach_is_exit_2_naming_the_field_and_the_reachable_range(
    tmp_path, capsys, target, schedule
):
    """Under a schedule it was dp-accounting's root-finder message ("`brentq` raised ValueError ..."), with no
    field named; with independent noise 1e9 ran at the least noise searched, far below the target."""
    out = tmp_path / "run"
    argv = ["run", "quickstart", *FAST, "--set", "rounds=2", "--out", str(out)]
    assert main([*argv, *_sets(*schedule, f"privacy.target_epsilon={target}")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error: privacy.target_epsilon="), err
    assert "calibration cannot meet it" in err, err
    assert "allowed: a target in [" in err and "brentq" not in err and "Traceback" not in err
    assert not out.exists()


PRIVACY = ["privacy", "--population", "1000", "--rounds", "20"]
CYCLIC = ["--schedule", "cyclic", "--min-separation", "10"]
POISSON = ["--sampling-rate", "0.1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*POISSON, "--noise-multiplier", "1e300"], "--noise-multiplier: 1e+300 is invalid: must be 0"),
        ([*POISSON, "--noise-multiplier", "1e-300"], "or a number in [1e-06, 1e+06]"),
        ([*CYCLIC, "--mechanism", "tree", "--noise-multiplier", "1e-300"], "--noise-multiplier: 1e-300 is"),
        ([*CYCLIC, "--mechanism", "blt", "--noise-multiplier", "1e300"], "--noise-multiplier: 1e+300 is"),
        ([*POISSON, "--noise-multiplier", "1", "--clip", "1e300"], "--clip: 1e+300 is invalid"),
        ([*CYCLIC, "--mechanism", "banded-mf", "--target-epsilon", "1e-9"], "--target-epsilon: 1e-09 is"),
        ([*CYCLIC, "--mechanism", "tree", "--target-epsilon", "1e9"], "calibration cannot meet it"),
        ([*POISSON, "--target-epsilon", "1e-9"], "allowed: a target in ["),
    ],
    ids=["1e300", "1e-300", "tree-1e-300", "blt-1e300", "clip-1e300", "mf-1e-9", "tree-1e9", "target-1e-9"],
)
def test_fedsim_privacy_refuses_numbers_past_the_accountants_naming_the_option(capsys, argv, message):
    """Each was an OverflowError, a ZeroDivisionError or a ValueError traceback (dp-accounting's root finder, or
    ``min()`` of no calibrated noise multiplier)."""
    assert main([*PRIVACY, "--methods", "rdp", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim privacy: error: --") and message in err and len(err.splitlines()) == 1, err


def test_fedsim_privacy_on_a_long_schedule_with_little_noise_answers_pld_with_rdp_in_bounded_time(capsys):
    """Tree aggregation over 20,000 cyclic rounds is one Gaussian of noise multiplier z / s_T, 4e-4 at z = 1: its PLD
    would need about 5e10 points, and grew past 7.5 GB into a MemoryError. pld is answered with rdp where its PLD
    would not fit (as the ledger does, docs/explanations/accountant.md), and rdp is exact at checkpoints past 1,000 rounds (it took about a
    minute at every round)."""
    import json
    import time

    from fedsim.privacy.mechanism import Mechanism
    from fedsim.privacy.schedule import (
        ScheduleAccounting,
        pld_impractical,
        schedule_bounds,
        schedule_epsilon_detail,
    )
    from fedsim.round import make_noise_source

    mech = Mechanism(population=1000, sampling="cyclic", noise_multiplier=1.0, min_separation=10)
    noise = make_noise_source("tree", 0)
    noise.prepare(20_000, *schedule_bounds(mech.scheme, 10, None))
    accounting = ScheduleAccounting.for_schedule(noise, mech.scheme, None, 10, None)
    assert "needs about 5.53e+10 points" in pld_impractical(accounting, 20_000, 1.0)
    eps, why = schedule_epsilon_detail(accounting, 20_000, 1.0, 1e-5, "pld")
    assert why and eps == schedule_epsilon_detail(accounting, 20_000, 1.0, 1e-5, "rdp")[0]
    assert pld_impractical(accounting, 1, 1.0) is None  # one round: a PLD of about 2e5 points

    start = time.perf_counter()
    # z = 0.05: every printed round's PLD is past the limit, so the test builds none (each takes seconds)
    argv = ["privacy", "--population", "1000", *CYCLIC, "--mechanism", "tree", "--rounds", "20000"]
    assert main([*argv, "--noise-multiplier", "0.05", "--methods", "pld", "rdp", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert time.perf_counter() - start < 30
    fallback = "pld: answered with rdp (a valid, looser upper bound) from round 1 on"
    assert any(n.startswith(fallback) for n in doc["notes"]), doc["notes"]
    assert doc["methods"]["pld"]["epsilon"][-1] == doc["methods"]["rdp"]["epsilon"][-1]
    assert len(doc["methods"]["rdp"]["exact_at"]) < 200 and doc["methods"]["rdp"]["exact_at"][-1] == 20_000
    assert any(n.startswith("rdp: exact at ") for n in doc["notes"])
