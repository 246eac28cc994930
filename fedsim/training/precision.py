"""Full FP32 on CUDA: the trainer's convolutions and matrix products without TensorFloat-32 (:func:`full_fp32`).

On Ampere and later GPUs PyTorch lets cuDNN run float32 convolutions in TF32 by default
(``torch.backends.cudnn.allow_tf32 = True``), and a caller may allow it for matrix products too. TF32 keeps 10 bits
of mantissa, so each product is rounded to about 5e-4 relative and a layer's outputs and gradients move by ~1e-3
relative. fedsim cannot afford that where it trains:

* the training-path check (:func:`fedsim.training.vectorized.choose_path`) compares each client's batched gradient
  with the model run alone; in TF32 the two kernels round differently, the check fails and the trainer falls back
  to the per-client loop (cnn1d, 1,000 clients on an H200: 5.9 s a round instead of 0.157 s with TF32 off);
* a client's update norm is compared with the clip (DP clipping, the unclipped count adaptive clipping learns
  from), so the device must not decide which side of the clip a client lands on;
* a run on CUDA must give the CPU's results to float32 rounding (``tests/engine/test_gpu.py``: in TF32 the Conv2d
  CNN's CUDA round differed from the CPU's in 74% of its values, by up to 0.01).

The settings are process-wide, so :func:`full_fp32` sets them around each call of the trainer and gives the
caller's back after it (as :func:`fedsim.engine.threads.torch_threads` does for torch's thread count): a Python
caller's torch is left as it was. On a CPU they matter only where a caller lowered
``torch.set_float32_matmul_precision`` (oneDNN may then multiply in bfloat16): full FP32 there too. Setting them
costs a few attribute writes a call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: what fedsim's training uses on CUDA: TF32 off (recorded in ``summary.json``'s ``engine``)
TF32 = False


def _precision_flags() -> list[Any]:
    """The per-operator ``fp32_precision`` settings of PyTorch >= 2.9 that full FP32 sets: cuBLAS's matmul, cuDNN's
    convolutions and RNNs, and oneDNN's CPU matmul (which ``torch.set_float32_matmul_precision`` also sets); none on
    an older PyTorch, which has the legacy flags only."""
    backends = torch.backends
    try:
        flags = [backends.cuda.matmul, backends.cudnn.conv, backends.cudnn.rnn, backends.mkldnn.matmul]
    except AttributeError:
        return []
    return flags if all(hasattr(f, "fp32_precision") for f in flags) else []


def _legacy_settings() -> tuple[bool, str] | None:
    """cuDNN's ``allow_tf32`` and ``torch.get_float32_matmul_precision()`` (which ``cuda.matmul.allow_tf32`` reads and
    writes: kept as the string, so that ``"medium"`` comes back as ``"medium"``), or ``None`` where PyTorch refuses
    to read them: a caller set them and the ``fp32_precision`` settings apart (PyTorch >= 2.9 calls that a mix of
    the two APIs)."""
    try:
        return torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Float32 convolutions and matrix products in IEEE float32 (no TF32) inside the block; the caller's settings
    given back exactly as they were found after it (nested blocks too).

    Through the legacy settings (``torch.backends.cudnn.allow_tf32 = False``,
    ``torch.set_float32_matmul_precision("highest")``, which is ``torch.backends.cuda.matmul.allow_tf32 = False``),
    whose setters keep PyTorch >= 2.9's per-operator ``fp32_precision`` settings in step, and then each of those set
    to ``"ieee"``; both are restored after the block. Where a caller set the two APIs apart (PyTorch then refuses
    to read the legacy ones), only the ``fp32_precision`` settings are set and restored, and the legacy ones are
    left as they were."""
    legacy = _legacy_settings()
    flags = _precision_flags()
    saved = [(f, f.fp32_precision) for f in flags]
    if legacy is not None:
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")  # = cuda.matmul.allow_tf32 = False, and no bf16 on CPU
    for f in flags:
        if f.fp32_precision != "ieee":
            f.fp32_precision = "ieee"
    try:
        yield
    finally:
        if legacy is not None:
            torch.backends.cudnn.allow_tf32 = legacy[0]
            torch.set_float32_matmul_precision(legacy[1])
        for f, value in saved:
            if f.fp32_precision != value:
                f.fp32_precision = value
