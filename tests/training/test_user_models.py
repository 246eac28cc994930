"""A user's own models (tests/user_models.py) train on the path their layer types allow, and every vectorised
path trains each client exactly as the per-client loop does: momentum, several epochs, ragged clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.data import build_federated_data
from fedsim.factories import cross_entropy
from fedsim.models import build_model
from fedsim.training.layers import RULES, StackedModel, Unsupported, plan
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights
from fedsim.training.vectorized import choose_path, train_vectorized


@pytest.fixture(scope="module")
def digits():
    # Dirichlet label skew: client sizes from 3 to 60 examples, so batches and step counts are ragged
    return build_federated_data("digits", num_clients=30, partitioner="dirichlet", alpha=0.3, seed=4)


def _settings(factory, vectorize, loss="cross_entropy", **options):
    return TrainSettings(
        model=factory,
        model_kwargs=options,
        local_epochs=2,
        batch_size=8,
        lr=0.05,
        optimizer="momentum",
        momentum=0.9,
        seed=3,
        vectorize=vectorize,
        loss=loss,
    )


CASES = [
    # (factory, options, the path auto picks)
    ("user_models:mlp", {}, "per-layer"),
    ("user_models:cnn", {}, "per-layer"),
    ("user_models:cnn", {"dropout": 0.3}, "per-layer"),
    ("user_models:custom", {}, "vmap"),
    ("user_models:centered", {}, "loop"),  # mixes a batch's examples: neither vectorised path is exact
    ("user_models:data_dependent", {}, "loop"),
    ("fedsim.models.registry:cnn2d", {}, "per-layer"),
    ("fedsim.models.registry:cnn1d", {}, "per-layer"),
]


@pytest.mark.parametrize(("factory", "options", "expected"), CASES)
def test_auto_picks_the_fastest_path_the_layers_allow(digits, factory, options, expected):
    trainer = ClientTrainer(digits, _settings(factory, "auto", **options), device="cpu")
    assert trainer.path.name == expected, trainer.path.fallbacks
    if expected == "vmap":
        assert trainer.path.fallbacks and trainer.path.fallbacks[0].startswith("per-layer:")
    if expected == "loop":
        assert [f.split(":")[0] for f in trainer.path.fallbacks] == ["per-layer", "vmap"]


def test_fallback_reasons_name_the_layer_or_the_failed_check(digits):
    custom = ClientTrainer(digits, _settings("user_models:custom", "auto"), device="cpu").path
    assert "Scale at '2' holds parameters (gain)" in custom.fallbacks[0]
    centered = ClientTrainer(digits, _settings("user_models:centered", "auto"), device="cpu").path
    assert len(centered.fallbacks) == 2  # per-layer: it would mix clients; vmap: a padded batch's padding
    assert all("does forward mix the examples of a batch?" in f for f in centered.fallbacks), (
        centered.fallbacks
    )


@pytest.mark.parametrize(
    ("factory", "options", "path"),
    [
        ("user_models:mlp", {}, "per-layer"),
        ("user_models:mlp", {}, "vmap"),
        ("user_models:cnn", {}, "per-layer"),
        ("user_models:cnn", {}, "vmap"),
        ("user_models:cnn", {"dropout": 0.3}, "per-layer"),  # the same per-client dropout masks as the loop
        ("user_models:custom", {}, "vmap"),
        ("fedsim.models.registry:cnn1d", {}, "per-layer"),
    ],
)
def test_vectorised_paths_train_each_client_as_the_loop_does(digits, factory, options, path):
    cids = [int(c) for c in digits.train_clients[:12]]
    sizes = digits.num_examples_array(cids)
    assert len(set((sizes + 7) // 8)) > 2  # ragged: clients take different numbers of steps
    fast = ClientTrainer(digits, _settings(factory, path, **options), device="cpu")
    slow = ClientTrainer(digits, _settings(factory, "loop", **options), device="cpu")
    assert fast.path.name == path and slow.path.name == "loop"
    w = torch.as_tensor(
        initial_weights(fast.settings, digits.input_shape, digits.num_classes), dtype=torch.float32
    )
    got = list(train_vectorized(fast, 3, cids, w, chunk_size=5))  # chunks: clients sorted and split
    for cid, (update, m) in zip(cids, got, strict=True):
        ref, ref_m = slow.train_one(cid, 3, w)
        assert m["client"] == cid and m["trainer"] == path and ref_m["trainer"] == "loop"
        assert float(update.abs().max()) > 1e-3  # it trained
        torch.testing.assert_close(update, ref, rtol=1e-4, atol=2e-5)
        assert m["train_loss"] == pytest.approx(ref_m["train_loss"], rel=1e-4, abs=1e-6)


def test_the_partial_sum_is_the_same_whichever_path_trains(digits):
    cids = [int(c) for c in digits.train_clients[:10]]
    totals = {}
    for path in ("per-layer", "vmap", "loop"):
        t = ClientTrainer(digits, _settings("user_models:cnn", path), device="cpu")
        w = initial_weights(t.settings, digits.input_shape, digits.num_classes)
        partial, metrics = t.train(ClientPlan(2, cids, 0.5), w)
        assert {m["trainer"] for m in metrics} == {path}
        totals[path] = np.asarray(partial.total)
    np.testing.assert_allclose(totals["per-layer"], totals["loop"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(totals["vmap"], totals["loop"], rtol=1e-4, atol=1e-5)


def test_a_user_loss_is_used_by_every_path(digits):
    cids = [int(c) for c in digits.train_clients[:6]]
    out = {}
    for path in ("per-layer", "loop"):
        t = ClientTrainer(
            digits, _settings("user_models:mlp", path, loss="user_models:smooth_loss"), device="cpu"
        )
        w = torch.as_tensor(
            initial_weights(t.settings, digits.input_shape, digits.num_classes), dtype=torch.float32
        )
        out[path] = [
            u
            for u, _ in (
                train_vectorized(t, 1, cids, w) if path != "loop" else (t.train_one(c, 1, w) for c in cids)
            )
        ]
    plain = ClientTrainer(digits, _settings("user_models:mlp", "loop"), device="cpu")
    w = torch.as_tensor(
        initial_weights(plain.settings, digits.input_shape, digits.num_classes), dtype=torch.float32
    )
    for a, b, c in zip(out["per-layer"], out["loop"], cids, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
        assert float((plain.train_one(c, 1, w)[0] - b).abs().max()) > 1e-4  # label smoothing changed the step


def test_batchnorm_is_refused_with_the_reason_and_the_alternative(digits):
    with pytest.raises(ValueError, match=r"BatchNorm1d at '2'.*un-noised.*nn.GroupNorm"):
        ClientTrainer(digits, _settings("user_models:with_batchnorm", "auto"), device="cpu")


def test_asking_for_a_path_the_model_cannot_take_says_why(digits):
    with pytest.raises(ValueError, match=r"engine.vectorize='per-layer' cannot train this model: Scale"):
        ClientTrainer(digits, _settings("user_models:custom", "per-layer"), device="cpu")
    with pytest.raises(ValueError, match=r"engine.vectorize='vmap' cannot train this model"):
        ClientTrainer(digits, _settings("user_models:data_dependent", "vmap"), device="cpu")


def test_rules_are_found_by_layer_type_never_by_names_or_classes():
    """The same layers under any names and in any user class get the same rules; an unknown parameter-free
    layer and a subclass that overrides forward get none."""

    class Renamed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.zz_first = nn.Linear(4, 3)
            self.blocks = nn.ModuleDict({"q": nn.Sequential(nn.Tanh(), nn.Linear(3, 2))})

        def forward(self, x):
            return self.blocks["q"](self.zz_first(x))

    bound = plan(Renamed())
    assert [type(b.module) for b in bound] == [nn.Linear, nn.Linear]
    assert [sorted(b.names.values()) for b in bound] == [
        ["zz_first.bias", "zz_first.weight"],
        ["blocks.q.1.bias", "blocks.q.1.weight"],
    ]
    with pytest.raises(Unsupported, match="Softmax"):
        plan(nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1)))

    class MyReLU(nn.ReLU):
        def forward(self, x):
            return x.clamp_min(0.1)

    assert MyReLU not in RULES
    with pytest.raises(Unsupported, match="MyReLU"):
        plan(nn.Sequential(nn.Linear(4, 3), MyReLU()))
    tied = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    with pytest.raises(Unsupported, match="tied"):
        plan(tied)


@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=1, groups=2),
        nn.Conv2d(2, 4, (3, 2), padding="same", padding_mode="reflect"),
        nn.Conv1d(2, 4, 3, dilation=2, bias=False),
        nn.GroupNorm(2, 2),
        nn.LayerNorm([2, 5]),
        nn.Linear(5, 3, bias=False),
    ],
)
def test_each_rule_gives_each_client_its_own_output(layer):
    model = nn.Sequential(layer)
    shape = (2, 6, 5) if isinstance(layer, nn.Conv2d) else (2, 5)
    stacked = StackedModel(model)
    k, b = 3, 4
    params = {n: p.detach() + 0.1 * torch.randn(k, *p.shape) for n, p in model.named_parameters()}
    x = torch.randn(k, b, *shape)
    out = stacked.forward(params, x, None)
    from torch.func import functional_call

    for j in range(k):
        ref = functional_call(model, {n: v[j] for n, v in params.items()}, (x[j],))
        torch.testing.assert_close(out[j], ref, rtol=1e-5, atol=1e-6)


def test_a_model_whose_output_is_not_per_example_is_refused():
    model = nn.Sequential(nn.Linear(4, 2), nn.Flatten(0))  # flattens the batch away
    with pytest.raises(ValueError, match="per-layer"):
        choose_path(model, (4,), 2, cross_entropy, torch.device("cpu"), "per-layer")


def test_the_shipped_models_are_factories_of_the_same_contract():
    assert build_model("cnn2d", (1, 8, 8), 10)(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert build_model("mlp", (1, 8, 8), 10, hidden=[7])(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert build_model("user_models:cnn", (1, 6, 6), 3)(torch.randn(2, 1, 6, 6)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"model.width=3: the model factory 'user_models:cnn' takes dropout"):
        build_model("user_models:cnn", (1, 6, 6), 3, width=3)
    with pytest.raises(ValueError, match="cnn2d takes images"):
        build_model("cnn2d", (40,), 10)
    with pytest.raises(ValueError, match="cannot be imported"):
        build_model("no_such_module:f", (4,), 2)
