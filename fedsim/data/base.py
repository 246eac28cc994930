"""Base (centralised) datasets held as in-memory arrays: scikit-learn digits and MNIST-1D.

Nothing here touches the network. Both loaders are cached per process, so building several
federations from the same base data (a sweep, a Ray worker) generates the data once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np

from fedsim.data._validate import check_int
from fedsim.data.cache import cached_arrays

MNIST1D_DEFAULT_SAMPLES = 4000
MNIST1D_DATA_SEED = 42  # the generator seed of mnist1d's default arguments (the published dataset)


@dataclass(frozen=True)
class ArrayDataset:
    """A labelled dataset in memory: ``x`` float32 ``[n, *input_shape]`` (``[n, d]`` for features,
    ``[n, C, H, W]`` for images), ``y`` int64 [n]."""

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.x.shape[1:])

    @property
    def input_dim(self) -> int:
        return int(np.prod(self.input_shape))

    def __len__(self) -> int:
        return int(self.y.shape[0])


@functools.lru_cache(maxsize=2)
def load_digits_arrays() -> ArrayDataset:
    """scikit-learn's 8x8 digits (ships inside the wheel) as 1x8x8 images: 1797 x 1 x 8 x 8 float32 in [0, 1],
    10 classes. Models that take flat features flatten them (the shipped ``mlp`` and ``cnn1d`` do)."""
    from sklearn.datasets import (
        load_digits,  # an optional, heavy dependency: loaded for the dataset that needs it
    )

    bunch = load_digits()
    x = np.ascontiguousarray(bunch.data, dtype=np.float32).reshape(-1, 1, 8, 8) / np.float32(16.0)
    y = np.ascontiguousarray(bunch.target, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return ArrayDataset("digits", x, y, 10)


@functools.lru_cache(maxsize=4)
def make_mnist1d_arrays(num_samples: int = MNIST1D_DEFAULT_SAMPLES) -> ArrayDataset:
    """MNIST-1D generated locally with ``mnist1d.data.make_dataset`` and its default arguments.

    Only ``num_samples`` is changed. The library's own train/test split is concatenated back into
    one pool (held-out *clients* are the test set here). ``make_dataset`` seeds NumPy's and
    Python's global generators; their states are restored afterwards so callers are unaffected. The arrays are
    cached on disk (:mod:`fedsim.data.cache`), so the same data is generated once per machine.
    """
    num_samples = check_int("num_samples", num_samples, minimum=10)
    from mnist1d.data import (  # an optional, heavy dependency: loaded for the dataset that needs it
        get_dataset_args,
        make_dataset,
    )

    args = get_dataset_args()
    args.num_samples = num_samples

    def generate() -> tuple[np.ndarray, np.ndarray]:
        np_state = np.random.get_state()
        py_state = random.getstate()
        try:
            data = make_dataset(args)
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
        x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
        y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
        return x, y

    # keyed by every argument of the generator and its version: generating 55,000 examples takes about 20 s
    key = {"args": dict(sorted(vars(args).items())), "mnist1d": importlib.metadata.version("mnist1d")}
    x, y = cached_arrays("mnist1d", key, generate)
    return ArrayDataset("mnist1d", x, y, 10)


HUB_PREFIX = "hf:"
_LABEL_COLUMNS = ("label", "labels", "fine_label", "target", "y")
_FEATURE_COLUMNS = ("image", "img", "pixel_values", "features", "x")


def load_hub_arrays(
    repo: str,
    split: str = "train",
    feature_column: str | None = None,
    label_column: str | None = None,
) -> ArrayDataset:
    """A Hugging Face dataset (``repo`` id, or a local folder of data files) as in-memory arrays.

    Images keep their shape as ``[n, C, H, W]`` (a grey-scale ``[n, H, W]`` gets one channel) and are scaled
    to [0, 1] (uint8 / 255); other numeric features are cast to float32. Without a network, or with ``HF_HUB_OFFLINE=1``, a dataset missing from the local cache
    raises a ``ValueError`` that says so.
    """
    import datasets  # an optional, heavy dependency: loaded for the dataset that needs it

    name = f"{HUB_PREFIX}{repo}"
    try:
        if os.path.exists(repo) or _hub_reachable():
            ds = datasets.load_dataset(repo, split=split)
        else:  # skip the minute of retries: go straight to the local cache
            with _offline_mode():
                ds = datasets.load_dataset(repo, split=split)
    except (ConnectionError, OSError, FileNotFoundError) as err:
        raise ValueError(
            f"dataset={name!r} needs the Hugging Face Hub, which cannot be reached from here and the "
            f"dataset is not in the local cache ({type(err).__name__}: {err}). Offline, use one of "
            "'digits', 'mnist1d', 'synthetic', 'shakespeare', or run once online to fill the cache."
        ) from err
    except ValueError as err:  # e.g. an unknown split
        raise ValueError(f"dataset={name!r} with hub_split={split!r} cannot be loaded: {err}") from err
    if isinstance(ds, datasets.DatasetDict):  # pragma: no cover - split is always given
        raise ValueError(f"dataset={name!r}: hub_split={split!r} did not select one split")
    columns = list(ds.column_names)
    label = label_column or next((c for c in _LABEL_COLUMNS if c in columns), None)
    if label is None or label not in columns:
        raise ValueError(f"invalid hub_label={label_column!r}: allowed one of the columns {columns}")
    feature = feature_column or next((c for c in _FEATURE_COLUMNS if c in columns), None)
    table = ds.with_format("numpy")
    if feature is not None:
        if feature not in columns:
            raise ValueError(f"invalid hub_feature={feature_column!r}: allowed one of the columns {columns}")
        raw = np.stack([np.asarray(v) for v in table[feature]])
        if isinstance(ds.features.get(feature), datasets.Image) and raw.ndim in (3, 4):
            x = raw[:, None] if raw.ndim == 3 else raw.transpose(0, 3, 1, 2)  # channels first, as torch's
        else:
            x = raw.reshape(raw.shape[0], -1)
    else:  # tabular: every other numeric column is a feature
        cols = [c for c in columns if c != label and np.issubdtype(np.asarray(table[c]).dtype, np.number)]
        if not cols:
            raise ValueError(f"dataset={name!r}: no numeric feature columns besides {label!r} in {columns}")
        raw = np.stack([np.asarray(table[c]) for c in cols], axis=1)
        x = raw
    pixels = isinstance(ds.features.get(feature), datasets.Image) or (
        np.issubdtype(raw.dtype, np.integer) and raw.size > 0 and raw.min() >= 0 and 1 < raw.max() <= 255
    )
    x = x.astype(np.float32) / (np.float32(255.0) if pixels else np.float32(1.0))
    y_raw = np.asarray(table[label])
    feat = ds.features[label]
    if isinstance(feat, datasets.ClassLabel):
        y, num_classes = y_raw.astype(np.int64), int(feat.num_classes)
    else:
        classes, y = np.unique(y_raw, return_inverse=True)
        y, num_classes = y.astype(np.int64), int(classes.size)
    x = np.ascontiguousarray(x)
    x.setflags(write=False)
    y.setflags(write=False)
    return ArrayDataset(name, x, y, num_classes)


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hub's host answers a TCP connection (False at once in offline mode)."""
    from huggingface_hub import (
        constants,  # an optional, heavy dependency: loaded for the dataset that needs it
    )

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline_mode() -> Iterator[None]:
    """Hugging Face offline mode for one call (the libraries read their flags at import time)."""
    import datasets.config  # an optional, heavy dependency: loaded for the dataset that needs it
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved
