"""``fedsim sweep``'s statistics: each run's held-out accuracy averaged over its last k evaluated rounds, the
Student t interval over seeds, the non-private baseline (``noise_multiplier = 0``) as a reference line, and the
privacy-utility plot's axes and labels."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.text import Text

from fedsim.cli import main
from fedsim.report import sweep_table
from fedsim.report.rundir import read_rows
from fedsim.report.sweep_figure import privacy_utility_figure
from fedsim.report.sweep_table import MEAN, SweepRun, add_statistics, last_k_mean, t_interval
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.sweep import plan_sweep, run_sweep

# t quantiles at 0.975 (the 95% two-sided interval) from a table: 1 and 2 degrees of freedom
T_1, T_2 = 12.706204736174694, 4.302652729749462


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_the_last_k_mean_and_the_t_interval_on_known_numbers():
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert last_k_mean(values, 5) == (pytest.approx(0.4), 5)  # 0.2 ... 0.6
    assert last_k_mean(values, 1) == (pytest.approx(0.6), 1)
    assert last_k_mean(values, 10) == (pytest.approx(0.35), 6)  # fewer evaluated rounds than k: all of them
    assert last_k_mean([], 5) == (None, 0)
    with pytest.raises(ValueError):
        last_k_mean(values, 0)
    mean, half, n = t_interval([1.0, 2.0, 3.0])  # sd 1
    assert (mean, n) == (2.0, 3) and half == pytest.approx(T_2 / math.sqrt(3))
    mean, half, n = t_interval([0.2, 0.4])  # sd 0.1 * sqrt(2): half = t * sd / sqrt(2) = t * 0.1
    assert mean == pytest.approx(0.3) and half == pytest.approx(T_1 * 0.1) and n == 2
    assert t_interval([0.5]) == (0.5, None, 1) and sweep_table.interval_text(1) == "n=1, no interval"
    assert t_interval([]) == (None, None, 0)


def test_k_is_the_scenarios_sweep_last_or_last_and_must_be_positive(tmp_path, capsys):
    assert load_scenario("noise-sweep").sweep.last == 5
    assert load_scenario("noise-sweep", ["sweep.last=3"]).sweep.last == 3
    with pytest.raises(ScenarioError, match=r"sweep\.last"):
        load_scenario("noise-sweep", ["sweep.last=0"])
    assert main(["sweep", "noise-sweep", "--last", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--last must be >= 1" in capsys.readouterr().err and not (tmp_path / "s").exists()


ARGV = [
    "sweep",
    "noise-sweep",
    "--grid",
    "privacy.noise_multiplier=0,1.0",
    "--seeds",
    "2",
    "--parallel",
    "1",
    "--last",
    "2",
]
# 5 rounds evaluated every 2nd (and the last): rounds 2, 4, 5 have held-out rows; the last 2 are rounds 4 and 5
TINY = ["--set", "rounds=5", "--set", "data.num_clients=40", "--set", "engine.eval_every=2"]


def test_a_sweep_reports_the_last_k_mean_per_run_and_the_t_interval_per_setting(
    tmp_path, capsys, monkeypatch
):
    from fedsim.report.rundir import RunWriter

    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])  # each run's own plots: most of its time
    out = tmp_path / "sweep"
    assert main([*ARGV, *TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out

    runs = _csv(out / "sweep.csv")
    mean_col, final_col = (
        "heldout_accuracy (mean of last 2 evaluated rounds)",
        "heldout_accuracy (final round)",
    )
    assert {mean_col, final_col, "heldout_rounds_averaged", "epsilon", "private"} <= set(runs[0])
    per_run: dict[str, list[float]] = {}
    for r in runs:
        rows = read_rows(r["run_dir"])
        held = [row["heldout_accuracy"] for row in rows if "heldout_accuracy" in row]
        assert len(rows) == 5 and [row["round"] for row in rows if "heldout_accuracy" in row] == [2, 4, 5]
        assert float(r[mean_col]) == pytest.approx(np.mean(held[-2:]), rel=1e-5)
        assert float(r[final_col]) == pytest.approx(held[-1], rel=1e-5)
        assert r["heldout_rounds_averaged"] == "2"
        if r["privacy.noise_multiplier"] == "0":  # not private: no noise, epsilon infinite
            assert (r["epsilon"], r["private"]) == ("inf", "false")
            assert rows[-1]["private"] is False and rows[-1]["epsilon"] is None
        else:
            assert r["private"] == "true" and float(r["epsilon"]) == pytest.approx(
                rows[-1]["epsilon"], rel=1e-5
            )
        per_run.setdefault(r["privacy.noise_multiplier"], []).append(float(r[mean_col]))

    settings = _csv(out / "sweep_summary.csv")
    assert [s["privacy.noise_multiplier"] for s in settings] == ["0", "1.0"]
    for s in settings:
        a, b = per_run[s["privacy.noise_multiplier"]]
        assert s["runs"] == "2" and s["failed"] == "0"
        assert float(
            s["heldout_accuracy (mean of last 2 evaluated rounds; mean over seeds)"]
        ) == pytest.approx((a + b) / 2, rel=1e-5)
        # two seeds: t(0.975, 1) * sd / sqrt(2) = t * |a - b| / 2
        assert float(s["ci95_halfwidth (Student t over seeds)"]) == pytest.approx(
            T_1 * abs(a - b) / 2, rel=1e-4
        )
        assert s["interval"] == "95% Student t interval over 2 seeds"
        assert s["epsilon_min"] == s["epsilon_max"]  # the same schedule: the same epsilon for every seed
    assert settings[0]["epsilon_max"] == "inf" and settings[0]["private"] == "false"

    # printed to a pipe, the tables are not cut at 80 columns: each header and cell whole on its line
    assert max(map(len, printed.splitlines())) > 120
    assert "mean of last 2 evaluated rounds" in printed and "inf (not private)" in printed
    assert "sweep_summary.csv" in printed
    assert (out / "privacy_utility.png").stat().st_size > 10_000

    # the plot: the z = 0 runs are a labelled horizontal line at their mean, their interval a band around it
    _, planned = plan_sweep(
        "noise-sweep", sets=TINY[1::2], grid={"privacy.noise_multiplier": [0, 1.0]}, seeds=2, out=out
    )
    run_sweep("noise-sweep", planned)  # every run finished before: read back, nothing runs
    assert {r.result["status"] for r in planned} == {"skipped: finished before"}
    add_statistics(planned, 2)
    fig = privacy_utility_figure(planned, line=None, title="noise-sweep", last=2)
    ax = fig.axes[0]
    (ref,) = [line for line in ax.lines if line.get_label().startswith("non-private (noise_multiplier = 0)")]
    base = settings[0]
    mean = 100 * float(base["heldout_accuracy (mean of last 2 evaluated rounds; mean over seeds)"])
    half = 100 * float(base["ci95_halfwidth (Student t over seeds)"])
    assert np.allclose(ref.get_ydata(), mean, rtol=1e-4) and ref.get_linestyle() == "--"
    (band,) = ax.patches
    ys = ax.transData.inverted().transform(band.get_transform().transform(band.get_path().vertices))[:, 1]
    assert [ys.min(), ys.max()] == pytest.approx([mean - half, mean + half], rel=1e-4)
    assert "non-private (noise_multiplier = 0)" in [
        t.get_text().splitlines()[0] for t in ax.get_legend().get_texts()
    ]
    assert "certified epsilon" in ax.get_xlabel() and "mean of last 2 evaluated rounds" in ax.get_ylabel()
    plt.close(fig)


def _run(setting, seed, eps, acc, *, private=True, sampling="poisson", population=400, cohort=40):
    r = SweepRun(dict(setting), seed, [], Path("unused"))
    r.result = {
        MEAN: acc,
        "heldout_accuracy_final": acc,
        "epsilon": eps if private else math.inf,
        "private": private,
        "status": "done",
        "delta": 1e-5,
        "accountant": "pld",
    }
    r.facts = {"sampling": sampling, "population": population, "cohort": cohort, "noise_multiplier": 1.0}
    return r


def test_at_constant_epsilon_accuracy_is_plotted_against_the_varied_key():
    runs = [
        _run({"client.lr": lr}, s, 3.0, 0.5 + lr + 0.01 * s) for lr in (0.01, 0.05, 0.1) for s in range(2)
    ]
    fig = privacy_utility_figure(runs, line=None, title="lr")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "client.lr"
    assert "epsilon is the same (3) for every private setting" in ax.get_title().replace("\n", " ")
    assert "plotted against client.lr" in ax.get_title().replace("\n", " ")
    (curve,) = ax.containers  # the error bar: its data line, one point per setting
    assert curve.get_label() == "DP-FedAvg (private)"
    assert list(curve.lines[0].get_xdata()) == [0.01, 0.05, 0.1]
    plt.close(fig)


def test_point_labels_do_not_overlap_and_the_all_sampling_is_said():
    eps = {"poisson": 4.0, "fixed": 18.0, "all": 37.0}
    runs = [
        _run(
            {"variant": v, "privacy.noise_multiplier": z},
            s,
            eps[v] / z,
            0.55 - 0.01 * z + 0.001 * s,
            sampling=v,
            population=40 if v == "all" else 400,
        )
        for v, z, s in itertools.product(eps, (0.9, 0.95, 1.0, 1.05, 1.1), range(2))
    ]
    fig = privacy_utility_figure(runs, line="variant", title="sampling-compare")
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text alone, not its leader line
    assert len(boxes) == 15 and {t.get_text() for t in ax.texts} >= {"z=0.9", "z=1.1"}
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    legend = " ".join(t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts())
    assert "'all' trains every client each round" in legend and "sampling all: population 40" in legend
    assert "95% Student t interval over seeds" in legend
    # the legend is outside the axes: it covers no data
    assert ax.get_legend().get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    plt.close(fig)
