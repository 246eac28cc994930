"""The shipped model factories (``mlp``, ``logreg``, ``cnn1d``, ``cnn2d``; ``lstm`` and ``transformer`` over token ids).

>>> from fedsim.models import build_model
>>> model = build_model("cnn2d", input_shape=(1, 8, 8), num_classes=10)

Each is a factory ``f(input_shape, num_classes, **options) -> nn.Module``, the contract of a user's model
(:mod:`fedsim.factories`). They hold no buffers and no BatchNorm. All are built from layer types that fedsim's
per-layer vectorised training supports (:mod:`fedsim.training.layers`, :mod:`fedsim.training.sequence_layers`), the
sequence models (``lstm``, ``transformer``: token ids ``[n, seq_len]`` in) included; a ``transformer`` with
``dropout > 0`` trains on vmap (torch draws attention dropout inside the layer, where clients cannot have their own
masks). Initialisation is PyTorch's default, so deterministic given ``torch.manual_seed``.
"""

from fedsim.models.registry import (
    MODEL_FACTORIES,
    MODELS,
    build_model,
    cnn1d,
    cnn2d,
    logreg,
    lstm,
    mlp,
    num_parameters,
    transformer,
)

__all__ = [
    "MODELS",
    "MODEL_FACTORIES",
    "build_model",
    "cnn1d",
    "cnn2d",
    "logreg",
    "lstm",
    "mlp",
    "num_parameters",
    "transformer",
]
