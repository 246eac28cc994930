"""``fedsim sweep`` (the comparison table, the plot, a restart that skips finished runs, Ray), ``fedsim report`` (the
plots it draws and the overlays), and the shipped scenarios (each loads, each sweep plans)."""

from __future__ import annotations

import csv
import json

import pytest

from fedsim.cli import main
from fedsim.scenarios import available_scenarios, load_scenario
from fedsim.sweep import parse_grid, plan_sweep, split_values

TINY = ["--set", "rounds=2", "--set", "data.num_clients=60", "--set", "engine.eval_every=1"]


def _csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_sweep_writes_its_table_and_plot_and_a_restart_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = [
        "sweep",
        "noise-sweep",
        "--grid",
        "privacy.noise_multiplier=0.8,2.0",
        "--seeds",
        "2",
        "--parallel",
        "1",
    ]
    assert main([*argv, *TINY, "--out", str(out)]) == 0
    rows = _csv(out / "sweep.csv")
    assert [(r["privacy.noise_multiplier"], r["seed"]) for r in rows] == [
        ("0.8", "0"),
        ("0.8", "1"),
        ("2.0", "0"),
        ("2.0", "1"),
    ]
    for r in rows:
        assert r["status"] == "done" and r["rounds"] == "2"
        summary = json.loads(
            (
                out
                / f"noise_multiplier={r['privacy.noise_multiplier']}"
                / f"seed{r['seed']}"
                / "summary.json"
            ).read_text()
        )
        assert float(r["epsilon"]) == pytest.approx(summary["final"]["epsilon"], rel=1e-5)
        assert float(r["heldout_accuracy (final round)"]) == pytest.approx(
            summary["final"]["heldout_accuracy"], rel=1e-5
        )
        assert r["heldout_accuracy (mean of last 5 evaluated rounds)"]  # both rounds: fewer than 5 evaluated
        assert r["heldout_rounds_averaged"] == "2"
        # exact statistics of training clients and timings: labelled non-private in the header itself
        assert r["non_private_train_accuracy"] and r["non_private_gap_accuracy"]
        assert float(r["non_private_wall_s"]) > 0
        assert float(r["non_private_gap_accuracy"]) == pytest.approx(
            summary["final_non_private"]["gap_accuracy"], rel=1e-5, abs=1e-6
        )
    assert not {"train_accuracy", "gap_accuracy", "wall_s"} & set(rows[0])
    # less noise, more epsilon: the same seed certifies more at z=0.8 than at z=2
    assert float(rows[0]["epsilon"]) > float(rows[2]["epsilon"])
    assert (out / "privacy_utility.png").stat().st_size > 10_000
    assert [r["runs"] for r in _csv(out / "sweep_summary.csv")] == ["2", "2"]
    printed = capsys.readouterr().out
    assert "held-out acc" in printed and "noise_multiplier" in printed
    assert printed.count("(non-private)") == 3  # train acc, gap, wall s: their headers say so

    # a run killed before it finished (no summary.json) and before any checkpoint it could resume from, and the
    # others finished: only it runs again (seeded, with its own config: the same cohorts and noise)
    killed = out / "noise_multiplier=2.0" / "seed1"
    (killed / "summary.json").unlink()
    (killed / "checkpoint.npz").unlink(missing_ok=True)
    kept = {p: p.stat().st_mtime_ns for p in out.glob("noise_multiplier=0.8/seed*/metrics.jsonl")}
    assert main([*argv, *TINY, "--out", str(out)]) == 0
    rows = _csv(out / "sweep.csv")
    assert [r["status"] for r in rows] == ["skipped: finished before"] * 3 + ["done"]
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished runs untouched
    assert (
        out / "noise_multiplier=2.0" / "seed1.incomplete-1" / "config.toml"
    ).is_file()  # moved aside, not lost


def test_a_sweep_on_ray_gives_the_same_table_as_one_after_the_other(tmp_path):
    grid = ["--grid", "privacy.noise_multiplier=0.8,2.0", "--seeds", "1"]
    for parallel, out in (("2", "ray"), ("1", "seq")):
        argv = ["sweep", "noise-sweep", *grid, "--parallel", parallel, *TINY, "--out", str(tmp_path / out)]
        assert main(argv) == 0, parallel
    ray_rows, seq_rows = _csv(tmp_path / "ray" / "sweep.csv"), _csv(tmp_path / "seq" / "sweep.csv")
    for a, b in zip(ray_rows, seq_rows, strict=True):
        assert a["status"] == b["status"] == "done"
        assert float(a["epsilon"]) == float(b["epsilon"])
        for column in (
            "heldout_accuracy (final round)",
            "heldout_accuracy (mean of last 5 evaluated rounds)",
        ):
            assert float(a[column]) == pytest.approx(float(b[column]), abs=1e-6)
    config = load_scenario(str(tmp_path / "ray" / "noise_multiplier=0.8" / "seed0" / "config.toml"))
    assert config.engine.name == "local"  # what ran is what the run directory says


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grid", "privacy.noise_multiplier=-1"], "sweep run noise_multiplier=-1 seed 0: invalid scenario"),
        (["--grid", "privacy.noise_multiplier"], "--grid expects key=v1,v2"),
        (["--grid", "privacy.bogus=1,2"], "unknown key"),
        (["--line", "seed"], "--line 'seed' is not a key of this sweep"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--parallel", "0"], "--parallel must be >= 1"),
    ],
)
def test_a_bad_sweep_is_refused_before_any_run(tmp_path, capsys, argv, message):
    out = tmp_path / "bad"
    assert main(["sweep", "noise-sweep", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_grid_values_split_on_top_level_commas_only():
    assert split_values('0.5, [32,32], "a,b", none') == ["0.5", "[32,32]", '"a,b"', "none"]
    assert parse_grid(["model.hidden=[32,32],[64]", "privacy.sampling=poisson,fixed"]) == {
        "model.hidden": [[32, 32], [64]],
        "privacy.sampling": ["poisson", "fixed"],
    }


def test_report_draws_the_plots_and_overlays_several_runs(tmp_path, capsys):
    runs = []
    for z in ("0.8", "2.0"):
        out = tmp_path / f"z{z}"
        assert (
            main(
                [
                    "run",
                    "noise-sweep",
                    "--no-progress",
                    "--out",
                    str(out),
                    "--set",
                    f"privacy.noise_multiplier={z}",
                    *TINY,
                ]
            )
            == 0
        )
        assert {"accuracy.png", "epsilon.png", "generalization.png"} <= {
            p.name for p in (out / "plots").iterdir()
        }
        (out / "plots" / "epsilon.png").unlink()
        runs.append(out)
    capsys.readouterr()
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "overlay")]) == 0
    printed = capsys.readouterr().out
    for out in runs:
        assert (
            out / "plots" / "epsilon.png"
        ).stat().st_size > 10_000  # drawn again, with rdp from the ledger
        assert f"{out}: scenario noise-sweep" in printed
    assert "certified epsilon" in printed and "generalization (UAI Theorem 1" in printed
    assert {"overlay_accuracy.png", "overlay_epsilon.png"} <= {
        p.name for p in (tmp_path / "overlay").iterdir()
    }
    assert main(["report", str(tmp_path / "nothing-here")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


SHIPPED = ["quickstart", "sampling-compare", "noise-sweep", "adaptive-clipping", "agnostic-domains"]


def test_every_shipped_scenario_loads_says_what_it_compares_and_plans_its_sweep(tmp_path):
    names = available_scenarios()
    assert set(SHIPPED) <= set(names)
    for name in names:
        scenario = load_scenario(name)
        assert scenario.name == name and len(scenario.description) > 30, name
        _, runs = plan_sweep(name, out=tmp_path / name)  # every run of its own sweep validates
        assert runs and all(r.out.is_relative_to(tmp_path / name) for r in runs)
    assert load_scenario("agnostic").name == "agnostic-domains"  # the old name still loads
    _, runs = plan_sweep("sampling-compare", out=tmp_path / "s")
    assert {r.setting["variant"] for r in runs} == {"poisson", "fixed", "all"}
    every = [r for r in runs if r.setting["variant"] == "all"]
    fixed = [r for r in runs if r.setting["variant"] == "fixed"]
    assert load_scenario("sampling-compare", every[0].overrides).privacy.clients_per_round is None
    assert load_scenario("sampling-compare", fixed[0].overrides).privacy.clients_per_round == 40
