"""Token-id inputs (issue 23, first part): integer inputs stay integers from the user's data function to the model,
the training paths are checked on real examples (valid ids), and nn.Embedding has a per-layer rule, so a model that
starts with one is vectorised instead of dropping silently to the per-client loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.engine.runner import run_scenario
from fedsim.scenarios import load_scenario
from fedsim.training.layers import StackedModel
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights

TOKENS = [
    "rounds=2",
    "engine.name=local",
    "data.dataset=token_models:token_windows",
    "data.num_clients=24",
    "data.partitioner=iid",
    "data.heldout_fraction=0.2",
    "model.name=none",
    "model.hidden=none",
]


def _scenario(model: str, *extra: str):
    return load_scenario("quickstart", [*TOKENS, f"model.factory=token_models:{model}", *extra])


@pytest.fixture(scope="module")
def data():
    from fedsim.experiment import build_experiment

    return build_experiment(_scenario("bag_of_tokens")).data


def test_integer_inputs_stay_integers_and_embedding_models_take_the_per_layer_path(data):
    x, _ = data.client_data(int(data.train_clients[0]))
    assert x.dtype == np.int64  # not cast to float32 on the way
    for padding in (True, False):
        settings = TrainSettings(
            model="token_models:bag_of_tokens", model_kwargs={"padding": padding}, lr=0.5, vectorize="auto"
        )
        fast = ClientTrainer(data, settings, device="cpu")
        assert fast.path.name == "per-layer", fast.path.fallbacks
        slow = ClientTrainer(data, TrainSettings(**{**settings.__dict__, "vectorize": "loop"}), device="cpu")
        w = initial_weights(settings, data.input_shape, data.num_classes)
        cids = [int(c) for c in data.train_clients[:12]]  # ragged clients: padded batches
        plan = ClientPlan(1, cids, 0.5)
        (a, ma), (b, mb) = fast.train(plan, w), slow.train(plan, w)
        assert [m["trainer"] for m in ma] == ["per-layer"] * len(cids)
        np.testing.assert_allclose(a.total, b.total, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose([m["update_norm"] for m in ma], [m["update_norm"] for m in mb], rtol=1e-4)


def test_padding_rows_get_no_gradient_and_ids_outside_the_vocabulary_are_refused():
    torch.manual_seed(0)
    emb = nn.Embedding(5, 3, padding_idx=0)
    stacked = StackedModel(nn.Sequential(emb))
    k = 2
    params = {"0.weight": torch.randn(k, 5, 3, requires_grad=True)}
    x = torch.tensor([[[0, 1, 2]], [[4, 0, 3]]])  # [K, B, T]: client 0's window, then client 1's
    out = stacked.forward(params, x, None)
    for j in range(k):  # each client's rows read its own table
        assert torch.equal(out[j, 0], params["0.weight"][j][x[j, 0]])
    out.sum().backward()
    grad = params["0.weight"].grad
    assert torch.equal(grad[:, 0], torch.zeros(k, 3))  # the padding id
    assert torch.equal(grad[0, 4], torch.zeros(3)) and torch.equal(grad[1, 4], torch.ones(3))
    with pytest.raises(IndexError, match=r"outside \[0, 5\)"):
        stacked.forward(
            params, torch.tensor([[[0, 1, 5]], [[4, 0, 3]]]), None
        )  # offset, 5 is client 1's id 0


def test_token_models_run_end_to_end_vectorised_recurrent_ones_too(tmp_path):
    for model in ("bag_of_tokens", "token_gru"):  # nn.GRU has a per-layer rule (checked on real ids)
        fast = run_scenario(_scenario(model), write=False)
        assert {r["local_training"] for r in fast.rows} == {"per-layer"}
        loop = run_scenario(_scenario(model, "engine.vectorize=loop"), write=False)
        np.testing.assert_allclose(fast.weights, loop.weights, rtol=1e-4, atol=1e-6)


def test_a_refusal_on_real_examples_publishes_no_text_computed_from_them():
    from fedsim.factories import resolve_loss
    from fedsim.training.vectorized import choose_path

    class Branchy(
        nn.Module
    ):  # data-dependent control flow: neither per-layer (Bilinear) nor vmap can batch it
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.mix, self.out = (
                nn.Embedding(30, 4),
                nn.Bilinear(4, 4, 4),
                nn.Linear(4, 2),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            if h.sum() > 0:
                h = -h
            return self.out(self.mix(h[:, -1], h[:, -1]))

    x, y = torch.randint(0, 30, (8, 5)), torch.randint(0, 2, (8,))
    cpu, loss = torch.device("cpu"), resolve_loss("cross_entropy")
    path = choose_path(Branchy(), (5,), 2, loss, cpu, examples=(x, y))
    assert path.name == "loop"
    vmap = [f for f in path.fallbacks if f.startswith("vmap")]
    # the exception's type and the line of the user's forward that raised it; where its message can be read
    assert vmap and vmap[0].startswith("vmap: RuntimeError raised in forward (test_token_inputs.py:"), vmap
    assert vmap[0].endswith(
        "on real examples (its message is not published: it may quote them; engine.vectorize='vmap' stops the run "
        "with it)"
    ), vmap
    with pytest.raises(
        ValueError, match=r"engine\.vectorize='vmap' cannot train this model: .*data-dependent"
    ):
        choose_path(Branchy(), (5,), 2, loss, cpu, "vmap", examples=(x, y))
    with_random = choose_path(Branchy(), (5,), 2, loss, cpu)  # float-input models: the message as before
    assert any(f.startswith("vmap: ") and len(f) > 40 for f in with_random.fallbacks)
