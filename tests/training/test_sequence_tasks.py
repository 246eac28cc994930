"""Sequence tasks (issue 23): targets ``[n, *T]`` with matching outputs ``[n, *T, classes]``, per-token
cross-entropy averaged per example with PyTorch's ignore index, token accuracy and perplexity in evaluation, a
user metric, and clear errors (exit 2, naming the shapes) when the model, the vocabulary or the loss does not fit
the data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from token_models import VOCAB, token_sequences

from fedsim.data import build_federated_data
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.factories import IGNORE_INDEX, cross_entropy
from fedsim.report.rows import client_means
from fedsim.scenarios import load_scenario
from fedsim.training.evaluation import COL
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, check_fits, initial_weights

SEQUENCES = [
    "rounds=2",
    "engine.name=local",
    "data.dataset=token_models:token_sequences",
    "data.num_clients=20",
    "data.heldout_fraction=0.2",
    "model.name=none",
    "model.hidden=none",
    "model.factory=token_models:token_tagger",
]


def _scenario(*extra: str):
    return load_scenario("quickstart", [*SEQUENCES, *extra])


@pytest.fixture(scope="module")
def data():
    return build_experiment(_scenario()).data


def test_cross_entropy_is_each_examples_mean_over_its_scored_tokens():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen)
    y = torch.randint(0, 7, (3, 5), generator=gen)
    y[1, 2:] = IGNORE_INDEX
    y[2, :] = IGNORE_INDEX  # nothing scored: loss 0, not NaN
    got = cross_entropy(logits, y)
    tok = F.cross_entropy(logits.transpose(1, 2), y.clamp(min=0), reduction="none")
    assert got.shape == (3,)
    torch.testing.assert_close(got[0], tok[0].mean())
    torch.testing.assert_close(got[1], tok[1, :2].mean())
    assert got[2] == 0.0
    # labels [n] with logits [n, classes]: exactly F.cross_entropy, as before
    torch.testing.assert_close(
        cross_entropy(logits[:, 0], y[:, 0]), F.cross_entropy(logits[:, 0], y[:, 0], reduction="none")
    )


def test_sequence_targets_keep_their_shape_and_padding(data):
    assert data.target_shape == (6,)
    x, y = data.client_data(int(data.train_clients[0]))
    assert x.dtype == np.int64 and y.dtype == np.int64 and y.shape == x.shape
    assert (y == IGNORE_INDEX).any() or any(
        (data.client_data(int(c))[1] == IGNORE_INDEX).any() for c in data.train_clients
    )
    assert data.describe()["target_shape"] == [6]
    # a partitioner that splits by label has no label to split by: refused, naming the shapes
    raw = token_sequences(4, 0)
    with pytest.raises(ValueError, match=r"partitioner.*'iid'.*targets have shape \[\d+, 6\]"):
        build_federated_data(lambda: (raw["x"], raw["y"]), num_clients=4, partitioner="dirichlet")
    iid = build_federated_data(lambda: (raw["x"], raw["y"]), num_clients=4, partitioner="iid")
    assert iid.target_shape == (6,)


def test_every_training_path_gives_the_loops_updates_on_sequence_targets(data):
    w = None
    cids = [int(c) for c in data.train_clients[:10]]  # ragged, with padded tokens and padded batches
    plan = ClientPlan(1, cids, 0.5)
    results = {}
    for path in ("per-layer", "vmap", "loop"):
        settings = TrainSettings(model="token_models:token_tagger", model_kwargs={}, lr=0.5, vectorize=path)
        w = initial_weights(settings, data.input_shape, data.num_classes) if w is None else w
        trainer = ClientTrainer(data, settings, device="cpu")
        assert trainer.path.name == path
        results[path] = trainer.train(plan, w)
    for path in ("per-layer", "vmap"):
        np.testing.assert_allclose(results[path][0].total, results["loop"][0].total, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            [m["update_norm"] for m in results[path][1]],
            [m["update_norm"] for m in results["loop"][1]],
            rtol=1e-4,
        )


def test_evaluation_reports_token_accuracy_and_perplexity(data):
    settings = TrainSettings(
        model="token_models:token_tagger", model_kwargs={}, metric="token_models:exact_match"
    )
    trainer = ClientTrainer(data, settings, device="cpu")
    w = initial_weights(settings, data.input_shape, data.num_classes)
    cids = [int(c) for c in data.heldout_clients]
    rows = trainer.evaluate(cids, w)
    trainer._load(trainer._global(w))
    trainer.model.eval()
    nlls, accs, losses, metric = [], [], [], []
    for cid in cids:  # by hand, token by token
        x, y = (torch.as_tensor(a) for a in data.client_data(cid))
        with torch.no_grad():
            out = trainer.model(x)
        keep = y != IGNORE_INDEX
        tok = F.cross_entropy(out[keep], y[keep], reduction="none")
        nlls.append(float(tok.mean()))
        accs.append(float((out.argmax(-1)[keep] == y[keep]).float().mean()))
        losses.append(float(cross_entropy(out, y).mean()))
        metric.append(float(((out.argmax(-1) == y) | ~keep).all(1).float().mean()))
    assert rows[:, COL["scored"]].sum() == sum(
        int((data.client_data(c)[1] != IGNORE_INDEX).sum()) for c in cids
    )
    means = client_means(rows)
    assert means["accuracy"] == pytest.approx(np.mean(accs), rel=1e-5)
    assert means["loss"] == pytest.approx(np.mean(losses), rel=1e-5)
    assert means["perplexity"] == pytest.approx(math.exp(np.mean(nlls)), rel=1e-5)
    assert means["metric"] == pytest.approx(np.mean(metric), rel=1e-5)
    # a classification task reports no perplexity
    assert "perplexity" not in client_means(np.array([[0, 4, 2.0, 3, 4, math.nan, math.nan]]))


def test_a_run_reports_perplexity_and_the_users_metric(tmp_path):
    result = run_scenario(
        _scenario("model.metric=token_models:exact_match", "privacy.noise_multiplier=0"), tmp_path / "run"
    )
    last = result.rows[-1]
    assert last["heldout_perplexity"] > 1.0 and 0.0 <= last["heldout_metric"] <= 1.0
    assert 0.0 <= last["heldout_accuracy"] <= 1.0
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["heldout_perplexity"] == pytest.approx(last["heldout_perplexity"])
    assert json.loads((result.run_dir / "data.json").read_text())["target_shape"] == [6]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["model.factory=token_models:last_token_only"],
            r"the model outputs \[\d+, 30\] for targets \[\d+, 6\]; allowed logits \[\d+, 6, classes\]",
        ),
        (
            ["model.classes=10"],
            r"the model outputs 10 classes \(outputs \[\d+, 6, 10\]\) but the data has 30",
        ),
        (
            ["model.vocab=12"],
            r"the input ids range over \[0, 29\]; the model's nn.Embedding layers hold 'embed': 12 rows.*at least 30",
        ),
        (
            ["model.loss=token_models:sum_over_tokens"],
            r"the loss returned \[\d+, 6\] for outputs \[\d+, 6, 30\] and targets \[\d+, 6\]",
        ),
    ],
)
def test_what_does_not_fit_is_refused_naming_the_shapes(data, extra, message):
    scenario = _scenario(*extra)
    with pytest.raises(ValueError, match=message):
        check_fits(TrainSettings.from_scenario(scenario), data)


def test_the_cli_exits_2_without_a_traceback(tmp_path, capsys):
    from fedsim.cli import main

    sets = [a for item in [*SEQUENCES, f"model.vocab={VOCAB - 18}"] for a in ("--set", item)]
    out = tmp_path / "run"
    assert main(["run", "quickstart", "--no-progress", "--out", str(out), *sets]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error:") and "Traceback" not in err
    assert "the model's nn.Embedding layers hold 'embed': 12 rows" in err, err
    assert not out.exists()
