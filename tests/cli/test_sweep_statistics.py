"""``fedsim sweep``'s statistics: each run's held-out accuracy averaged over its last k evaluated rounds, the
Student t interval over seeds, the non-private baseline (``noise_multiplier = 0``) as a reference line, and the
privacy-utility plot's axes and labels."""

from __future__ import annotations

import csv
import itertools
import math
import tomllib
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

    # paired by seed against the reference, the first setting (z = 0): the seeds' differences, by hand
    by_seed = {(r["privacy.noise_multiplier"], r["seed"]): float(r[mean_col]) for r in runs}
    diffs = [by_seed[("1.0", s)] - by_seed[("0", s)] for s in ("0", "1")]
    ref, other = settings
    assert (ref["reference"], other["reference"]) == ("true", "false") and ref["paired_seeds"] == ""
    diff = "paired_difference (mean of last 2 evaluated rounds; setting - reference, mean over paired seeds)"
    assert float(other[diff]) == pytest.approx(sum(diffs) / 2, rel=1e-4)
    assert float(other["paired_ci95_halfwidth (Student t over paired differences)"]) == pytest.approx(
        T_1 * abs(diffs[0] - diffs[1]) / 2, rel=1e-3
    )
    above = sum(d > 0 for d in diffs)
    assert (other["paired_seeds"], other["paired_above"]) == ("2", str(above))
    pairs = _csv(out / "sweep_paired.csv")
    assert [(p["privacy.noise_multiplier"], p["seed"]) for p in pairs] == [("1.0", "0"), ("1.0", "1")]
    assert [float(p["difference (setting - reference)"]) for p in pairs] == pytest.approx(diffs, rel=1e-4)
    # the noise multiplier each run used, as its config.toml says; both seeds were the run's data and noise seeds
    for r in runs:
        config = tomllib.loads((Path(r["run_dir"]) / "config.toml").read_text())
        assert float(r["noise_multiplier"]) == config["privacy"]["noise_multiplier"]
        assert r["data_seed"] == r["noise_seed"] == r["seed"] == str(config["data_seed"])
    assert [s["noise_multiplier"] for s in settings] == ["0", "1"]
    assert (
        "reference: privacy.noise_multiplier=0 (every other setting is compared with it seed by seed"
        in printed
    )
    assert "seeds 0, 1: each run's data_seed and noise_seed" in printed
    assert "privacy.noise_multiplier=0" in printed and "sweep_paired.csv" in printed

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
    assert (
        "certified epsilon" in fig.axes[-1].get_xlabel()
        and "mean of last 2 evaluated rounds" in ax.get_ylabel()
    )
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
    assert fig.axes[-1].get_xlabel() == "client.lr"  # under the paired panel, which shares the x axis
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
    # the notes are under the figure (the legend holds the marks only)
    legend = " ".join(t.get_text().replace("\n", " ") for t in [*ax.get_legend().get_texts(), *fig.texts])
    assert "'all' trains every client each round" in legend and "sampling all: population 40" in legend
    assert "95% Student t interval over seeds" in legend
    # the legend is outside the axes: it covers no data
    assert ax.get_legend().get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    plt.close(fig)


# --- differences against a reference setting, paired by seed -------------------------------------------------------

#: held-out means by setting and seed; C's seed 2 failed (no pair), D ties the reference in seed 0
PAIRED = {
    "A": [0.50, 0.60, 0.55],
    "B": [0.56, 0.63, 0.62],
    "C": [0.45, 0.58, None],
    "D": [0.50, 0.61, 0.54],
}


def _paired_runs():
    runs = []
    for v, values in PAIRED.items():
        for seed, acc in enumerate(values):
            r = _run({"variant": v, "privacy.noise_multiplier": 1.0}, seed, 2.0, acc)
            if acc is None:
                r.result = {"status": "error: RuntimeError: boom", "run_dir": "unused"}
            runs.append(r)
    return runs


def _sd(values):  # by hand: the sample standard deviation (n - 1)
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def test_paired_differences_against_a_hand_computation():
    runs = _paired_runs()
    ref = sweep_table.reference_setting(runs, None)  # the first setting
    assert ref == {"variant": "A", "privacy.noise_multiplier": 1.0}
    by = {d.setting["variant"]: d for d in sweep_table.paired_differences(runs, ref)}
    assert list(by) == ["B", "C", "D"]  # sweep order, the reference left out

    b = by["B"]
    diffs = [0.56 - 0.50, 0.63 - 0.60, 0.62 - 0.55]
    assert b.seeds == [0, 1, 2] and b.differences == pytest.approx(diffs) and b.n == 3
    assert b.mean == pytest.approx(sum(diffs) / 3)
    assert b.half == pytest.approx(T_2 * _sd(diffs) / math.sqrt(3))
    assert (b.above, b.below, b.signs) == (3, 0, "3/3 above")
    assert b.reference == ref and b.setting == {"variant": "B", "privacy.noise_multiplier": 1.0}
    # the point of pairing: the seeds' shared spread cancels, the unpaired intervals overlap
    summary = {s.setting["variant"]: s for s in sweep_table.summarise_settings(runs)}
    assert summary["A"].mean + summary["A"].half > summary["B"].mean - summary["B"].half
    assert b.mean - b.half > 0

    c = by["C"]  # seed 2 failed: two pairs
    assert c.seeds == [0, 1] and c.differences == pytest.approx([-0.05, -0.02])
    assert c.half == pytest.approx(T_1 * abs(-0.05 - -0.02) / 2)
    assert (c.above, c.below, c.signs) == (0, 2, "2/2 below")
    assert c.text() == f"{c.mean:+.3f} +- {c.half:.3f} (2 pairs; 2/2 below)"

    d = by["D"]
    assert d.differences[0] == 0.0 and (d.above, d.below) == (1, 1)
    assert d.signs == "1/3 above, 1/3 below, 1/3 equal"

    # another reference: the differences change sign
    ref_b = sweep_table.reference_setting(runs, "variant=B")
    a = sweep_table.paired_differences(runs, ref_b)[0]
    assert a.setting["variant"] == "A" and a.mean == pytest.approx(-b.mean) and a.signs == "3/3 below"
    assert sweep_table.paired_differences(runs, None) == []


def test_one_pair_has_no_interval_and_no_pair_has_no_mean():
    runs = [_run({"z": 0}, 0, 1.0, 0.5), _run({"z": 1}, 0, 1.0, 0.4), _run({"z": 2}, 5, 1.0, 0.4)]
    one, none = sweep_table.paired_differences(runs, {"z": 0})
    assert (one.n, one.half, one.signs) == (1, None, "1/1 below")
    assert one.text() == f"{one.mean:+.3f} (1 pair, no interval; 1/1 below)"
    assert (none.n, none.mean, none.half, none.seeds) == (0, None, None, [])
    assert none.signs == "no paired seeds" and none.text() == "n/a (no paired seeds)"


def test_the_reference_is_resolved_or_refused_with_a_clear_message():
    runs = _paired_runs()
    resolve = sweep_table.reference_setting
    assert resolve(runs, "variant=C")["variant"] == "C"
    # a key's last part names it; numbers compare as numbers (1 is 1.0)
    assert resolve(runs, "variant=D,noise_multiplier=1")["variant"] == "D"
    assert resolve(runs, 'privacy.noise_multiplier=1.0, variant="B"')["variant"] == "B"
    with pytest.raises(
        ScenarioError,
        match=r"'variant=Z' matches no setting of this sweep; its settings: "
        r"variant=A,privacy.noise_multiplier=1.0; variant=B",
    ):
        resolve(runs, "variant=Z")
    with pytest.raises(ScenarioError, match=r"matches 4 settings of this sweep \(variant=A,.*\): add keys"):
        resolve(runs, "noise_multiplier=1")
    with pytest.raises(
        ScenarioError,
        match=r"'mechanism' is not a key of this sweep's settings; its keys: "
        r"variant, privacy.noise_multiplier",
    ):
        resolve(runs, "mechanism=independent")
    with pytest.raises(ScenarioError, match=r"'variant' is not key=value; .*e\.g\. variant=A"):
        resolve(runs, "variant")
    with pytest.raises(ScenarioError, match=r"variant is given twice"):
        resolve(runs, "variant=A,variant=B")
    with pytest.raises(ScenarioError, match=r"matches no setting"):
        resolve(runs, "variant=true")  # a boolean is not a name
    two = [
        _run({"client.lr": 0.1, "server.lr": 1.0}, 0, 1.0, 0.5),
        _run({"client.lr": 0.2, "server.lr": 1.0}, 0, 1.0, 0.5),
    ]
    with pytest.raises(
        ScenarioError, match=r"'lr' names several keys of this sweep \(client.lr, server.lr\)"
    ):
        resolve(two, "lr=0.1")
    # none is none (TOML has none, so a [sweep] table writes it as a string)
    eps = [_run({"privacy.target_epsilon": v}, 0, 1.0, 0.5) for v in ("none", 4.0)]
    assert resolve(eps, "target_epsilon=none") == {"privacy.target_epsilon": "none"}
    # a name with a comma is quoted where the sweep prints it, and read back so
    odd = [_run({"variant": v}, 0, 1.0, 0.5) for v in ("a,b", "c")]
    assert sweep_table.setting_text(odd[0].setting) == 'variant="a,b"'
    assert resolve(odd, sweep_table.setting_text(odd[0].setting)) == {"variant": "a,b"}
    # one setting: nothing to compare with, but a reference that is not it is still an error
    single = [_run({"z": 1.0}, s, 1.0, 0.5) for s in range(2)]
    assert resolve(single, None) is None and resolve(single, "z=1") is None
    with pytest.raises(ScenarioError, match=r"matches no setting"):
        resolve(single, "z=2")


def test_the_summary_and_paired_csvs_mark_the_reference_and_give_the_pairs(tmp_path):
    runs = _paired_runs()
    for r in runs:
        if r.setting["variant"] == "D":  # calibrated to a target: its own noise multiplier
            r.facts = {**r.facts, "noise_multiplier": 2.8137, "calibrated": True}
    sweep_table.write_summary_csv(runs, tmp_path / "s.csv", last=5, reference="variant=B")
    rows = {row["variant"]: row for row in _csv(tmp_path / "s.csv")}
    diff = "paired_difference (mean of last 5 evaluated rounds; setting - reference, mean over paired seeds)"
    half = "paired_ci95_halfwidth (Student t over paired differences)"
    assert rows["B"]["reference"] == "true" and rows["B"][diff] == rows["B"]["paired_seeds"] == ""
    assert [rows[v]["reference"] for v in "ACD"] == ["false"] * 3
    a = [0.50 - 0.56, 0.60 - 0.63, 0.55 - 0.62]
    assert float(rows["A"][diff]) == pytest.approx(sum(a) / 3, rel=1e-5)
    assert float(rows["A"][half]) == pytest.approx(T_2 * _sd(a) / math.sqrt(3), rel=1e-5)
    assert (rows["A"]["paired_seeds"], rows["A"]["paired_above"], rows["A"]["paired_below"]) == (
        "3",
        "0",
        "3",
    )
    assert rows["A"]["paired_signs"] == "3/3 below" and rows["C"]["paired_seeds"] == "2"
    assert float(rows["C"][half]) == pytest.approx(T_1 * abs((0.45 - 0.56) - (0.58 - 0.63)) / 2, rel=1e-5)
    assert (rows["A"]["noise_multiplier"], rows["A"]["noise_multiplier_calibrated"]) == ("1", "false")
    assert (rows["D"]["noise_multiplier"], rows["D"]["noise_multiplier_calibrated"]) == ("2.8137", "true")

    sweep_table.write_paired_csv(runs, tmp_path / "p.csv", last=5, reference="variant=B")
    pairs = _csv(tmp_path / "p.csv")
    assert [(p["variant"], p["seed"]) for p in pairs] == [
        ("A", "0"),
        ("A", "1"),
        ("A", "2"),
        ("C", "0"),
        ("C", "1"),
        ("D", "0"),
        ("D", "1"),
        ("D", "2"),
    ]
    c1 = pairs[4]
    assert c1["reference"] == "variant=B,privacy.noise_multiplier=1.0"
    assert float(c1["heldout_accuracy (mean of last 5 evaluated rounds)"]) == pytest.approx(0.58)
    assert float(c1["reference_heldout_accuracy (mean of last 5 evaluated rounds)"]) == pytest.approx(0.63)
    assert float(c1["difference (setting - reference)"]) == pytest.approx(0.58 - 0.63)
    # one setting: a header, no pairs
    sweep_table.write_paired_csv(runs[:3], tmp_path / "one.csv")
    assert _csv(tmp_path / "one.csv") == []


def test_a_runs_facts_give_the_noise_multiplier_it_used_and_its_seeds(tmp_path):
    import tomli_w

    config = {
        "seed": 2,
        "data": {"num_clients": 50, "heldout_fraction": 0.1},
        # as a run calibrated to a target writes it: the noise multiplier it computed (fedsim.engine.runner)
        "privacy": {
            "sampling": "poisson",
            "sampling_rate": 0.2,
            "noise_multiplier": 2.8137,
            "target_epsilon": 4.0,
        },
    }
    (tmp_path / "config.toml").write_text(tomli_w.dumps(config))
    facts = sweep_table._run_facts(tmp_path, {})
    assert (facts["noise_multiplier"], facts["calibrated"]) == (2.8137, True)
    assert (facts["data_seed"], facts["noise_seed"]) == (
        2,
        2,
    )  # a config from before the two seeds: seed drew both
    config = {
        **config,
        "data_seed": 7,
        "noise_seed": 2,
        "privacy": {**config["privacy"], "target_epsilon": None},
    }
    config["privacy"] = {k: v for k, v in config["privacy"].items() if v is not None}
    (tmp_path / "config.toml").write_text(tomli_w.dumps(config))
    facts = sweep_table._run_facts(tmp_path, {})
    assert (facts["calibrated"], facts["data_seed"], facts["noise_seed"]) == (False, 7, 2)
    # summary.json's record comes first (what the strategy ran with, and the target it was calibrated to)
    summary = {"noise_multiplier": 2.81, "noise_calibration": {"target_epsilon": 4.0, "rounds": 20}}
    facts = sweep_table._run_facts(tmp_path, summary)
    assert (facts["noise_multiplier"], facts["calibrated"]) == (2.81, True)


def test_a_bad_reference_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "noise-sweep", "--reference", "noise_multiplier=9", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--reference 'noise_multiplier=9' matches no setting of this sweep; its settings: " in err
    assert "privacy.noise_multiplier=0.5" in err and not out.exists()
    assert main(["sweep", "noise-sweep", "--set", "sweep.reference=clip=1", "--out", str(out)]) == 2
    assert "'clip' is not a key of this sweep's settings" in capsys.readouterr().err and not out.exists()


# --- privacy_utility.png: bars that share an epsilon, the paired panel, baselines (issue 34, figures) -----------------
#: each seed redraws the data: an effect shared by every setting of that seed, larger than the settings' differences
DATA_EFFECT = {0: 0.0, 1: -0.12, 2: 0.09}
MECHANISMS = {"independent": 0.0, "tree": -0.05, "banded-mf": 0.03}


def _mechanism_runs(epsilons=(2.0, 4.0), baseline=False):
    runs = [
        _run(
            {"privacy.target_epsilon": e, "variant": v},
            s,
            e * (1 - 0.0004 * i),  # calibrated runs land a hair off their target
            0.55 + 0.02 * e + effect + DATA_EFFECT[s] + 0.003 * ((s + i) % 3),
        )
        for i, (v, effect) in enumerate(MECHANISMS.items())
        for e in epsilons
        for s in range(3)
    ]
    if baseline:  # the same runs under every target epsilon: noise_multiplier 0 ignores it
        runs += [
            _run(
                {"privacy.target_epsilon": e, "variant": "non-private"},
                s,
                0,
                0.7 + DATA_EFFECT[s],
                private=False,
            )
            for e in epsilons
            for s in range(3)
        ]
    return runs


def _display_x(container):
    """The display x of an error bar's points, shifted as drawn."""
    line = container.lines[0]
    return line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))[:, 0]


def test_bars_at_one_epsilon_stand_apart_and_the_paired_panel_shows_each_mechanism_against_the_reference():
    runs = _mechanism_runs()
    fig = privacy_utility_figure(runs, line="variant", title="noise-mechanisms", last=3)
    fig.canvas.draw()
    top, paired = fig.axes[:2]
    assert paired.get_shared_x_axes().joined(top, paired)
    # one container per mechanism, its two points at epsilon 2 and 4; at one epsilon, their x on screen differ
    xs = [_display_x(c) for c in top.containers]
    assert len(xs) == 3
    for i in range(2):
        at = sorted(x[i] for x in xs)
        assert min(np.diff(at)) >= 5.0, at  # pixels apart
    # no label repeats the x axis (target_epsilon is what the certified epsilon was calibrated to)
    assert not [t for t in top.texts if "target_epsilon" in t.get_text()]
    # the paired panel: the reference ("independent", the first setting's variant) is the zero line, named
    zero = [line for line in paired.get_lines() if np.allclose(line.get_ydata(), 0.0)]
    assert zero, "no zero line"
    names = [t.get_text().replace("\n", " ") for t in paired.get_legend().get_texts()]
    assert names[0].startswith("reference: variant = independent")
    # each other mechanism: its mean paired difference at each epsilon, computed here from the seeds
    for container in paired.containers:
        ys = container.lines[0].get_ydata()
        matches = []
        for v in ("tree", "banded-mf"):
            expected = []
            for e in (2.0, 4.0):
                setting = {"privacy.target_epsilon": e, "variant": v}
                mine = {r.seed: r.result[MEAN] for r in runs if r.setting == setting}
                ref = {
                    r.seed: r.result[MEAN]
                    for r in runs
                    if r.setting == {"privacy.target_epsilon": e, "variant": "independent"}
                }
                expected.append(100 * np.mean([mine[k] - ref[k] for k in sorted(mine)]))
            matches.append(np.allclose(ys, expected, rtol=1e-9))
        assert sum(matches) == 1, ys
    # the sign counts: tree is below the reference in 3 of 3 seeds, banded-mf above in 3 of 3
    assert sorted(t.get_text() for t in paired.texts) == ["3/3"] * 4
    plt.close(fig)


def test_the_reference_can_be_named_and_its_line_is_the_zero():
    runs = _mechanism_runs(epsilons=(4.0,))
    fig = privacy_utility_figure(runs, line="variant", title="nm", last=3, reference='variant="tree"')
    paired = fig.axes[1]
    names = [t.get_text().replace("\n", " ") for t in paired.get_legend().get_texts()]
    assert names[0].startswith("reference: variant = tree")
    # one epsilon (4, calibrated a hair apart): plotted against the mechanism, each with its own x
    assert fig.axes[-1].get_xlabel() == "setting"
    ys = sorted(float(c.lines[0].get_ydata()[0]) for c in paired.containers)
    assert ys[0] > 0 and ys[1] > 0  # independent and banded-mf are both above tree
    plt.close(fig)


def test_a_baseline_under_every_grid_value_is_one_dashed_line_and_the_legend_has_no_duplicates():
    runs = _mechanism_runs(baseline=True)
    fig = privacy_utility_figure(runs, line="variant", title="nm", last=3)
    top = fig.axes[0]
    dashed = [line for line in top.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1
    assert np.allclose(dashed[0].get_ydata(), 100 * (0.7 + np.mean(list(DATA_EFFECT.values()))))
    names = [t.get_text().replace("\n", " ") for t in top.get_legend().get_texts()]
    assert len(names) == len(set(names)) == 4  # three mechanisms and the baseline
    assert "the same result at target_epsilon = 2.0, 4.0" in names[-1]
    assert len(top.patches) == 1  # its band, once
    # in the paired panel the baseline is drawn against the reference at each epsilon
    paired = fig.axes[1]
    assert any("without noise" in t.get_text().replace("\n", " ") for t in paired.get_legend().get_texts())
    plt.close(fig)

    # two baselines with different results: two dashed lines, each named by what tells them apart
    other = [
        _run(
            {"privacy.target_epsilon": 2.0, "variant": "non-private"},
            s,
            0,
            0.6 + DATA_EFFECT[s],
            private=False,
        )
        for s in range(3)
    ]
    runs = [r for r in runs if r.setting != {"privacy.target_epsilon": 2.0, "variant": "non-private"}] + other
    fig = privacy_utility_figure(runs, line="variant", title="nm", last=3)
    dashed = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 2
    names = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_legend().get_texts()]
    assert len(names) == len(set(names)) == 5
    plt.close(fig)


def test_a_sweep_of_baselines_only_draws_bars_not_bands_and_its_legend_promises_only_what_is_drawn():
    runs = [
        _run({"client.lr": lr, "privacy.clip": c}, s, 0, 0.6 + lr + 0.01 * c + DATA_EFFECT[s], private=False)
        for lr in (0.05, 0.1, 0.2)
        for c in (0.5, 1.0)
        for s in range(3)
    ]
    fig = privacy_utility_figure(runs, line=None, title="lr-clip", last=3)
    top = fig.axes[0]
    assert not top.patches  # no band, let alone six merging into a block
    (bars,) = top.containers
    assert len(bars.lines[0].get_xdata()) == 6 and bars.has_yerr
    legend = top.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["non-private (noise_multiplier = 0)"]
    assert legend.legend_handles[0] is not None and not any(
        line.get_linestyle() == "--" for line in top.get_lines()
    )
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "band" not in notes and "bars: 95% Student t interval over seeds" in notes
    assert "epsilon is infinite for every run" in fig.axes[-1].get_xlabel()
    plt.close(fig)


def test_the_tables_pair_each_mechanism_with_the_reference_at_the_same_epsilon_as_the_figure_does(tmp_path):
    """With a line key the reference has (``variant``), a setting at epsilon 4 is compared with the reference
    mechanism at epsilon 4, never at epsilon 2: sweep_summary.csv, sweep_paired.csv and the figure's panel follow
    one rule (fedsim.report.sweep_table.paired_to_reference)."""
    from fedsim.report.sweep_table import (
        paired_to_reference,
        reference_setting,
        write_paired_csv,
        write_summary_csv,
    )

    runs = _mechanism_runs(epsilons=(2.0, 4.0))
    ref = reference_setting(runs, None)
    pairs = paired_to_reference(runs, ref, "variant")
    assert pairs and all(
        d.reference["privacy.target_epsilon"] == d.setting["privacy.target_epsilon"]
        and d.reference["variant"] == ref["variant"]
        for d in pairs
    )
    # by hand: each setting's per-seed means minus those of the reference variant at the same epsilon
    by = {(r.setting["variant"], r.setting["privacy.target_epsilon"], r.seed): r.result[MEAN] for r in runs}
    for d in pairs:
        eps, v = d.setting["privacy.target_epsilon"], d.setting["variant"]
        want = [by[(v, eps, s)] - by[(ref["variant"], eps, s)] for s in d.seeds]
        assert np.allclose(d.differences, want)
    summary = _csv(write_summary_csv(runs, tmp_path / "s.csv", last=3, line="variant"))
    marked = [row for row in summary if row["reference"] == "true"]
    assert {row["variant"] for row in marked} == {ref["variant"]} and len(marked) == 2  # one per epsilon
    paired = _csv(write_paired_csv(runs, tmp_path / "p.csv", last=3, line="variant"))
    assert all(f"target_epsilon={row['privacy.target_epsilon']}" in row["reference"] for row in paired)
    fig = privacy_utility_figure(runs, line="variant", title="nm", last=3)
    ys = sorted(float(y) for c in fig.axes[1].containers for y in c.lines[0].get_ydata())
    assert np.allclose(ys, sorted(100 * d.mean for d in pairs))  # in points
    plt.close(fig)
