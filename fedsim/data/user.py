"""A user's federated dataset: ``[data] dataset = "package.module:function"`` (or a callable in the API).

The function is called with the keywords it accepts among ``num_clients`` and ``seed``, plus the scenario's
``[data.options]`` table, and returns one of:

* a ready :class:`~fedsim.data.FederatedData` (its own held-out clients and domains), used as it is;
* arrays and per-client indices: a mapping ``{"x": ..., "y": ..., "clients": [...], "num_classes": ...}`` or a
  tuple ``(x, y, clients)``. ``x`` is ``[n, *input_shape]`` (``[n, d]`` features or ``[n, C, H, W]`` images),
  ``y`` integer labels ``[n]`` or, for a sequence task, integer targets ``[n, *T]`` (``-100``,
  :data:`~fedsim.factories.IGNORE_INDEX`, marks a padding target that is not scored), ``clients`` one index array
  into ``x`` per client (``num_clients`` of them); ``num_classes`` defaults to ``max(y) + 1``;
* arrays alone, ``{"x", "y"}`` or ``(x, y)``: the scenario's partitioner (flwr-datasets) splits them.

fedsim then draws the held-out clients and domains as for the shipped datasets. The function must return the
same data for the same arguments: Flower's workers, each SuperNode and the server call it in their own processes.
The Ray engine's workers get the driver's data and check it (:func:`data_fingerprint`): a ``FederatedData`` whose
clients' data is not a function of what it holds (drawn afresh, or read from files that differ between nodes) is
refused there, naming the data function.
"""

from __future__ import annotations

import hashlib
import inspect
import numbers
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedsim.data.base import ArrayDataset
from fedsim.factories import IGNORE_INDEX, check_annotated, describe, resolve


def call_data_function(spec: Any, num_clients: int, seed: int, options: dict[str, Any]) -> Any:
    """Call the user's data function with what it accepts (see the module docstring)."""
    fn = resolve(spec, "data.dataset")
    try:
        params = inspect.signature(fn).parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        params, var_kw = {}, True
    kwargs = {k: v for k, v in (("num_clients", num_clients), ("seed", seed)) if var_kw or k in params}
    for key in options:
        if not var_kw and key not in params:
            takes = ", ".join(n for n in params if n not in ("num_clients", "seed")) or "no options"
            raise ValueError(
                f"invalid data.options.{key}: the data function {describe(spec)!r} takes {takes}"
            )
    check_annotated(fn, options, "data.options")
    try:
        return fn(**kwargs, **options)
    except Exception as exc:  # the user's function refused these options (or ran out of memory on them)
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise ValueError(
            f"the data function {describe(spec)!r} failed for num_clients={num_clients}, seed={seed} and "
            f"{given}: {type(exc).__name__}: {str(exc)[:300]}"
        ) from None


def arrays_from_result(
    result: Any, name: str, num_clients: int
) -> tuple[ArrayDataset, list[np.ndarray] | None]:
    """The arrays (and per-client rows, when given) a data function returned, checked."""
    where = f"the data function {name!r}"
    if isinstance(result, Mapping):
        unknown = set(result) - {"x", "y", "clients", "num_classes"}
        if unknown or "x" not in result or "y" not in result:
            raise ValueError(
                f"{where} returned a mapping with keys {sorted(result)}: allowed 'x', 'y' and optionally "
                "'clients' and 'num_classes'"
            )
        x, y, clients, num_classes = (
            result["x"],
            result["y"],
            result.get("clients"),
            result.get("num_classes"),
        )
    elif isinstance(result, tuple) and len(result) in (2, 3):
        x, y = result[0], result[1]
        clients, num_classes = (result[2] if len(result) == 3 else None), None
    else:
        raise ValueError(
            f"{where} returned {type(result).__name__}: allowed a FederatedData, a mapping with 'x', 'y' "
            "(and 'clients'), or a tuple (x, y) or (x, y, clients)"
        )
    x = _stacked(x, "x", where, clients)
    y = _stacked(y, "y", where, clients)
    if x.ndim < 2 or not np.issubdtype(x.dtype, np.number):
        raise ValueError(
            f"{where}: x has shape {x.shape} and dtype {x.dtype}: allowed numbers [n, *input_shape]"
        )
    if y.ndim < 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"{where}: y has shape {y.shape} and dtype {y.dtype}: allowed integer labels [n] or integer sequence "
            f"targets [n, *T], one per row of x ({x.shape[0]})"
        )
    # token ids and other integer inputs stay integers (an nn.Embedding needs them); anything else is float32
    x = np.ascontiguousarray(x, dtype=np.int64 if np.issubdtype(x.dtype, np.integer) else np.float32)
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: x holds NaN or infinite values")
    scored = y[y != IGNORE_INDEX]
    if scored.size and scored.min() < 0:
        raise ValueError(
            f"{where}: y holds negative labels ({int(scored.min())}): allowed 0 .. num_classes - 1, and "
            f"{IGNORE_INDEX} for a target that is not scored (padding)"
        )
    classes = int(scored.max()) + 1 if scored.size else 1
    if num_classes is None:
        num_classes = classes
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, numbers.Integral)
        or num_classes < classes
    ):
        raise ValueError(f"{where}: num_classes={num_classes!r}, but y holds labels up to {classes - 1}")
    y = np.ascontiguousarray(y, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    base = ArrayDataset(name, x, y, max(2, int(num_classes)))
    if clients is None:
        return base, None
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence) or len(clients) != num_clients:
        got = len(clients) if isinstance(clients, Sequence) else type(clients).__name__
        raise ValueError(
            f"{where}: 'clients' must hold one index array per client ({num_clients}), got {got}"
        )
    rows = []
    for i, c in enumerate(clients):
        r = np.asarray(c)
        if r.ndim != 1 or (
            r.size and (not np.issubdtype(r.dtype, np.integer) or r.min() < 0 or r.max() >= len(y))
        ):
            raise ValueError(f"{where}: clients[{i}] must be integer indices into x in [0, {len(y) - 1}]")
        rows.append(r.astype(np.int64))
    return base, rows


def _stacked(value: Any, field: str, where: str, clients: Any) -> np.ndarray:
    """``np.asarray(value)``; for a list of arrays of different shapes (a ragged ``x`` or ``y``, which numpy refuses
    with its "inhomogeneous shape"), a ValueError naming the field, the first example whose shape differs, the
    client it belongs to and the shapes found."""
    try:
        return np.asarray(value)
    except ValueError:
        if isinstance(value, np.ndarray) or not isinstance(value, Sequence):
            raise
    shapes = [_shape_of(v) for v in value]
    first = shapes[0] if shapes else None
    odd = next((i for i, s in enumerate(shapes) if s != first), None)
    if odd is None:  # every item has one shape: numpy's complaint is about something deeper; say it as it is
        raise ValueError(
            f"{where}: {field} cannot be made one array ({np.asarray(value, dtype=object).shape})"
        )
    counts = Counter(str(s) if s is not None else "ragged itself" for s in shapes)
    found = ", ".join(f"{s} x {n}" for s, n in counts.most_common(4))
    more = f" and {len(counts) - 4} more" if len(counts) > 4 else ""
    owner = _client_of(odd, clients)
    held = f" (an example of client {owner})" if owner is not None else ""
    raise ValueError(
        f"{where}: {field} is a list of {len(shapes)} arrays of different shapes: {field}[0] has shape "
        f"{_describe_shape(first)}, {field}[{odd}]{held} has {_describe_shape(shapes[odd])}; shapes found: "
        f"{found}{more}. Allowed: one array {field} of shape [n, *{'input_shape' if field == 'x' else 'T'}], every "
        "example the same shape: pad sequences to one length (padding targets -100, which is not scored) or cut "
        "them into windows; per-client arrays go into one x, with 'clients' holding each client's row indices"
    )


def _shape_of(item: Any) -> tuple[int, ...] | None:
    """``np.shape(item)``, or None when the item is ragged itself."""
    try:
        return tuple(np.shape(item))
    except ValueError:
        return None


def _describe_shape(shape: tuple[int, ...] | None) -> str:
    return "ragged itself" if shape is None else str(shape)


def _client_of(row: int, clients: Any) -> int | None:
    """The client whose index array holds ``row`` (the first), when the function gave ``clients``."""
    if clients is None or isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        return None
    for i, c in enumerate(clients):
        try:
            if row in np.asarray(c).ravel().tolist():
                return i
        except (TypeError, ValueError):
            continue
    return None


#: the clients whose data :func:`data_fingerprint` hashes: the first few training and held-out clients, the last
FINGERPRINT_CLIENTS = 3


def data_fingerprint(data: Any, clients: int = FINGERPRINT_CLIENTS) -> dict[str, Any]:
    """What a process loaded, in brief, to compare with another process's: the population's sizes, the clients
    hashed (the first ``clients`` training and held-out clients and the last client) and a SHA-256 of their
    examples and targets (shapes, dtypes and bytes) and of every client's size. Two processes holding the same
    data give the same fingerprint; a ``FederatedData`` whose clients' data differs between calls does not."""
    n = int(data.num_clients)
    train = [int(c) for c in np.asarray(data.train_clients)[:clients]]
    held = [int(c) for c in np.asarray(data.heldout_clients)[:clients]]
    ids = sorted({*train, *held, n - 1})
    h = hashlib.sha256()
    sizes = np.ascontiguousarray(data.num_examples_array(np.arange(n)), dtype=np.int64)
    h.update(sizes.tobytes())
    for cid in ids:
        for a in data.client_data(cid):
            a = np.ascontiguousarray(a)
            h.update(f"{cid}:{a.dtype.str}:{a.shape}".encode())
            h.update(a.tobytes())
    return {
        "num_clients": n,
        "num_examples": int(sizes.sum()),
        "clients": ids,
        "sha256": h.hexdigest(),
    }
