"""The shipped sequence models (``lstm``, ``transformer``) on token-id windows of the Shakespeare dataset."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, stack_module_state, vmap

from fedsim.data.shakespeare import VOCAB_SIZE, build_shakespeare
from fedsim.factories import check_private_trainable
from fedsim.models import MODELS, build_model, num_parameters

SMALL = {"lstm": {"hidden": 16, "layers": 2}, "transformer": {"d_model": 16, "heads": 2, "ff": 32}}


@pytest.fixture(scope="module")
def windows():
    fd = build_shakespeare(num_clients=4, max_samples_per_client=8, seq_len=40)
    x, y = fd.client_data(0)
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.mark.parametrize("name", ["lstm", "transformer"])
def test_forward_on_real_windows(name, windows):
    assert name in MODELS
    x, y = windows
    model = build_model(name, (40,), VOCAB_SIZE, **SMALL[name])
    out = model(x[:4])
    assert x.dtype == torch.int64 and out.shape == (4, VOCAB_SIZE) and out.dtype == torch.float32
    assert list(model.buffers()) == []
    check_private_trainable(model)  # no BatchNorm, no parameters shared between layers
    torch.nn.functional.cross_entropy(out, y[:4]).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_lstm_defaults_are_leafs():
    model = build_model("lstm", (80,), 81)
    assert model.embed.embedding_dim == 8 and model.lstm.hidden_size == 256 and model.lstm.num_layers == 2
    lstm = 4 * 256 * (8 + 256) + 4 * 256 * (256 + 256) + 2 * 2 * 4 * 256
    assert num_parameters(model) == 81 * 8 + lstm + 256 * 81 + 81
    small = build_model("lstm", (80,), 81, embedding_dim=4, hidden=8, layers=1, vocab=90)
    assert (
        small.embed.num_embeddings == 90
        and num_parameters(small) == 90 * 4 + 4 * 8 * 12 + 2 * 32 + 8 * 81 + 81
    )


def test_transformer_options():
    model = build_model("transformer", (40,), 81, d_model=32, heads=4, layers=3, ff=64, vocab=100)
    assert (
        len(model.layers) == 3 and model.embed.num_embeddings == 100 and model.position.num_embeddings == 40
    )
    assert all(layer.dropout.p == 0.0 and layer.self_attn.batch_first for layer in model.layers)
    model.eval()
    x = torch.randint(0, 81, (3, 40))
    torch.testing.assert_close(model(x)[:1], model(x[:1]))  # examples do not mix
    with pytest.raises(ValueError, match="heads"):
        build_model("transformer", (40,), 81, d_model=30, heads=4)
    with pytest.raises(ValueError, match="dropout"):
        build_model("transformer", (40,), 81, dropout=1.5)


@pytest.mark.parametrize("name", ["lstm", "transformer"])
def test_refuses_images_and_bad_options(name):
    with pytest.raises(ValueError, match="token ids"):
        build_model(name, (1, 8, 8), 10)
    with pytest.raises(ValueError, match="layers"):
        build_model(name, (40,), 10, layers=0)


@pytest.mark.parametrize("name", ["lstm", "transformer"])
def test_vmap_over_stacked_clients(name, windows):
    x, y = windows
    models = [build_model(name, (40,), VOCAB_SIZE, **SMALL[name]) for _ in range(2)]
    params, buffers = stack_module_state(models)
    xb, yb = x[:6].reshape(2, 3, 40), y[:6].reshape(2, 3)

    def loss(p, b, xs, ys):
        return torch.nn.functional.cross_entropy(functional_call(models[0], (p, b), (xs,)), ys)

    grads = vmap(grad(loss))(params, buffers, xb, yb)  # fedsim's vmap path: one gradient per client
    for i, m in enumerate(models):
        torch.nn.functional.cross_entropy(m(xb[i]), yb[i]).backward()
        for k, p in m.named_parameters():
            torch.testing.assert_close(grads[k][i], p.grad, rtol=1e-4, atol=1e-5)
