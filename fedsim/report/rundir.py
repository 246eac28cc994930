"""The run directory: resolved config, one JSON row per round, the ledger, the summary, the partition.

Rows are appended and flushed as each round ends, so an interrupted run keeps every finished round.

Every JSON file written here is strict JSON (no ``NaN``/``Infinity`` tokens, :func:`json_safe`): a value that is
not a number (undefined) is ``null``; an infinite one (an epsilon no accountant can bound at that delta) is
``null`` with ``"<key>_reason": "infinite"`` beside it, so a reader can tell "unbounded" from "undefined".
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from fedsim.labels import INFINITE, NON_PRIVATE, REASON_SUFFIX  # defined here before: importable from here

from .provenance import provenance

log = logging.getLogger(__name__)


#: what ``data.json`` keeps at its top level: the scenario's settings, public sizes (population, domains, held-out
#: clients) and what the seed alone draws. Every other key of the partition's description (exact statistics of the
#: clients' data, and any key added later until it is listed here) goes under ``non_private``.
DATA_PUBLIC_KEYS = frozenset(
    {
        "dataset",
        "num_clients",
        "num_train_clients",
        "num_heldout_clients",
        "heldout_fraction",
        "seed",
        "input_shape",
        "input_dim",
        "target_shape",
        "targets",
        "num_classes",
        "num_domains",
        "domain_sizes",
        "heldout_per_domain",
        "max_label_entropy",
        "partitioner",
        "alpha",
        "min_partition_size",
        "self_balancing",
        "num_classes_per_partition",
        "class_assignment_mode",
        "num_shards_per_partition",
        "shard_size",
        "keep_incomplete_shard",
        "domain_shift",
        "domain_noise",
        "domain_label_swaps",
        "domain_label_maps",
        "synthetic_alpha",
        "synthetic_beta",
        "synthetic_iid",
        "synthetic_min_samples",
        "synthetic_max_samples",
        "data_function",
        "hub_split",
        "num_samples",
    }
)
DATA_FILE = "data.json"
#: the final model as a flat float64 vector (``np.load(path)["weights"]``), in the order of ``module.parameters()``
MODEL_NPZ = "model.npz"
#: the final model as a PyTorch ``state_dict`` of the scenario's model (:func:`fedsim.load_model` rebuilds it)
MODEL_PT = "model.pt"
DATA_NOTE = (
    "exact statistics of the clients' data (the partition: examples per client, label entropy, totals); "
    "epsilon does not cover them"
)
#: the run's log: what libraries said while the run trained and evaluated (:class:`TorchWarnings`), one entry a line
RUN_LOG = "run.log"


def flatten_tables(data: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """The leaves of nested tables (a config, a row) keyed by their path joined with ``sep``
    (``{"privacy": {"clip": 1.0}}`` -> ``{"privacy.clip": 1.0}``); an empty table has no leaf."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        else:
            out[prefix] = value

    for key, value in data.items():
        walk(str(key), value)
    return out


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON: numpy scalars and arrays as Python numbers and lists; NaN as null; +-inf as null
    with ``"<key>_reason": "infinite"`` (``"-infinite"``) beside it in its object. An element of a list has no
    place for a reason: it is null (where a list holds per-round values, a ``status`` list beside it says why)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            v = _scalar(v)
            if isinstance(v, float) and math.isinf(v):
                out[key] = None
                out.setdefault(key + REASON_SUFFIX, INFINITE if v > 0 else "-" + INFINITE)
            else:
                out[key] = json_safe(v)
        return out
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    value = _scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _scalar(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    return value


def data_description(describe: dict[str, Any]) -> dict[str, Any]:
    """``data.json``: a partition's description (``FederatedData.describe()``) with everything that is not a
    public setting (:data:`DATA_PUBLIC_KEYS`) moved under ``non_private``, which says what it is (``note``).
    A description already in this form is returned as it is."""
    if isinstance(describe.get(NON_PRIVATE), dict) and "note" in describe[NON_PRIVATE]:
        return describe
    public = {k: v for k, v in describe.items() if k in DATA_PUBLIC_KEYS}
    exact = {k: v for k, v in describe.items() if k not in DATA_PUBLIC_KEYS}
    return {**public, NON_PRIVATE: {"note": DATA_NOTE, **exact}}


def _row_line(row: dict[str, Any]) -> str:
    """One row of ``metrics.jsonl``."""
    return json.dumps(json_safe(row), allow_nan=False) + "\n"


def check_out(out: str | Path) -> Path:
    """``out`` as a path that can become a run directory: not a file, not a folder that already holds a run."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file; give a folder for the run directory")
    metrics = path / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:  # an empty one is a run that failed to start
        raise ValueError(f"--out {path} already holds a run (metrics.jsonl); choose another folder")
    return path


def new_run_dir(name: str, out: str | Path | None, root: str | Path = "runs") -> Path:
    """``out`` if given (it must not already hold a run), else a fresh ``runs/<timestamp>-<name>``."""
    if out is not None:
        path = check_out(out)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{name}"
    path, i = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{i}")
        i += 1
    path.mkdir(parents=True)
    return path


def model_shape(run_dir: str | Path) -> tuple[tuple[int, ...], int] | None:
    """``(input_shape, num_classes)`` from the run's ``data.json`` (public keys), or None where it does not say."""
    try:
        data = json.loads((Path(run_dir) / DATA_FILE).read_text())
        shape, classes = data["input_shape"], data["num_classes"]
        return tuple(int(n) for n in shape), int(classes)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_flat_weights(module: Any, weights: Any) -> Any:
    """Copy the flat vector ``weights`` into ``module``'s parameters, in the order of ``module.parameters()``: the
    order in which the trainers flatten and load the global model (:class:`fedsim.training.trainer.ClientTrainer`).
    Returns ``module``."""
    import torch

    from fedsim.training.trainer import copy_flat  # the trainers' own order

    params = list(module.parameters())
    flat = torch.as_tensor(np.asarray(weights))
    size = sum(p.numel() for p in params)
    if flat.ndim != 1 or flat.numel() != size:
        raise ValueError(
            f"the weights hold {flat.numel()} values (shape {tuple(flat.shape)}), the model {size} parameters"
        )
    copy_flat(params, flat)
    return module


def build_module(factory: Callable[[], Any], weights: Any = None) -> Any:
    """``factory()`` (a model built as the run built it) with ``weights`` (flat) copied in; PyTorch's global random
    state is left as it was (model factories seed it)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        module = factory()
    return module if weights is None else load_flat_weights(module, weights)


class RunWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._metrics = open(path / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        config = path / "config.toml"
        #: the run's config.toml as written (checkpoints carry its digest)
        self.config_toml: str | None = config.read_text() if config.is_file() else None
        #: builds the run's model (untrained) so that the final model is also written as ``model.pt``
        #: (:meth:`write_weights`); set by the runner, None: ``model.npz`` only
        self.model_factory: Callable[[], Any] | None = None

    def begin(self, config_toml: str) -> None:
        """What a run directory holds before its first round: ``provenance.json`` (the code and library
        versions that ran) and ``config.toml`` (the resolved scenario)."""
        self.write_json("provenance.json", provenance())
        self.write_text("config.toml", config_toml)
        self.config_toml = config_toml

    def write_json(self, name: str, obj: Any) -> Path:
        if name == DATA_FILE and isinstance(obj, dict):  # whoever writes the partition, it is labelled
            obj = data_description(obj)
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(json_safe(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")
        tmp.replace(target)
        return target

    def write_data(self, describe: dict[str, Any]) -> Path:
        """``data.json`` from the partition's description (:func:`data_description`)."""
        return self.write_json(DATA_FILE, data_description(describe))

    def write_plots(self) -> list[Path]:
        """``plots/*.png`` from what is written (:func:`fedsim.report.plots.run_plots`). A plot that fails is logged
        and skipped: it must never cost a run its results."""
        from .plots import run_plots  # matplotlib only when plots are drawn

        try:
            return run_plots(self.path, from_ledger=False)
        except Exception as exc:
            log.warning(
                "plots for %s were not drawn: %s: %s (fedsim report %s draws them again)",
                self.path,
                type(exc).__name__,
                exc,
                self.path,
            )
            return []

    def write_weights(self, name: str, weights: Any) -> Path:
        """The model as a flat float64 vector (``np.load(path)["weights"]``), written atomically. The final model
        (``model.npz``) is also written as ``model.pt``, a PyTorch ``state_dict`` (:meth:`write_state_dict`), when
        :attr:`model_factory` is set."""
        target = self.path / name
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, weights=np.asarray(weights, dtype=np.float64))
        tmp.replace(target)
        if name == MODEL_NPZ and self.model_factory is not None:
            try:  # model.npz is written: a failure here must never cost the run its results
                self.write_state_dict(MODEL_PT, weights)
            except Exception as exc:
                log.warning(
                    "%s was not written (%s: %s); %s holds the final model",
                    self.path / MODEL_PT,
                    type(exc).__name__,
                    exc,
                    target,
                )
        return target

    def write_state_dict(self, name: str, weights: Any) -> Path:
        """``torch.save(model.state_dict())`` of the run's model (:attr:`model_factory`) holding ``weights``,
        written atomically."""
        import torch

        if self.model_factory is None:
            raise ValueError("no model factory: the run's model cannot be rebuilt here")
        module = build_module(self.model_factory, weights)
        target = self.path / name
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save(module.state_dict(), f)
        tmp.replace(target)
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        target.write_text(text)
        return target

    def append_row(self, row: dict[str, Any]) -> None:
        self._metrics.write(_row_line(row))
        self._metrics.flush()

    def replace_rows(self, rows: list[dict[str, Any]]) -> None:
        """Make ``metrics.jsonl`` exactly ``rows`` (atomically: a resumed run drops the rows after its
        checkpoint); later rows are appended after them."""
        self._metrics.close()
        target = self.path / "metrics.jsonl"
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("".join(_row_line(r) for r in rows), encoding="utf-8")
        tmp.replace(target)
        self._metrics = open(target, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()


def append_run_log(run_dir: str | Path, text: str) -> Path:
    """Append ``text`` to the run's log (``<run_dir>/run.log``, :data:`RUN_LOG`) as one line stamped with the UTC
    time; the file is created by the first line."""
    target = Path(run_dir) / RUN_LOG
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(target, "a", encoding="utf-8") as f:
        f.write(f"{stamp} {' '.join(str(text).splitlines())}\n")
    return target


class TorchWarnings:
    """While open, the warnings torch raises go to the run's log (:func:`append_run_log`) instead of the
    console, counted; on leaving, one line on the console says how many there were and where they are.

    A warning is torch's when the code it is attributed to is in the torch package, or it comes from torch's C++
    operators (their text ends "Triggered internally at ..."): the batching rules vmap lacks, for instance, which
    say the same thing for every run. Every other warning (fedsim's own, the user's code, other libraries) is shown
    as it would have been. Python's filters apply as before: a warning they ignore, or have shown once already, is
    not counted again.

    The run directory may come later than the first warnings (the checks that run before it exists probe the
    training paths): until :meth:`attach` gives it, they are kept, then written; with none by the end they are
    shown as they would have been. ``capture=False`` changes nothing (a run that writes no directory)."""

    def __init__(self, run_dir: str | Path | None = None, *, capture: bool = True) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.capture = capture
        self.count = 0
        self._shown: Any = None
        self._pending: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    @staticmethod
    def is_torch(message: Warning | str, filename: str) -> bool:
        import torch  # the engines have it loaded already

        root = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        return os.path.abspath(filename).startswith(root) or "Triggered internally at" in str(message)

    def __enter__(self) -> TorchWarnings:
        if self.capture:
            self._shown = warnings.showwarning
            warnings.showwarning = self._show
        return self

    def attach(self, run_dir: str | Path | None) -> None:
        """The run directory, now that it exists: what was kept so far is written to its log."""
        with self._lock:
            self.run_dir = None if run_dir is None else Path(run_dir)
            pending, self._pending = self._pending, []
        for args in pending:
            self._record(*args)

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if not self.is_torch(message, filename):
            self._shown(message, category, filename, lineno, file, line)
            return
        with self._lock:
            self.count += 1
            if self.run_dir is None:
                self._pending.append((message, category, filename, lineno, file, line))
                return
        self._record(message, category, filename, lineno, file, line)

    def _record(self, message: Any, category: Any, filename: str, lineno: int, file: Any, line: Any) -> None:
        try:
            append_run_log(self.run_dir, f"{category.__name__} from torch ({filename}:{lineno}): {message}")
        except OSError:  # the log cannot be written: the warning is shown as it would have been
            self._shown(message, category, filename, lineno, file, line)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._shown is None:
            return
        shown, self._shown = self._shown, None
        if warnings.showwarning == self._show:  # not replaced since by someone else
            warnings.showwarning = shown
        if self.run_dir is None:  # no run directory came: nowhere to keep them
            for args in self._pending:
                shown(*args)
            self._pending = []
        elif self.count:
            log.warning(
                "%d warning%s from torch, see %s",
                self.count,
                "" if self.count == 1 else "s",
                self.run_dir / RUN_LOG,
            )


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    with open(Path(path) / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
