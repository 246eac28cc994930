"""Stacked forward passes (one batched GEMM per layer) against the modules themselves, and the vmap fallback."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from fedsim.models import build_model
from fedsim.training import vectorized
from fedsim.training.shuffle import client_orders
from fedsim.training.stacked import dense_step, stacked_forward

CASES = [
    ("logreg", 40, {}),
    ("mlp", 40, {"hidden": []}),
    ("mlp", 64, {"hidden": [32, 16]}),
    ("cnn1d", 40, {}),
    ("cnn1d", 37, {"channels": [3, 5], "kernel_size": 4}),  # odd length, even kernel
    ("cnn1d", 64, {"channels": [8, 4], "kernel_size": 1}),
]


@pytest.mark.parametrize(("name", "dim", "kw"), CASES)
def test_stacked_forward_and_gradients_match_the_module(name, dim, kw):
    torch.manual_seed(0)
    model = build_model(name, dim, 10, **kw)
    k, b = 5, 7
    params = {n: p.detach() + 0.1 * torch.randn(k, *p.shape) for n, p in model.named_parameters()}
    x, y = torch.randn(k, b, dim), torch.randint(0, 10, (k, b))
    forward = stacked_forward(model)
    assert forward is not None
    want = vmap(lambda p, xx: functional_call(model, p, (xx,)))(params, x)
    got = forward(params, x)
    assert got.shape == (k, b, 10)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # one backward pass of the summed losses gives every client its own gradient
    leaves = {n: v.clone().requires_grad_(True) for n, v in params.items()}
    loss = F.cross_entropy(forward(leaves, x).reshape(-1, 10), y.reshape(-1), reduction="sum")
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for j in range(k):
        single = {n: v[j].clone().requires_grad_(True) for n, v in params.items()}
        ref = torch.autograd.grad(
            F.cross_entropy(functional_call(model, single, (x[j],)), y[j], reduction="sum"),
            list(single.values()),
        )
        for g, r in zip(grads, ref, strict=True):
            torch.testing.assert_close(g[j], r, rtol=1e-4, atol=1e-5)


def test_unknown_model_has_no_stacked_forward_and_vectorized_falls_back_to_vmap(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    assert stacked_forward(model) is None
    torch.manual_seed(1)
    k, b = 4, 5
    params = {n: p.detach() + 0.1 * torch.randn(k, *p.shape) for n, p in model.named_parameters()}
    x, y = torch.randn(k, b, 6), torch.randint(0, 3, (k, b))
    mask = torch.ones(k, b)
    mask[2, 3:] = 0
    count = mask.sum(1)
    grads, losses = vectorized._make_step(model)(params, x, y, mask, count)
    for j in range(k):
        single = {n: v[j].clone().requires_grad_(True) for n, v in params.items()}
        ce = F.cross_entropy(functional_call(model, single, (x[j],)), y[j], reduction="none")
        loss = (ce * mask[j]).sum() / count[j]
        ref = torch.autograd.grad(loss, list(single.values()))
        assert float(losses[j]) == pytest.approx(float(loss.detach()), rel=1e-5)
        for name, r in zip(single, ref, strict=True):
            torch.testing.assert_close(grads[name][j], r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("mlp", {"hidden": [20]}),
        ("mlp", {"hidden": [12, 7]}),
        ("logreg", {}),
        ("cnn1d", {"channels": [4, 6]}),
        ("cnn1d", {"channels": [3, 5], "kernel_size": 4}),
        ("cnn1d", {"channels": [2, 3], "kernel_size": 1}),
    ],
)
def test_the_three_step_implementations_agree_with_masks(monkeypatch, name, kw):
    """dense_step (backward written out), the stacked forward with autograd, and vmap give the same step."""
    model = build_model(name, 40, 10, **kw)
    torch.manual_seed(2)
    k, b = 6, 8
    params = {n: p.detach() + 0.1 * torch.randn(k, *p.shape) for n, p in model.named_parameters()}
    x, y = torch.randn(k, b, 40), torch.randint(0, 10, (k, b))
    mask = (torch.rand(k, b) < 0.7).float()
    mask[4] = 0.0  # a client past its last batch
    count = mask.sum(1).clamp_min(1)
    results = []
    for disable in ((), ("dense_step",), ("dense_step", "stacked_forward")):
        for attr in disable:
            monkeypatch.setattr(vectorized, attr, lambda _m: None)
        results.append(vectorized._make_step(model)(params, x, y, mask, count))
        monkeypatch.undo()
    assert dense_step(model) is not None
    (g0, l0) = results[-1]  # vmap: the reference
    for g, losses in results[:-1]:
        torch.testing.assert_close(losses, l0, rtol=1e-5, atol=1e-6)
        for n in params:
            torch.testing.assert_close(g[n], g0[n], rtol=1e-5, atol=1e-6)
    assert float(results[0][0][next(iter(params))][4].abs().max()) == 0.0  # no examples: no gradient


def test_client_orders_are_permutations_independent_of_the_other_clients():
    cids, sizes = [3, 10, 2**63 + 7, 5], [4, 1, 9, 0]
    together = client_orders(11, 2, cids, sizes, epochs=3)
    assert together.shape == (3, sum(sizes))
    off = 0
    for cid, n in zip(cids, sizes, strict=True):
        alone = client_orders(11, 2, [cid], [n], epochs=3)
        np.testing.assert_array_equal(together[:, off : off + n], alone)
        for e in range(3):
            assert sorted(alone[e].tolist()) == list(range(n))
        off += n
    a, b = client_orders(11, 2, [3], [50], 2), client_orders(11, 3, [3], [50], 2)
    assert not np.array_equal(a, b) and not np.array_equal(a[0], a[1])  # new round, new epoch: new order
    assert not np.array_equal(client_orders(12, 2, [3], [50], 1), a[:1])  # new seed


def test_client_orders_are_uniform():
    # the first position of a 4-element permutation, over 8,000 clients: chi-square with 3 dof
    first = client_orders(5, 1, list(range(8000)), [4] * 8000, 1)[0].reshape(-1, 4)[:, 0]
    counts = np.bincount(first, minlength=4)
    chi2 = float(((counts - 2000) ** 2 / 2000).sum())
    assert chi2 < 16.3  # p = 0.001
