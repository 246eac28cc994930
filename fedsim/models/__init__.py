"""Small torch models with a registry.

>>> from fedsim.models import build_model
>>> model = build_model("mlp", input_dim=64, num_classes=10, hidden=(100,))

Every model maps float inputs ``[n, input_dim]`` to logits ``[n, num_classes]``, holds no buffers
(no BatchNorm running statistics, no dropout), and so works under ``torch.func.functional_call`` and
``torch.func.vmap`` over stacked parameters. Initialisation is PyTorch's default and therefore
deterministic given ``torch.manual_seed``.
"""

from fedsim.models.registry import CNN1D, MLP, MODELS, LogReg, build_model, num_parameters

__all__ = ["CNN1D", "MLP", "MODELS", "LogReg", "build_model", "num_parameters"]
