"""Language models as people write them (issue 34): a nanoGPT-style transformer (positions as
``self.pos(torch.arange(T))``), ``nn.RMSNorm``, post-LN ``nn.TransformerEncoderLayer`` with a boolean causal mask,
``nn.MultiheadAttention`` with a boolean mask, a root ``nn.Parameter`` of positions and a GRU with dropout between its
layers (tests/token_models.py): all take the per-layer path now.

Each new rule gives every client exactly the gradient of the model run alone on its examples, checked against
per-client autograd and per-example ``torch.func`` at tight tolerance for several stacked shapes, with ``-100``
padding in the targets; each model takes the path its layers allow, and where it falls back the reason names the
cause."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from token_models import VOCAB, encoder_lm, gru_lm, tiny_gpt, token_sequences
from torch import nn
from torch.func import functional_call, grad, vmap

from fedsim.data import build_federated_data
from fedsim.factories import IGNORE_INDEX, cross_entropy
from fedsim.training.layers import StackedModel, Unsupported
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights
from fedsim.training.vectorized import _per_layer_step, choose_path

CPU = torch.device("cpu")
T = 6
_SEQ = token_sequences(4, seed=0, length=T)
#: real examples: T token ids, next-token targets with -100 where no token follows
EXAMPLES = (torch.from_numpy(_SEQ["x"]), torch.from_numpy(_SEQ["y"]))

pytestmark = pytest.mark.filterwarnings(
    "ignore:dropout option adds dropout after all but last recurrent layer",
    "ignore:enable_nested_tensor is True",
    "ignore:There is a performance drop because we have not yet implemented the batching rule",
    "ignore:LSTM with projections is not supported with oneDNN",
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _path(model: nn.Module):
    return choose_path(model, (T,), VOCAB, cross_entropy, CPU, examples=EXAMPLES)


# --------------------------------------------------------------------------- the new rules against torch
class PositionsAdded(nn.Module):
    """Token embeddings plus positions looked up on ids without the batch axis: ``[T]`` (nanoGPT) or ``[1, T]``,
    optionally with a padding id among the positions, then ``RMSNorm`` and logits at every position."""

    def __init__(self, ids: str, padding_idx: int | None) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 5)
        self.pos = nn.Embedding(T, 5, padding_idx=padding_idx)
        self.norm = nn.RMSNorm(5)
        self.head = nn.Linear(5, VOCAB)
        self.ids = ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1])
        if self.ids == "1xT":
            positions = positions.unsqueeze(0)
        return self.head(self.norm(self.tok(x) + self.pos(positions)))


def _stacked_against_alone(model: nn.Module, k: int, b: int, seed: int) -> None:
    """K clients of B sequences (the last client's last sequence padding; some targets -100): the per-layer step's
    losses and gradients equal, client by client, those of the model run alone on its real sequences, and, per
    example, ``torch.func``'s per-example gradients summed over the client's examples."""
    gen = torch.Generator().manual_seed(seed)
    params = {
        n: p.detach() + 0.1 * torch.randn(k, *p.shape, generator=gen) for n, p in model.named_parameters()
    }
    pick = torch.randperm(len(EXAMPLES[1]), generator=gen)[: k * b] % len(EXAMPLES[1])
    x = EXAMPLES[0][pick].view(k, b, T)
    y = EXAMPLES[1][pick].view(k, b, T).clone()
    y[0, 0, -2:] = IGNORE_INDEX  # padded targets in every shape
    assert (y == IGNORE_INDEX).any()
    mask = torch.ones(k, b)
    mask[-1, -1] = 0.0 if b > 1 else 1.0
    count = mask.sum(1)
    step = _per_layer_step(StackedModel(model), cross_entropy)
    grads, losses = step(params, x, y, mask, count, None)

    def one(p, xi, yi):  # one example's loss, the model alone
        return cross_entropy(functional_call(model, p, (xi[None],)), yi[None])[0]

    for j in range(k):
        real = int(count[j])
        own = {n: v[j].clone().requires_grad_(True) for n, v in params.items()}
        ref = cross_entropy(functional_call(model, own, (x[j, :real],)), y[j, :real]).mean()
        ref_grads = torch.autograd.grad(ref, list(own.values()))
        per_example = vmap(grad(one), in_dims=(None, 0, 0))({n: v[j] for n, v in params.items()}, x[j], y[j])
        torch.testing.assert_close(losses[j], ref.detach(), rtol=1e-5, atol=1e-6)
        for (name, want), pe in zip(zip(own, ref_grads, strict=True), per_example.values(), strict=True):
            torch.testing.assert_close(grads[name][j], want, rtol=1e-5, atol=1e-6, msg=name)
            from_examples = (pe * mask[j].view(-1, *[1] * (pe.dim() - 1))).sum(0) / count[j]
            torch.testing.assert_close(grads[name][j], from_examples, rtol=1e-5, atol=1e-6, msg=name)


SHAPES = [(1, 1), (3, 1), (2, 4), (4, 3), (5, 2)]  # (clients, sequences each); 2 x 3 = T is the stacked batch


@pytest.mark.parametrize(("k", "b"), SHAPES, ids=[f"{k}x{b}" for k, b in SHAPES])
@pytest.mark.parametrize("padding_idx", [None, 2], ids=["", "padding-idx"])
@pytest.mark.parametrize("ids", ["T", "1xT"])
def test_shared_ids_and_rmsnorm_give_each_client_its_own_gradient(ids, padding_idx, k, b):
    torch.manual_seed(0)
    _stacked_against_alone(PositionsAdded(ids, padding_idx), k, b, seed=k * 10 + b)


@pytest.mark.parametrize(("k", "b"), SHAPES, ids=[f"{k}x{b}" for k, b in SHAPES])
@pytest.mark.parametrize(
    "factory",
    [
        lambda: tiny_gpt((T,), VOCAB),
        lambda: tiny_gpt((T,), VOCAB, norm="rms"),
        lambda: encoder_lm((T,), VOCAB),  # post-LN, boolean causal mask
        lambda: encoder_lm((T,), VOCAB, attention="mha"),  # boolean attn_mask
    ],
    ids=["gpt", "gpt-rmsnorm", "post-ln-bool-mask", "mha-bool-mask"],
)
def test_language_models_give_each_client_its_own_gradient(factory, k, b):
    torch.manual_seed(0)
    model = factory()
    model.eval()  # no dropout: the gradients are compared with torch's own forward
    _stacked_against_alone(model, k, b, seed=k * 10 + b)


def test_rmsnorm_without_a_scale_and_with_eps():
    torch.manual_seed(0)
    model = PositionsAdded("T", None)
    model.norm = nn.RMSNorm(5, eps=1e-3, elementwise_affine=False)
    _stacked_against_alone(model, 3, 2, seed=0)


def test_a_sequence_length_equal_to_the_stacked_batch_is_not_mistaken_for_it():
    """Whether an Embedding's ids are batched comes from running the model alone on 1 and 2 examples: with
    T = K * B (6 = 2 x 3 and 3 x 2) the positions are still shared, not split between the clients."""
    torch.manual_seed(0)
    for k, b in ((2, 3), (3, 2), (6, 1)):
        _stacked_against_alone(PositionsAdded("T", None), k, b, seed=k)


# --------------------------------------------------------------------------- the path each model takes
@pytest.mark.parametrize(
    "factory",
    [
        lambda: tiny_gpt((T,), VOCAB),
        lambda: tiny_gpt((T,), VOCAB, norm="rms"),
        lambda: encoder_lm((T,), VOCAB),
        lambda: encoder_lm((T,), VOCAB, norm_first=True),
        lambda: encoder_lm((T,), VOCAB, attention="mha"),
    ],
    ids=["gpt", "gpt-rmsnorm", "post-ln-bool-mask", "pre-ln-bool-mask", "mha-bool-mask"],
)
def test_language_models_take_the_per_layer_path(factory):
    torch.manual_seed(0)
    path = _path(factory())
    assert path.name == "per-layer", path.fallbacks


@pytest.mark.parametrize("positions", ["parameter", "parameter-1xT"], ids=["T-x-dim", "1-x-2T-x-dim-sliced"])
def test_a_root_parameter_of_positions_takes_the_per_layer_path(positions):
    torch.manual_seed(0)
    path = _path(tiny_gpt((T,), VOCAB, positions=positions))
    assert path.name == "per-layer", path.fallbacks


@pytest.mark.parametrize(("k", "b"), SHAPES, ids=[f"{k}x{b}" for k, b in SHAPES])
@pytest.mark.parametrize("positions", ["parameter", "parameter-1xT"], ids=["T-x-dim", "1-x-2T-x-dim-sliced"])
def test_a_root_parameter_gives_each_client_its_own_gradient(positions, k, b):
    torch.manual_seed(0)
    _stacked_against_alone(tiny_gpt((T,), VOCAB, positions=positions, norm="rms").eval(), k, b, seed=k + b)


class Temperature(nn.Module):
    """A scalar parameter of the model's own, dividing the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 4), nn.Linear(4, VOCAB)
        self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x)) / self.temperature


def test_a_scalar_parameter_of_the_model_is_refused_saying_why():
    torch.manual_seed(0)
    path = _path(Temperature())
    assert path.name == "vmap"
    assert path.fallbacks == (
        "per-layer: Temperature at '<root>' holds a scalar parameter (temperature) that its forward uses directly: "
        "torch broadcasts a scalar over every axis, and giving each example its client's copy needs the axes it "
        "meets, which the per-layer path cannot know (a parameter with axes is given as [batch, *shape])",
    )


def test_a_gru_with_dropout_between_its_layers_takes_the_per_layer_path():
    """Torch draws that dropout inside the layer; the rule draws each client's masks, as the loop does."""
    torch.manual_seed(0)
    for dropout in (0.2, 0.0):
        path = _path(gru_lm((T,), VOCAB, dropout=dropout))
        assert path.name == "per-layer", path.fallbacks


class BatchCentered(nn.Module):
    """Subtracts the batch's mean embedding: mixes the examples of a batch, so neither vectorised path is exact."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 4), nn.Linear(4, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        return self.head(e - e.mean(0, keepdim=True))


def test_the_checks_own_refusals_on_real_examples_are_published_whole():
    """The check's reasons quote nothing computed from the examples: published for vmap too (they used to read
    "Unsupported on real examples (its message: the worker's log)", with no worker on the local engine)."""
    path = _path(BatchCentered())
    assert path.name == "loop"
    assert path.fallbacks == (
        "per-layer: client 0's loss differs from the model run alone on its real examples (does forward mix the "
        "examples of a batch?)",
        "vmap: Unsupported: client 1's loss differs from the model run alone on its real examples (does forward mix "
        "the examples of a batch?)",
    )


class TimeFirstIds(nn.Module):
    """Ids transposed to ``[T, n]`` before the Embedding: the first axis is not the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 4)
        self.head = nn.Linear(4, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x.t())).transpose(0, 1)


class SameTableTwice(nn.Module):
    """One Embedding for the tokens and, on ids without the batch axis, for the positions."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 4)
        self.head = nn.Linear(4, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x) + self.embed(torch.arange(x.shape[1])))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            TimeFirstIds,
            "nn.Embedding at 'embed' is called on ids of shape (6, 1) for 1 example and (6, 2) for 2: its per-layer "
            "rule takes ids whose first axis is the batch, or ids shared by every example (without the batch axis)",
        ),
        (
            SameTableTwice,
            "nn.Embedding at 'embed' is called both on batched ids and on ids without the batch axis",
        ),
    ],
    ids=["time-first", "batched-and-shared"],
)
def test_embeddings_the_rule_cannot_tell_apart_are_refused_by_name(model, reason):
    torch.manual_seed(0)
    path = _path(model())
    assert path.name == "vmap"
    assert path.fallbacks == (f"per-layer: {reason}",)
    with pytest.raises(Unsupported, match=reason.replace("(", r"\(").replace(")", r"\)")):
        StackedModel(model()).trace(EXAMPLES[0][:2])


def test_a_shared_table_sliced_by_the_sequence_length_is_refused_not_trained_wrong():
    """``self.pos(torch.arange(8))[:T]`` slices the stacked batch's axis in the per-layer path: the check (on a
    stacked batch whose size is no axis of an example) finds it, and vmap trains it."""

    class Sliced(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos, self.head = nn.Embedding(VOCAB, 4), nn.Embedding(8, 4), nn.Linear(4, VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.tok(x) + self.pos(torch.arange(8))[: x.shape[1]])

    torch.manual_seed(0)
    path = _path(Sliced())
    assert path.name == "vmap", path.fallbacks
    assert path.fallbacks[0].startswith("per-layer: RuntimeError"), path.fallbacks


# --------------------------------------------------------------------------- training: the per-client loop's updates
@pytest.fixture(scope="module")
def sequences():
    return build_federated_data(
        token_sequences, num_clients=8, heldout_fraction=0.0, options={"per_client": 6, "length": T}
    )


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({}, "per-layer"),  # nanoGPT positions, nn.Dropout after the embeddings: the loop's masks
        ({"norm": "rms"}, "per-layer"),
        ({"positions": "parameter"}, "per-layer"),
        ({"positions": "parameter-1xT"}, "vmap"),  # vmap trains it too, as the loop does
    ],
    ids=["gpt", "gpt-rmsnorm", "gpt-root-parameter", "gpt-root-parameter-vmap"],
)
def test_ragged_clients_train_as_in_the_per_client_loop(sequences, kwargs, path):
    cids = [int(c) for c in sequences.train_clients]
    assert len(set(sequences.num_examples_array(cids).tolist())) > 1
    results = {}
    w = None
    for name in (path, "loop"):
        settings = TrainSettings(
            model="token_models:tiny_gpt",
            model_kwargs=kwargs,
            local_epochs=2,
            batch_size=4,
            lr=0.3,
            optimizer="momentum",
            momentum=0.5,
            seed=1,
            vectorize=name,
        )
        w = initial_weights(settings, sequences.input_shape, sequences.num_classes) if w is None else w
        trainer = ClientTrainer(sequences, settings, device="cpu")
        assert trainer.path.name == name
        if (
            path == "vmap"
        ):  # vmap draws dropout from torch's generator, the loop from the client's: compare without
            trainer.model.drop.p = 0.0
        results[name] = trainer.train(ClientPlan(1, cids, 0.5), w)
    got, ref = results[path], results["loop"]
    np.testing.assert_allclose(got[0].total, ref[0].total, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        [m["update_norm"] for m in got[1]], [m["update_norm"] for m in ref[1]], rtol=1e-4
    )
    assert all(m["trainer"] == path for m in got[1])
    assert float(np.abs(ref[0].total).max()) > 1e-3  # it trained


def test_the_rmsnorm_rule_is_torchs_normalisation_with_each_clients_scale():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)
    w = torch.randn(3, 5)
    layer = nn.RMSNorm(5)
    from fedsim.training.layers import RULES

    got = RULES[nn.RMSNorm].forward(layer, {"weight": w}, 3, None, x.reshape(12, 5))
    for j in range(3):
        torch.testing.assert_close(got.view(3, 4, 5)[j], F.rms_norm(x[j], (5,), w[j]))


class FlatIds(nn.Module):
    """Ids flattened to ``[n * T]`` before the Embedding, the embeddings viewed back as ``[n, T, dim]``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 4), nn.Linear(4, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x.flatten()).view(*x.shape, -1))


def test_flattened_ids_are_batched_ids():
    torch.manual_seed(0)
    assert _path(FlatIds()).name == "per-layer"
    _stacked_against_alone(FlatIds(), 3, 2, seed=0)


def test_the_loop_runs_what_the_rules_do_not_take_with_torchs_own_layers():
    """The per-client loop runs layers with dropout inside through their rules (each client's masks); what a rule
    does not take (a PackedSequence, add_bias_kv, proj_size) runs as torch's own layer there, as before."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from fedsim.training.layers import DropoutMasks, client_dropout, dropout_layers

    class Refused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 4, num_layers=2, dropout=0.3, batch_first=True)
            self.attn = nn.MultiheadAttention(4, 2, dropout=0.3, add_bias_kv=True, batch_first=True)
            self.lstm = nn.LSTM(4, 4, num_layers=2, dropout=0.3, proj_size=2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            packed = pack_padded_sequence(x, torch.full((len(x),), x.shape[1]), batch_first=True)
            h = self.attn(x, x, x)[0]
            return self.lstm(h)[0].sum(-1) + self.gru(packed)[0].data.view(*x.shape).sum(-1)

    torch.manual_seed(0)
    model = Refused().train()
    assert len(dropout_layers(model)) == 3
    x = torch.randn(3, 5, 4)
    with client_dropout(model, DropoutMasks.for_clients(0, 0, [1], CPU)):
        out = model(x)
    out.sum().backward()
    assert out.shape == (3, 5) and all(p.grad is not None for p in model.parameters())
