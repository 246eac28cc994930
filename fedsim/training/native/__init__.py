"""Fused CPU kernels, compiled on first use with the machine's C compiler and loaded with :mod:`ctypes`.

One kernel today: :func:`cnn1d_train`, the local SGD of many clients' :class:`fedsim.models.CNN1D` (see
``cnn1d.c`` for why it is written by hand). Its matrix products are the ``sgemm`` of the BLAS that PyTorch
links (MKL in the x86-64 Linux wheels), looked up in ``libtorch_cpu``; nothing is linked at build time.

The kernel is an optimisation only. :func:`available` is ``False``, and fedsim uses its PyTorch path
(:mod:`fedsim.training.stacked`), when there is no C compiler, when PyTorch exports no ``sgemm_``, when
compiling or loading fails, or when ``FEDSIM_NATIVE=0`` is set; :func:`unavailable_reason` says which.
Compiled libraries are cached in ``$FEDSIM_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fedsim``, else
``~/.cache/fedsim``, else the temporary folder), keyed by the source, the compiler, its flags and the CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.env import cache_dir
from fedsim.models.registry import CNN1D

_SRC = Path(__file__).with_name("cnn1d.c")
_FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-std=c11", "-pthread"]
_lock = threading.Lock()
_state: dict[str, Any] = {}
log = logging.getLogger(__name__)


def _compiler() -> str | None:
    cands = [
        os.environ.get("CC"),
        (sysconfig.get_config_var("CC") or "").split(" ")[0] or None,
        "cc",
        "gcc",
        "clang",
    ]
    for c in cands:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _cpu_key() -> str:
    """Identifies the instruction set ``-march=native`` compiled for (a cache shared by different CPUs, e.g.
    a home folder on a cluster, must not hand one CPU's build to another)."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features", "model name")):
                    text += line
    except OSError:
        text += platform.processor()
    return text


def _torch_symbols() -> dict[str, int | None]:
    """Addresses of ``sgemm_`` (the BLAS PyTorch links) and, when that BLAS is MKL, of
    ``MKL_Set_Num_Threads_Local`` (by-value C entry point), looked up in ``libtorch_cpu``."""
    found: dict[str, int | None] = {"sgemm_": None, "MKL_Set_Num_Threads_Local": None}
    libdir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = libdir / name
        if not path.exists():
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            return found
        for sym in found:
            try:
                found[sym] = ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value
            except AttributeError:
                pass
        break
    return found


def _build(cc: str) -> Path:
    src = _SRC.read_bytes()
    version = subprocess.run(
        [cc, "--version"], check=False, capture_output=True, text=True, timeout=30
    ).stdout
    key = hashlib.sha256(
        src + "\0".join([cc, version, *_FLAGS, _cpu_key(), sys.platform]).encode()
    ).hexdigest()[:16]
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    for root in (cache_dir(), Path(tempfile.gettempdir()) / "fedsim-cache"):
        out = root / f"cnn1d-{key}{suffix}"
        if out.exists():
            return out
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=root, suffix=suffix)
            os.close(fd)
        except OSError:
            continue  # not writable: try the next folder
        try:
            cmd = [cc, *_FLAGS, str(_SRC), "-o", tmp, "-lm"]
            res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
            if res.returncode != 0:
                raise RuntimeError(f"{cc} failed: {res.stderr.strip()[-2000:]}")
            os.replace(tmp, out)  # atomic: concurrent workers each build, one file wins
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return out
    raise RuntimeError(f"no writable cache folder ({cache_dir()} or the temporary folder)")


def _load() -> ctypes.CDLL | None:
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib, reason = None, ""
        try:
            syms = _torch_symbols()
            if (ptr := syms["sgemm_"]) is None:
                reason = "this PyTorch build exports no sgemm_"
            elif (cc := _compiler()) is None:
                reason = "no C compiler found (set CC)"
            else:
                lib = ctypes.CDLL(str(_build(cc)))
                lib.fedsim_set_sgemm.argtypes = [ctypes.c_void_p]
                lib.fedsim_set_sgemm.restype = None
                lib.fedsim_set_sgemm(ptr)
                # without it, the kernel runs on one thread (see cnn1d.c)
                lib.fedsim_set_mkl_threads_local.argtypes = [ctypes.c_void_p]
                lib.fedsim_set_mkl_threads_local(syms["MKL_Set_Num_Threads_Local"])
                f = lib.fedsim_cnn1d_train
                f.restype = ctypes.c_int
                f.argtypes = (
                    [ctypes.c_void_p] * 8
                    + [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
                    + [ctypes.c_float] * 2
                    + [ctypes.c_void_p, ctypes.c_int]
                )
        except Exception as exc:
            lib, reason = None, f"{type(exc).__name__}: {exc}"
        if lib is None:
            log.warning(
                "fedsim's fused CPU kernels are unavailable (%s); training uses the PyTorch path", reason
            )
        _state["lib"], _state["reason"] = lib, reason
        return lib


def enabled() -> bool:
    """``False`` when the environment variable ``FEDSIM_NATIVE`` is ``0`` (or ``false``, ``no``, ``off``)."""
    return os.environ.get("FEDSIM_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def available() -> bool:
    """Whether the fused kernels are enabled and usable in this process (compiles them on the first call)."""
    return enabled() and _load() is not None


def unavailable_reason() -> str:
    """Why :func:`available` is ``False`` (empty when it is ``True``)."""
    if not enabled():
        return "disabled by FEDSIM_NATIVE"
    _load()
    return str(_state.get("reason", ""))


def _ptr(t: torch.Tensor | np.ndarray) -> int:
    return int(t.data_ptr()) if isinstance(t, torch.Tensor) else int(t.ctypes.data)


def cnn1d_dims(model: Any, batch_size: int) -> np.ndarray | None:
    """The kernel's ``dims`` vector for a :class:`fedsim.models.CNN1D`, or ``None`` when the kernel does not
    cover it (grouped or dilated convolutions, non-zero padding modes, missing biases, another activation)."""
    if not isinstance(model, CNN1D) or not isinstance(model.act, nn.ReLU):
        return None
    c1, c2, head = model.conv1, model.conv2, model.head
    for conv in (c1, c2):
        if (
            conv.groups != 1
            or conv.dilation != (1,)
            or conv.padding_mode != "zeros"
            or not isinstance(conv.padding, tuple)
            or conv.bias is None
        ):
            return None
    if head.bias is None:
        return None
    names = [name for name, _ in model.named_parameters()]
    expected = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "head.weight", "head.bias"]
    if names != expected:
        return None
    offsets, off = {}, 0
    for name, p in model.named_parameters():
        offsets[name] = off
        off += p.numel()
    c0, l0 = c1.in_channels, int(model.input_dim)
    l1 = (l0 + 2 * c1.padding[0] - c1.kernel_size[0]) // c1.stride[0] + 1
    l2 = (l1 + 2 * c2.padding[0] - c2.kernel_size[0]) // c2.stride[0] + 1
    if l2 * c2.out_channels != head.in_features:
        return None
    return np.array(
        [
            c0,
            l0,
            c1.out_channels,
            c1.kernel_size[0],
            c1.stride[0],
            c1.padding[0],
            l1,
            c2.out_channels,
            c2.kernel_size[0],
            c2.stride[0],
            c2.padding[0],
            l2,
            head.out_features,
            batch_size,
            offsets["conv1.weight"],
            offsets["conv1.bias"],
            offsets["conv2.weight"],
            offsets["conv2.bias"],
            offsets["head.weight"],
            offsets["head.bias"],
            off,
        ],
        dtype=np.int32,
    )


def cnn1d_train(
    dims: np.ndarray,
    global_w: torch.Tensor,
    x_all: np.ndarray,
    y_all: np.ndarray,
    order: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
    lr: float,
    momentum: float,
    threads: int | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """Local SGD of ``K = len(sizes)`` clients from ``global_w`` (float32 ``[dim]``, ``parameters_to_vector``
    of the model); returns their updates ``[K, dim]`` (trained minus ``global_w``, float32) and the sum of
    each client's per-step mean losses ``[K]`` (float64).

    Client ``k`` owns rows ``offsets[k] : offsets[k] + sizes[k]`` of ``x_all [N, input_dim]`` (float32) and
    ``y_all [N]`` (int64); ``order [E, N]`` (int64) lists, for every epoch, the rows to visit, each client's
    in its own segment; every ``batch_size`` consecutive ones (``dims``) make one step. ``momentum`` 0 is plain
    SGD. Clients are split over ``threads`` threads (default ``torch.get_num_threads()``), contiguous ranges of
    about equal numbers of examples."""
    lib = _load()
    if lib is None:  # (used when disabled too: callers decide with available())
        raise RuntimeError(f"fedsim's native kernels are unavailable: {unavailable_reason()}")
    dims = np.ascontiguousarray(dims, dtype=np.int32)
    positive = (0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13)  # channels, lengths, kernels, strides, classes, batch
    if dims.shape != (21,) or int(dims[:14].min()) < 0 or min(int(dims[i]) for i in positive) < 1:
        raise ValueError(
            f"cnn1d_train: dims must be the 21 values of cnn1d_dims (sizes >= 1); got {dims.tolist()}"
        )
    x_all = np.ascontiguousarray(x_all, dtype=np.float32)
    y_all = np.ascontiguousarray(y_all, dtype=np.int64)
    order = np.ascontiguousarray(order, dtype=np.int64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    dim = int(dims[20])
    gw = global_w.detach().to(device="cpu", dtype=torch.float32).contiguous()
    if gw.shape != (dim,):
        raise ValueError(
            f"cnn1d_train: global_w must be [{dim}] (the model's parameters); got {tuple(gw.shape)}"
        )
    n_rows, k = x_all.shape[0], sizes.shape[0]
    if x_all.ndim != 2 or x_all.shape[1] != int(dims[0]) * int(dims[1]) or y_all.shape != (n_rows,):
        raise ValueError(f"cnn1d_train: x_all must be [N, {int(dims[0]) * int(dims[1])}] and y_all [N]")
    if offsets.shape != (k,) or sizes.ndim != 1 or order.ndim != 2 or order.shape[1] != n_rows:
        raise ValueError("cnn1d_train: offsets and sizes need one entry per client, order must be [E, N]")
    if k and (offsets.min() < 0 or sizes.min() < 0 or (offsets + sizes).max() > n_rows):
        raise ValueError(f"cnn1d_train: client segments must lie within the {n_rows} rows of x_all")
    if order.size and (order.min() < 0 or order.max() >= n_rows):
        raise ValueError(f"cnn1d_train: order holds a row outside [0, {n_rows})")
    updates = torch.empty((k, dim), dtype=torch.float32)
    loss_sum = np.zeros(k, dtype=np.float64)
    status = lib.fedsim_cnn1d_train(
        _ptr(dims),
        _ptr(gw),
        _ptr(updates),
        _ptr(x_all),
        _ptr(y_all),
        _ptr(order),
        _ptr(offsets),
        _ptr(sizes),
        order.shape[0],
        n_rows,
        k,
        float(lr),
        float(momentum),
        _ptr(loss_sum),
        max(1, int(threads if threads is not None else torch.get_num_threads())),
    )
    if status == 3:
        raise ValueError(f"cnn1d_train: a label is outside [0, {int(dims[12])})")
    if status != 0:
        raise RuntimeError(f"cnn1d_train failed with status {status}")
    return updates, loss_sum
