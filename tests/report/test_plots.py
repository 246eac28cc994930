"""``plots/*.png`` of a run directory (``fedsim.report.plots``): every plot is drawn from small real runs (private
with the membership attack, not private, agnostic FL), round axes have integer ticks, legends sit outside the data,
titles name a sweep's run in full and fit, point labels do not overlap, non-private quantities say so, and a run
that is not private gets a panel saying its epsilon is infinite instead of an empty log-scale plot."""

from __future__ import annotations

import copy
import itertools
import json
import shutil

import numpy as np
import pytest

from fedsim.cli import main
from fedsim.report import plots
from fedsim.report.rundir import RunWriter

TINY = ["--set", "rounds=3", "--set", "engine.name=local", "--set", "engine.eval_every=1"]
SWEEP_NAME = "noise_multiplier=0.5,sampling=poisson,clients_per_round=40,server.optimizer=adam,client.lr=0.05"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny real run (private, with the membership attack; its own plots are not drawn: the tests draw them),
    and from its files: the same run as a sweep's ``<setting>/seed<k>``, as a run that is not private (rows and
    summary as ``fedsim.loop`` writes them at noise_multiplier 0) and as an agnostic FL run (its per-round
    lambda, noised domain losses and held-out domain losses)."""
    base = tmp_path_factory.mktemp("plots")
    private = base / "private"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunWriter, "write_plots", lambda self: [])
        argv = ["quickstart", "--set", "data.num_clients=40", "--set", "report.membership_attack=true", *TINY]
        assert main(["run", *argv, "--no-progress", "--out", str(private)]) == 0
    rows = [json.loads(line) for line in (private / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((private / "summary.json").read_text())
    out = {"private": private}
    for name, change, path in (
        ("sweep", lambda row: row, base / "sweep" / SWEEP_NAME / "seed0"),
        ("not_private", _not_private, base / "not_private"),
        ("agnostic", _agnostic, base / "agnostic"),
    ):
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text(
            "".join(json.dumps(change(copy.deepcopy(r))) + "\n" for r in rows)
        )
        (path / "summary.json").write_text(
            json.dumps(summary | ({"private": False} if name == "not_private" else {}))
        )
        if name != "not_private":
            shutil.copy(private / "ledger.json", path / "ledger.json")
        out[name] = path
    return out


def _not_private(row):
    row |= {"private": False, "noise_std_sum": 0.0, "epsilon": None, "epsilon_reason": "infinite"}
    row |= {"paper_epsilon_igmm": None, "paper_epsilon_igmm-corrected": None}
    row["generalization"] = {
        "status": "no-statement",
        "a": None,
        "b": None,
        "eps_used": None,
        "epsilon": None,
    }
    row["non_private"].pop("attack", None)
    return row


def _agnostic(row):
    t = row["round"]
    row |= {
        "lambda_used": [0.7 - 0.01 * t, 0.2, 0.1 + 0.01 * t],
        "domain_loss_noised": [0.8, 0.9 - 0.05 * t, 1.05],
        "domains_heldout": [
            {"loss": 1.7 - 0.1 * t + d / 10, "accuracy": 0.5, "clients": c} for d, c in enumerate((7, 2, 1))
        ],
    }
    row["non_private"]["domains_train"] = [{"loss": 1.6, "accuracy": 0.5, "clients": c} for c in (28, 8, 4)]
    return row


def _run(runs, name):
    return plots.read_run(runs[name])


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig):
    out = []
    for ax in fig.axes:
        out.append(ax.get_title())
        legend = ax.get_legend()
        out.extend(t.get_text().replace("\n", " ") for t in (legend.get_texts() if legend else []))
        out.extend(t.get_text().replace("\n", " ") for t in ax.texts)
    return out


FIGURES = {
    "epsilon": lambda run: plots.figure_epsilon(run, from_ledger=False),
    "accuracy": plots.figure_accuracy,
    "loss": plots.figure_loss,
    "accuracy_vs_epsilon": plots.figure_accuracy_vs_epsilon,
    "generalization": plots.figure_generalization,
    "attack": plots.figure_attack,
}


def test_every_plot_is_written_and_the_optional_ones_only_where_they_apply(runs):
    expected = ["epsilon", "accuracy", "loss", "accuracy_vs_epsilon", "generalization"]
    for name, extra in (("private", ["attack"]), ("agnostic", ["attack", "agnostic"])):
        written = plots.run_plots(runs[name], from_ledger=name == "private")
        assert [p.name for p in written] == [f"{x}.png" for x in expected + extra], name
        for p in written:
            assert p.parent == runs[name] / "plots" and p.stat().st_size > 10_000, p


@pytest.mark.parametrize("kind", sorted(FIGURES))
def test_round_axes_have_integer_ticks_and_legends_cover_no_data(runs, kind):
    fig = FIGURES[kind](_run(runs, "private"))
    renderer = _drawn(fig)
    page = fig.bbox
    rounds = [ax for ax in fig.axes if ax.get_xlabel() == "round"]
    assert rounds or kind == "accuracy_vs_epsilon", kind  # its x axis is epsilon
    for ax in rounds:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), (kind, ticks)
        assert lo < 1 and hi > 3  # every round of the run is in view
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer)), (kind, "legend over the axes")
        assert page.x0 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 <= box.y0 and box.y1 <= page.y1 + 1, (
            kind
        )
    plots.pyplot().close(fig)


def test_the_attack_plot_colours_rounds_with_integer_ticks_and_says_it_is_non_private(runs):
    fig = plots.figure_attack(_run(runs, "private"))
    _drawn(fig)
    bar = fig.axes[1].child_axes[0]  # the colorbar, beside the scatter of rounds
    assert bar.get_ylabel() == "round"
    lo, hi = bar.get_ylim()
    assert all(float(t).is_integer() for t in bar.get_yticks() if lo <= t <= hi)
    texts = _texts(fig)
    assert any(t.startswith("attack accuracy, best threshold") and "non-private" in t for t in texts), texts
    assert any("attack AUC" in t and "non-private" in t for t in texts), texts
    assert fig.axes[1].get_xlabel().startswith("generalization gap in loss")
    plots.pyplot().close(fig)


@pytest.mark.parametrize("kind", ["accuracy", "loss"])
def test_accuracy_and_loss_curves_label_the_training_clients_and_the_gap_non_private(runs, kind):
    fig = FIGURES[kind](_run(runs, "private"))
    texts = _texts(fig)
    train = [t for t in texts if t.startswith("training clients")]
    gap = [t for t in texts if t.startswith("gap = ")]
    assert train and "non-private" in train[0], texts
    assert gap and "non-private" in gap[0], texts
    assert "held-out clients (never trained on)" in texts
    assert "non-private" in fig.axes[0].get_title()
    top = fig.axes[0]
    assert len(top.get_lines()) == 2 and all(len(line.get_xdata()) == 3 for line in top.get_lines())
    if kind == "loss":  # rows hold heldout_loss at the top level and non_private.train_loss
        rows = _run(runs, "private")["rows"]
        held = next(line for line in top.get_lines() if "held-out" in line.get_label())
        assert np.allclose(held.get_ydata(), [r["heldout_loss"] for r in rows])
    plots.pyplot().close(fig)


def test_a_sweep_runs_title_names_its_setting_in_full_and_fits(runs):
    run = _run(runs, "sweep")
    assert run["name"] == f"{SWEEP_NAME}/seed0"
    for kind, make in FIGURES.items():
        fig = make(run)
        renderer = _drawn(fig)
        title = fig.axes[0].title
        assert f"run: {SWEEP_NAME}/seed0" in title.get_text().replace("\n", ""), kind  # wrapped, never cut
        box, page = title.get_window_extent(renderer), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (kind, box, page)
        plots.pyplot().close(fig)


def test_a_long_name_wraps_at_its_commas_and_keeps_every_character():
    name = "a=1,bb=2,ccc=3," * 8 + "x" * 150 + "/seed0"
    lines = plots._wrap_name(name, 40)
    assert "".join(lines) == name and all(len(line) <= 40 for line in lines)
    assert lines[0].endswith(",")


def test_a_title_of_words_wraps_between_words():
    """What a plot shows is words: a line ends at a space, never inside a word ("per rou" / "nd" was drawn)."""
    what = "agnostic FL: mixture weights lambda and noised domain losses per round, held-out loss per domain"
    lines = plots._wrap_name(what, 40)
    assert "".join(lines) == what and all(len(line) <= 40 for line in lines)
    assert all(line.endswith((" ", ",")) for line in lines[:-1]), lines


def test_a_non_private_run_says_its_epsilon_is_infinite_instead_of_an_empty_log_plot(runs):
    run = _run(runs, "not_private")
    assert run["summary"]["private"] is False and plots.not_private_reason(run) == "noise_multiplier = 0"
    assert plots.plot_epsilon(run, runs["not_private"] / "plots" / "epsilon.png").stat().st_size > 10_000
    fig = plots.figure_epsilon(run)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and list(ax.get_yticks()) == []
    assert not any(len(line.get_xdata()) for line in ax.get_lines())
    said = " ".join(t.get_text().replace("\n", " ") for t in ax.texts)
    assert "not private (noise_multiplier = 0): epsilon is infinite at every round" in said
    assert all(float(t).is_integer() for t in ax.get_xticks() if 0.5 <= t <= 3.5)
    plots.pyplot().close(fig)

    fig = plots.figure_accuracy_vs_epsilon(run)  # no point at infinity, and it says so
    ax = fig.axes[0]
    assert not any(len(line.get_xdata()) for line in ax.get_lines()) and not ax.collections
    said = " ".join(t.get_text().replace("\n", " ") for t in ax.texts)
    assert "epsilon is infinite at every round" in said and "never drawn at an infinite epsilon" in said
    plots.pyplot().close(fig)

    fig = plots.figure_accuracy(run)  # the non-private labels stay, and the title says the run is not private
    texts = _texts(fig)
    assert any(t.startswith("training clients") and "non-private" in t for t in texts)
    assert "not private (noise_multiplier = 0)" in fig.axes[0].get_title()
    plots.pyplot().close(fig)
    fig = plots.figure_generalization(run)
    assert any("Theorem 1 gives no statement" in t for t in _texts(fig))
    plots.pyplot().close(fig)


def test_a_partly_infinite_epsilon_draws_the_finite_points_and_counts_the_others():
    rows = [
        {"round": t, "epsilon": None if t > 3 else float(t), "epsilon_reason": "infinite" if t > 3 else None}
        | {"delta": 1e-5, "accountant": "pld", "heldout_accuracy": 0.1 * t, "private": True}
        for t in range(1, 6)
    ]
    fig = plots.figure_accuracy_vs_epsilon({"name": "run", "rows": rows})
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_xdata()) == [1.0, 2.0, 3.0]
    assert any("2 evaluated round(s) with an infinite epsilon: not drawn" in t for t in _texts(fig))
    plots.pyplot().close(fig)


def test_point_labels_never_overlap():
    # 60 rounds whose epsilon and accuracy barely move: most labels would collide, so only some are drawn
    rows = [
        {"round": t, "epsilon": 2 + 0.01 * t, "delta": 1e-5, "accountant": "pld", "heldout_accuracy": 0.5}
        | {"private": True}
        for t in range(1, 61)
    ]
    fig = plots.figure_accuracy_vs_epsilon({"name": "run", "rows": rows})
    renderer = _drawn(fig)
    ax = fig.axes[0]
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert 2 <= len(boxes) < 60 and {"1", "60"} <= {t.get_text() for t in ax.texts}
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    plots.pyplot().close(fig)


def test_the_agnostic_plot_draws_lambda_and_the_noised_losses_per_domain(runs):
    run = _run(runs, "agnostic")
    assert plots.has_agnostic(run) and not plots.has_agnostic(_run(runs, "private"))
    fig = plots.figure_agnostic(run)
    _drawn(fig)
    lam, noised, held = fig.axes[:3]
    assert lam.get_lines()[0].get_label() == "domain 0 (35 clients)"
    assert len(lam.get_lines()) == 3 and all(len(line.get_xdata()) == 3 for line in lam.get_lines())
    assert (
        "clipped to [0, 1]" in noised.get_ylabel()
        and "covered by epsilon" in noised.get_legend().get_title().get_text()
    )
    assert held.get_xlabel() == "round"
    for ax in (lam, noised, held):
        lo, hi = ax.get_xlim()
        assert all(float(t).is_integer() for t in ax.get_xticks() if lo <= t <= hi)
    plots.pyplot().close(fig)


def test_overlays_say_which_run_has_no_epsilon_curve(runs, tmp_path):
    written = plots.overlay([runs["private"], runs["not_private"]], tmp_path)
    assert [p.name for p in written] == ["overlay_accuracy.png", "overlay_epsilon.png"]
    assert all(p.stat().st_size > 10_000 for p in written)


def test_an_overlaid_run_without_noise_is_labelled_not_private_and_a_private_one_with_its_epsilon(runs):
    """``fedsim report A B``'s overlays: every run's legend entry says its certified epsilon (and its delta,
    accountant, mechanism and sampling where its config.toml says them) or that it is not private."""
    read = [_run(runs, "private"), _run(runs, "not_private")]
    eps = read[0]["rows"][-1]["epsilon"]
    for key in ("heldout_accuracy", "epsilon"):
        fig = plots.figure_overlay(read, key, ["a", "b"])
        labels = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_legend().get_texts()]
        assert len(labels) == 2, labels
        assert labels[0].startswith(f"a: epsilon {eps:.3g} after round 3 (delta 1e-05, pld)"), labels
        assert "independent noise, poisson sampling" in labels[0] and "not private" not in labels[0]
        assert labels[1].startswith("b: not private (noise_multiplier = 0)"), labels
        assert "epsilon" not in labels[1].split(",")[0].removeprefix("b: not private")
        plots.pyplot().close(fig)


# --- issue 34, figures: readable log axes, undefined bounds, language models, overlay labels ------------------------
def _rows(epsilons, **extra):
    return [
        {"round": t, "epsilon": e, "delta": 1e-5, "accountant": "pld", "private": True}
        | {"paper_epsilon_igmm": None, "paper_epsilon_igmm-corrected": None}
        | {k: v[t - 1] for k, v in extra.items()}
        for t, e in enumerate(epsilons, 1)
    ]


def _labelled_ticks(ax, which="y"):
    """The tick labels drawn inside the axis' limits (major ticks with text)."""
    fig = ax.figure
    fig.canvas.draw()
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    return [
        t.get_text()
        for t in axis.get_ticklabels()
        if t.get_text() and lo <= t.get_position()[which == "y"] <= hi
    ]


def test_an_epsilon_under_a_decade_gets_enough_labelled_ticks_and_a_small_span_a_linear_axis():
    # banded-mf's epsilon over 0.35-2 (a factor 5.7): a log axis labelled at 0.4, 0.5, 0.6, 0.8, 1, 1.5, 2
    run = {"name": "bmf", "rows": _rows(np.geomspace(0.35, 2.0, 20))}
    fig = plots.figure_epsilon(run, from_ledger=False)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and "(log scale)" in ax.get_ylabel()
    labels = _labelled_ticks(ax)
    assert len(labels) >= 5 and {"0.5", "1", "2"} <= set(labels), labels
    plots.pyplot().close(fig)
    # over 2-4 (a factor 2), a linear axis with evenly spaced labels, and the label does not claim a log scale
    run = {"name": "small", "rows": _rows(np.linspace(2.0, 4.0, 20))}
    fig = plots.figure_epsilon(run, from_ledger=False)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and "log" not in ax.get_ylabel()
    assert len(_labelled_ticks(ax)) >= 4
    plots.pyplot().close(fig)


def test_bounds_undefined_at_every_round_are_not_in_the_legend_and_the_title_says_why():
    run = {"name": "bmf", "rows": _rows(np.linspace(0.4, 2.0, 10))}
    fig = plots.figure_epsilon(run, from_ledger=False)
    ax = fig.axes[0]
    legend = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    assert legend == ["pld (certified, dp-accounting)"], legend
    assert len([line for line in ax.get_lines() if len(line.get_xdata())]) == 1
    title = ax.get_title().replace("\n", " ")
    assert "IGMM corrected and IGMM Theorem 7 as printed: undefined at every round of this run" in title
    plots.pyplot().close(fig)
    # defined at some rounds: drawn, and the legend counts the others
    rows = _rows(np.linspace(0.4, 2.0, 10))
    for row in rows[5:]:
        row["paper_epsilon_igmm-corrected"] = 3.0 * row["epsilon"]
    fig = plots.figure_epsilon({"name": "part", "rows": rows}, from_ledger=False)
    legend = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("IGMM corrected") and "undefined at 5 of 10 rounds" in t for t in legend), legend
    assert "IGMM Theorem 7 as printed" in fig.axes[0].get_title().replace("\n", " ")
    plots.pyplot().close(fig)


@pytest.fixture(scope="module")
def language_model(runs, tmp_path_factory):
    """The private run as a language model's: token targets (``data.json``'s target_shape) and perplexities."""
    path = tmp_path_factory.mktemp("lm") / "lm"
    shutil.copytree(runs["private"], path)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        row["heldout_perplexity"] = 40.0 - 5 * i
        row["non_private"]["train_perplexity"] = 38.0 - 6 * i
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = json.loads((path / "data.json").read_text())
    (path / "data.json").write_text(json.dumps(data | {"target_shape": [6]}))
    return path


def test_a_language_models_accuracy_is_token_accuracy_and_its_perplexity_has_a_figure(runs, language_model):
    run = plots.read_run(language_model)
    assert plots.is_sequence_task(run) and not plots.is_sequence_task(_run(runs, "private"))
    fig = plots.figure_accuracy(run)
    assert fig.axes[0].get_ylabel() == "client-level token accuracy (%)"
    assert "token accuracy" in fig.axes[0].get_title()
    plots.pyplot().close(fig)
    assert "token accuracy" in plots.figure_accuracy_vs_epsilon(run).axes[0].get_ylabel()
    plots.pyplot().close("all")
    assert plots.figure_accuracy(_run(runs, "private")).axes[0].get_ylabel() == "client-level accuracy (%)"
    plots.pyplot().close("all")

    fig = plots.figure_perplexity(run)
    ax = fig.axes[0]
    by_label = {line.get_label(): line for line in ax.get_lines()}
    held = by_label["held-out clients (never trained on)"]
    assert list(held.get_ydata()) == [r["heldout_perplexity"] for r in run["rows"]]
    train = next(line for label, line in by_label.items() if label.startswith("training clients"))
    assert "non-private" in train.get_label() and ax.get_xlabel() == "round"
    plots.pyplot().close(fig)
    written = [p.name for p in plots.run_plots(language_model, from_ledger=False)]
    assert "perplexity.png" in written and "perplexity.png" not in [
        p.name for p in plots.run_plots(runs["not_private"], from_ledger=False)
    ]


def test_overlay_labels_give_epsilon_and_mechanism_and_say_when_curves_coincide(
    runs, language_model, tmp_path
):
    read = [_run(runs, "private"), plots.read_run(language_model), _run(runs, "not_private")]
    eps = read[0]["rows"][-1]["epsilon"]
    fig = plots.figure_overlay(read, "epsilon", ["a", "lm", "b"])
    ax = fig.axes[0]
    labels = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    assert labels[0].startswith(f"a: epsilon {eps:.3g}") and "independent noise" in labels[0]
    # the language model's run has the same epsilon curve: dashed over it, the label says so
    assert "(the same curve as a)" in labels[1]
    a, lm = ax.get_lines()[:2]
    assert lm.get_linestyle() == "--" and a.get_linewidth() > lm.get_linewidth()
    # the run without noise draws nothing, and its legend entry has no mark
    assert labels[2].startswith("b: not private") and "not drawn" in labels[2]
    assert ax.get_legend().legend_handles[2].get_linestyle() in ("None", "none", "")
    plots.pyplot().close(fig)
    fig = plots.figure_overlay(read, "heldout_accuracy", ["a", "lm", "b"])
    labels = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_legend().get_texts()]
    assert "(token accuracy)" in labels[1] and "token accuracy" not in labels[0]
    assert "token accuracy" in fig.axes[0].get_ylabel()
    plots.pyplot().close(fig)
