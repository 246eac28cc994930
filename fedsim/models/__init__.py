"""The shipped model factories (``mlp``, ``logreg``, ``cnn1d``, ``cnn2d``; ``lstm`` and ``transformer`` over token ids).

>>> from fedsim.models import build_model
>>> model = build_model("cnn2d", input_shape=(1, 8, 8), num_classes=10)

Each is a factory ``f(input_shape, num_classes, **options) -> nn.Module``, the contract of a user's model
(:mod:`fedsim.factories`). They hold no buffers and no BatchNorm. The image and feature models are built from
layer types that fedsim's per-layer vectorised training supports; the sequence models (``lstm``,
``transformer``: token ids ``[n, seq_len]`` in) contain layers with no per-layer rule (LSTM, attention) and
train on the ``torch.func.vmap`` path or the per-client loop. Initialisation is PyTorch's default, so deterministic given
``torch.manual_seed``.
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
