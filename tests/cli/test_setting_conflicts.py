"""Settings that would silently replace each other are refused, naming both and where each came from, or merged by
a rule that is printed where the run starts and recorded; a label never describes a run that did not run that way;
the noise multiplier a run used (calibrated or set) is on the console, in config.toml, summary.json and every row."""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.report import sweep_figure
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.scenarios.loader import Setting, noise_precedence
from fedsim.sweep import plan_sweep

#: a tiny run: 20 clients of digits, 2 rounds, Poisson sampling with an expected cohort of 5, in process
TINY = """
name = "tiny"
rounds = 2
[data]
dataset = "digits"
num_clients = 20
[model]
name = "mlp"
hidden = [8]
[client]
local_epochs = 1
[privacy]
sampling = "poisson"
clients_per_round = 5
{privacy}
[engine]
name = "local"
checkpoint_every = 0
"""


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """The plots are most of a tiny run's time, and other tests draw them."""
    from fedsim.report.rundir import RunWriter

    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])
    monkeypatch.setattr(sweep_figure, "plot_privacy_utility", lambda *a, **k: None)


def _scenario(tmp_path: Path, privacy: str = "", sweep: str = "", name: str = "tiny.toml") -> str:
    path = tmp_path / name
    path.write_text(TINY.format(privacy=privacy) + sweep, encoding="utf-8")
    return str(path)


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error: ") and "Traceback" not in err
    return err


# ------------------------------------------------------------------ fedsim run --set


def test_run_refuses_a_target_epsilon_and_a_zero_noise_multiplier_in_one_set_list(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "quickstart", "--set", "privacy.target_epsilon=4", "--set", "privacy.noise_multiplier=0"]
    err = _refused(capsys, [*argv, "--out", str(out)])
    assert "privacy.target_epsilon = 4 (--set)" in err and "privacy.noise_multiplier = 0 (--set)" in err
    assert "privacy.target_epsilon = none" in err  # what to write for the baseline
    assert not out.exists()


def test_a_target_and_a_nonzero_noise_multiplier_in_one_set_list_are_refused():
    with pytest.raises(
        ScenarioError, match=r"target_epsilon = 4 \(--set\) and privacy.noise_multiplier = 2 \(--set\)"
    ):
        load_scenario("quickstart", ["privacy.target_epsilon=4", "privacy.noise_multiplier=2"])


def test_a_zero_noise_multiplier_beside_a_target_from_the_file_is_refused_naming_the_file(tmp_path):
    path = _scenario(tmp_path, "target_epsilon = 4.0")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path, ["privacy.noise_multiplier=0"])
    assert "privacy.noise_multiplier = 0 (--set)" in str(exc.value)
    assert "privacy.target_epsilon = 4 (scenario file tiny.toml)" in str(exc.value)
    # and the other way round: a target from --set over a file's non-private baseline
    path = _scenario(tmp_path, "noise_multiplier = 0.0", name="base.toml")
    with pytest.raises(ScenarioError, match=r"noise_multiplier = 0 \(scenario file base.toml\)"):
        load_scenario(path, ["privacy.target_epsilon=4"])
    # the baseline asked for explicitly is a non-private run, by no rule
    s = load_scenario(
        _scenario(tmp_path, "target_epsilon = 4.0", name="t.toml"),
        ["privacy.target_epsilon=none", "privacy.noise_multiplier=0"],
    )
    assert (s.privacy.target_epsilon, s.privacy.noise_multiplier, s.privacy.rules) == (None, 0.0, [])


def test_a_later_layer_replaces_an_earlier_one_by_a_stated_rule(tmp_path):
    path = _scenario(tmp_path, "target_epsilon = 4.0")
    s = load_scenario(path, ["privacy.noise_multiplier=0.7"])
    assert s.privacy.target_epsilon is None and s.privacy.noise_multiplier == 0.7  # not calibrated away
    assert s.privacy.rules == [
        "privacy.noise_multiplier = 0.7 (--set) replaces privacy.target_epsilon = 4 (scenario file tiny.toml): the "
        "run uses this noise multiplier and is not calibrated to a target"
    ]
    s = load_scenario(
        _scenario(tmp_path, "noise_multiplier = 1.5", name="z.toml"), ["privacy.target_epsilon=4"]
    )
    assert s.privacy.target_epsilon == 4.0
    assert s.privacy.rules == [
        "privacy.target_epsilon = 4 (--set) replaces privacy.noise_multiplier = 1.5 (scenario file z.toml): the "
        "noise multiplier is calibrated to the target epsilon"
    ]


def test_noise_precedence_rules():
    f = [Setting("privacy.target_epsilon", 4.0, "file"), Setting("privacy.noise_multiplier", 2.0, "file")]
    rules, drop = noise_precedence(
        [f, []]
    )  # both in one file (a calibrated run's config.toml): the target decides
    assert (rules, drop) == (
        [
            "privacy.target_epsilon = 4 (file) decides the noise multiplier (calibrated to it); "
            "privacy.noise_multiplier = 2 (file) in the same file is not used"
        ],
        False,
    )
    rules, drop = noise_precedence([f[:1], [Setting("privacy.target_epsilon", None, "--set")]])
    assert (rules, drop) == ([], False)
    with pytest.raises(ScenarioError, match="calibration never gives a non-private run"):
        noise_precedence(
            [[Setting("privacy.noise_multiplier", 0, "file")], [Setting("privacy.target_epsilon", 2, "x")]]
        )


def test_run_prints_and_records_the_rule_and_the_calibrated_noise_multiplier(tmp_path, capsys):
    out = tmp_path / "run"
    path = _scenario(tmp_path, "noise_multiplier = 1.5")
    assert main(["run", path, "--set", "privacy.target_epsilon=8", "--out", str(out), "--no-progress"]) == 0
    console = capsys.readouterr().out
    rule = (
        "privacy.target_epsilon = 8 (--set) replaces privacy.noise_multiplier = 1.5 (scenario file tiny.toml): the "
        "noise multiplier is calibrated to the target epsilon"
    )
    assert f"settings: {rule}" in console
    text = (out / "config.toml").read_text()
    z = tomllib.loads(text)["privacy"]["noise_multiplier"]
    assert z != 1.5 and z > 0
    # the console's line (before round 1), config.toml's comment, summary.json, every row and the ledger agree
    line = next(x for x in console.splitlines() if x.startswith("privacy: noise multiplier"))
    assert line.startswith(f"privacy: noise multiplier {z:.4g} (calibrated to target epsilon 8 over 2 rounds")
    assert console.index(line) < console.index("round   1/2")
    assert f"# privacy.noise_multiplier = {z!r} is calibrated to target epsilon 8 over 2 rounds" in text
    assert f"# settings rule: {rule}" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["noise_multiplier"] == z and summary["settings_rules"] == [rule]
    assert summary["noise_calibration"] == {
        "target_epsilon": 8.0,
        "rounds": 2,
        "delta": 1e-5,
        "accountant": "pld",
    }
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["noise_multiplier"] for r in rows] == [z, z]
    ledger = json.loads((out / "ledger.json").read_text())
    assert {r["mechanism"]["noise_multiplier"] for r in ledger["releases"]} == {z}
    assert 7.9 < summary["final"]["epsilon"] <= 8.0  # the target, spent
    # Poisson sampling with clients_per_round: the paper-bound audit searches populations that can hold the cohort
    assert "error" not in summary["paper_bounds_audit"], summary["paper_bounds_audit"]
    assert "paper bounds: none" not in console


# ------------------------------------------------------------------ fedsim sweep

ISSUE_SWEEP = """
[sweep]
[sweep.grid]
"privacy.target_epsilon" = [2.0, 8.0]

[[sweep.variants]]
label = "dp-fedavg"
"privacy.mechanism" = "independent"

[[sweep.variants]]
label = "non-private (z = 0)"
"privacy.target_epsilon" = "none"
"privacy.noise_multiplier" = 0
"""


def test_the_issues_sweep_is_refused_naming_the_key_the_variant_and_the_grid(tmp_path, capsys):
    path = _scenario(tmp_path, sweep=ISSUE_SWEEP)
    out = tmp_path / "sweep"
    err = _refused(capsys, ["sweep", path, "--seeds", "1", "--parallel", "1", "--out", str(out)])
    assert "sweep variant 'non-private (z = 0)' sets privacy.target_epsilon = none" in err
    assert "the sweep grid varies privacy.target_epsilon over 2.0, 8.0" in err
    assert not out.exists()
    # the same grid given as --grid is named as such
    err = _refused(capsys, ["sweep", path, "--grid", "privacy.target_epsilon=2,8", "--out", str(out)])
    assert "and --grid varies privacy.target_epsilon" in err


def test_a_variants_zero_noise_beside_the_grids_target_is_refused_naming_both(tmp_path):
    sweep = """
[sweep]
[sweep.grid]
"privacy.target_epsilon" = [2.0, 8.0]
[[sweep.variants]]
label = "baseline"
"privacy.noise_multiplier" = 0
"""
    with pytest.raises(ScenarioError) as exc:
        plan_sweep(_scenario(tmp_path, sweep=sweep), out=tmp_path / "o")
    msg = str(exc.value)
    assert "privacy.noise_multiplier = 0 (sweep variant 'baseline')" in msg
    assert "privacy.target_epsilon = 2 (the sweep grid)" in msg


def test_a_set_that_the_sweep_would_replace_is_refused(tmp_path):
    path = _scenario(tmp_path, sweep=ISSUE_SWEEP.split("[[sweep.variants]]")[0])
    with pytest.raises(ScenarioError, match=r"--set privacy.target_epsilon=4 and the sweep grid both set"):
        plan_sweep(path, sets=["privacy.target_epsilon=4"], out=tmp_path / "o")
    with pytest.raises(
        ScenarioError,
        match=r"target_epsilon = 2 \(the sweep grid\) and privacy.noise_multiplier = 1 \(--set\)",
    ):
        plan_sweep(path, sets=["privacy.noise_multiplier=1"], out=tmp_path / "o")


@pytest.mark.parametrize("label", ["Non-Private", "no noise", "baseline (z = 0)", "not private"])
def test_a_variant_labelled_non_private_whose_run_has_noise_is_refused_by_name(tmp_path, label):
    sweep = f"""
[sweep]
[[sweep.variants]]
label = "{label}"
"privacy.clip" = 0.5
"""
    expected = f"sweep variant {label!r} is labelled as adding no noise, but its run has privacy.noise_multiplier = 1:"
    with pytest.raises(ScenarioError, match=re.escape(expected)):
        plan_sweep(_scenario(tmp_path, sweep=sweep), out=tmp_path / "o")
    # a label that only looks like one is not refused
    ok = sweep.replace(label, "z = 0.5")
    assert len(plan_sweep(_scenario(tmp_path, sweep=ok, name="ok.toml"), out=tmp_path / "o")[1]) == 1


def test_a_variant_labelled_non_private_runs_without_noise_and_its_ledger_says_so(tmp_path, capsys):
    sweep = """
[sweep]
[[sweep.variants]]
label = "dp-fedavg"
"privacy.target_epsilon" = 8.0
[[sweep.variants]]
label = "non-private (z = 0)"
"privacy.target_epsilon" = "none"
"privacy.noise_multiplier" = 0
"""
    path = _scenario(tmp_path, "noise_multiplier = 1.0", sweep=sweep)
    out = tmp_path / "sweep"
    assert main(["sweep", path, "--seeds", "1", "--parallel", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    runs = {p.parent.parent.name: p.parent for p in out.rglob("summary.json")}
    assert len(runs) == 2
    base = next(d for name, d in runs.items() if "non-private" in name)
    dp = next(d for name, d in runs.items() if "dp-fedavg" in name)

    summary = json.loads((base / "summary.json").read_text())
    assert (
        summary["private"] is False
        and summary["noise_multiplier"] == 0.0
        and summary["noise_calibration"] is None
    )
    eps = summary["final"]["epsilon"]
    assert eps is None or math.isinf(eps)  # infinite: written as null beside its reason, or inf
    ledger = json.loads((base / "ledger.json").read_text())
    assert ledger["releases"] and {r["mechanism"]["noise_multiplier"] for r in ledger["releases"]} == {0.0}
    rows = [json.loads(x) for x in (base / "metrics.jsonl").read_text().splitlines()]
    assert all(
        r["private"] is False and r["noise_multiplier"] == 0.0 and r["noise_std_sum"] == 0.0 for r in rows
    )
    assert all(r["epsilon"] is None or math.isinf(r["epsilon"]) for r in rows)
    assert tomllib.loads((base / "config.toml").read_text())["privacy"]["noise_multiplier"] == 0.0

    summary = json.loads((dp / "summary.json").read_text())
    assert summary["private"] is True and summary["noise_multiplier"] > 0
    assert 7.9 < summary["final"]["epsilon"] <= 8.0
    assert summary["settings_rules"] == [
        "privacy.target_epsilon = 8 (sweep variant 'dp-fedavg') replaces privacy.noise_multiplier = 1 (scenario "
        "file tiny.toml): the noise multiplier is calibrated to the target epsilon"
    ]


def test_the_python_api_refuses_a_target_epsilon_beside_the_non_private_baseline():
    """No loader layers there: the schema itself refuses z = 0 with a target, which a calibration would replace."""
    from fedsim.scenarios.schema import PrivacyConfig
    from fedsim.validation import PrivacyInputError

    with pytest.raises(ValueError, match="noise_multiplier=0, the non-private baseline") as info:
        PrivacyConfig(sampling_rate=0.1, target_epsilon=4, noise_multiplier=0)
    assert isinstance(info.value, PrivacyInputError) or "target_epsilon" in str(info.value)
    assert PrivacyConfig(sampling_rate=0.1, target_epsilon=4).noise_multiplier > 0  # calibrated later
    assert PrivacyConfig(sampling_rate=0.1, noise_multiplier=0).target_epsilon is None
