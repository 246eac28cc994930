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
"""

from __future__ import annotations

import inspect
import numbers
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
    x = np.asarray(x)
    y = np.asarray(y)
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
