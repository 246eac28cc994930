"""The shipped model factories: shapes, determinism, torch.func compatibility, errors."""

import pytest
import torch
from torch.func import functional_call, grad, stack_module_state, vmap

from fedsim.models import MODELS, build_model, num_parameters

# every shipped model but the sequence ones takes the digits as images; all but cnn2d also take flat features
SHAPES = {"cnn2d": [(1, 8, 8), (3, 5, 7)]}
# lstm and transformer take token ids [n, seq_len]: tests/models/test_sequence_models.py
MODELS = tuple(m for m in MODELS if m not in ("lstm", "transformer"))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_output_shape(name, which):
    shape = (SHAPES.get(name) or [(40,), (60,), (1, 8, 8)])[min(which, len(SHAPES.get(name, [0] * 3)) - 1)]
    model = build_model(name, shape, 10)
    assert model(torch.randn(7, *shape)).shape == (7, 10)
    assert list(model.buffers()) == []


@pytest.mark.parametrize("name", MODELS)
def test_deterministic_init(name):
    torch.manual_seed(3)
    shape = (SHAPES.get(name) or [(40,)])[0]
    a = build_model(name, shape, 10)
    torch.manual_seed(3)
    b = build_model(name, shape, 10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("name", MODELS)
def test_vmap_over_stacked_clients(name):
    shape = (SHAPES.get(name) or [(40,)])[0]
    models = [build_model(name, shape, 10) for _ in range(3)]
    params, buffers = stack_module_state(models)
    base = models[0]
    x = torch.randn(3, 5, *shape)
    y = torch.randint(0, 10, (3, 5))

    def loss(p, b, xb, yb):
        out = functional_call(base, (p, b), (xb,))
        return torch.nn.functional.cross_entropy(out, yb)

    outs = vmap(lambda p, b, xb: functional_call(base, (p, b), (xb,)))(params, buffers, x)
    assert outs.shape == (3, 5, 10)
    for i, m in enumerate(models):
        torch.testing.assert_close(outs[i], m(x[i]))
    grads = vmap(grad(loss))(params, buffers, x, y)
    assert all(grads[k].shape == params[k].shape for k in params)


def test_mlp_options():
    assert num_parameters(build_model("mlp", 64, 10)) == 64 * 100 + 100 + 100 * 10 + 10
    deep = build_model("mlp", 64, 10, hidden=[32, 16])
    assert num_parameters(deep) == 64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    linear = build_model("mlp", 64, 10, hidden=())
    assert num_parameters(linear) == num_parameters(build_model("logreg", 64, 10))
    assert build_model("cnn1d", 40, 10, channels=(4, 8), kernel_size=3)(torch.randn(2, 40)).shape == (2, 10)


@pytest.mark.parametrize(
    "args,kwargs,option",
    [
        (("resnet", 40, 10), {}, "model"),
        (("mlp", 0, 10), {}, "input_shape"),
        (("cnn2d", (40,), 10), {}, "cnn2d takes images"),
        (("cnn2d", (1, 8, 8), 10), {"groups": 3}, "groups"),
        (("mlp", 40, 0), {}, "num_classes"),
        (("mlp", 40, 10), {"hidden": [0]}, "hidden"),
        (("logreg", 40, 10), {"hidden": [8]}, "hidden"),
        (("cnn1d", 40, 10), {"channels": (4,)}, "channels"),
        (("cnn1d", 40, 10), {"kernel_size": 0}, "kernel_size"),
    ],
)
def test_errors_name_the_option(args, kwargs, option):
    with pytest.raises(ValueError, match=option):
        build_model(*args, **kwargs)
