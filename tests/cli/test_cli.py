"""The `fedsim` command: scenario loading, overrides and clear errors (exit code 2, no traceback)."""

import subprocess
import sys

import pytest

from fedsim.cli import main
from fedsim.scenarios import ScenarioError, available_scenarios, load_scenario, parse_override


def _fedsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "fedsim.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_unknown_scenario_lists_the_available_ones():
    r = _fedsim("run", "no-such-scenario")
    assert r.returncode == 2
    assert "unknown scenario 'no-such-scenario'" in r.stderr
    for name in available_scenarios():
        assert name in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "override, field, allowed",
    [
        ("privacy.sampling=uniform", "privacy.sampling", "must be one of poisson, fixed, all"),
        ("privacy.noise_multiplier=-1", "privacy.noise_multiplier", "greater than or equal to 0"),
        ("privacy.sampling_rate=1.5", "privacy.sampling_rate", "less than or equal to 1"),
        ("rounds=0", "rounds", "greater than or equal to 1"),
        ("privacy.noise=1", "privacy.noise", "allowed here: sampling"),
        (
            "data.dataset=cifar",
            "data.dataset",
            "'digits', 'mnist1d', 'synthetic', 'shakespeare', 'hf:<repo id>' or a data function",
        ),
    ],
)
def test_invalid_values_name_the_field_and_what_is_allowed(override, field, allowed, capsys):
    assert main(["run", "quickstart", "--set", override]) == 2
    err = capsys.readouterr().err
    assert field in err and allowed in err


def test_invalid_value_exit_code_without_traceback():
    r = _fedsim("run", "quickstart", "--set", "privacy.clip=-1")
    assert r.returncode == 2 and "privacy.clip" in r.stderr and "Traceback" not in r.stderr


def test_sampling_combinations_are_checked():
    with pytest.raises(ScenarioError, match="give exactly one of the two for sampling='fixed'"):
        load_scenario("quickstart", ["privacy.sampling=fixed", "privacy.sampling_rate=none"])
    with pytest.raises(ScenarioError, match="give exactly one of the two for sampling='poisson'"):
        load_scenario("quickstart", ["privacy.clients_per_round=10"])
    s = load_scenario("quickstart", ["privacy.sampling=all", "privacy.sampling_rate=none"])
    assert s.privacy.sampling == "all"


def test_overrides_are_typed():
    assert parse_override("rounds=5") == (["rounds"], 5)
    assert parse_override("privacy.clip=0.5") == (["privacy", "clip"], 0.5)
    assert parse_override("privacy.sampling=fixed") == (["privacy", "sampling"], "fixed")
    assert parse_override("model.hidden=[16, 16]") == (["model", "hidden"], [16, 16])
    with pytest.raises(ScenarioError, match="key=value"):
        parse_override("rounds")
    s = load_scenario("quickstart", ["rounds=3", "seed=7", "model.hidden=[8]"])
    assert (s.rounds, s.seed, s.model.hidden) == (3, 7, [8])


def test_scenario_from_a_path(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text('rounds = 2\n[privacy]\nsampling = "all"\n')
    s = load_scenario(str(p))
    assert s.name == "mine" and s.rounds == 2
    p.write_text("rounds = [")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(str(p))


def test_out_dir_holding_a_run_is_refused(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert main(["run", "quickstart", "--out", str(tmp_path), "--set", "engine.name=local"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"  # nothing lost


def test_scenarios_command_lists_quickstart(capsys):
    assert main(["scenarios"]) == 0
    assert "quickstart" in capsys.readouterr().out


def test_data_errors_name_the_scenario_key_and_the_out_dir_stays_usable(tmp_path, capsys):
    args = [
        "run",
        "quickstart",
        "--out",
        str(tmp_path),
        "--set",
        "engine.name=local",
        "--set",
        "data.partitioner=pathological",
        "--set",
        "data.classes_per_client=20",
        "--no-progress",
    ]
    assert main(args) == 2
    assert "data.classes_per_client=20" in capsys.readouterr().err
    # a run that failed before its first round leaves an empty metrics.jsonl: the folder can be reused
    assert main(args) == 2
    assert "already holds a run" not in capsys.readouterr().err
