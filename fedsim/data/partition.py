"""Partition an in-memory labelled dataset across clients with ``flwr-datasets`` partitioners.

The arrays are wrapped once in a ``datasets.Dataset`` with two columns, ``label`` and ``row`` (the
row's index in the arrays); the partitioner assigns rows to partitions; each partition's ``row``
column becomes a NumPy index array. Nothing from Hugging Face survives the call: training code only
sees index arrays.

Dirichlet: ``min_partition_size`` defaults to a quarter of the mean client size (1..10). flwr
re-draws up to 10 times to meet it and then gives up; when the minimum is the default (not set by
the user), one unconstrained draw is taken instead and clients below the minimum are topped up with
random examples from the largest clients (``topped_up_clients`` in the settings). A minimum set by
the user is honoured strictly: failing to meet it is a ValueError naming it.

Rows are handed to the partitioner in a seeded random order, so every partitioner (including
``IidPartitioner``, which has no seed and cuts contiguous blocks) depends on the seed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from fedsim.data._validate import check_bool, check_choice, check_float, check_int, invalid
from fedsim.data.cache import cached

PARTITIONERS: tuple[str, ...] = ("iid", "dirichlet", "pathological", "shard")

#: options each partitioner accepts besides ``alpha`` (dirichlet) and the seed
PARTITIONER_OPTIONS: dict[str, tuple[str, ...]] = {
    "iid": (),
    "dirichlet": ("min_partition_size", "self_balancing"),
    "pathological": ("num_classes_per_partition", "class_assignment_mode"),
    "shard": ("num_shards_per_partition", "shard_size", "keep_incomplete_shard"),
}

CLASS_ASSIGNMENT_MODES: tuple[str, ...] = ("first-deterministic", "deterministic", "random")


def default_min_partition_size(num_rows: int, num_clients: int) -> int:
    """A quarter of the average client size, between 1 and 10 (digits, 100 clients: 4)."""
    return max(1, min(10, num_rows // (4 * num_clients)))


def cached_partition_rows(
    labels: np.ndarray, num_clients: int, partitioner: str, *, seed: int, alpha: float = 0.5, **options: Any
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """:func:`partition_rows` through the disk cache (:mod:`fedsim.data.cache`), keyed by the labels' digest, the
    arguments and the flwr-datasets version that partitions."""
    key = {
        "labels": hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest(),
        "num_clients": int(num_clients),
        "partitioner": partitioner,
        "seed": int(seed),
        "alpha": float(alpha),
        "options": options,
        "flwr-datasets": importlib.metadata.version("flwr-datasets"),
    }

    def build() -> dict[str, np.ndarray]:
        rows, settings = partition_rows(labels, num_clients, partitioner, seed=seed, alpha=alpha, **options)
        offsets = np.cumsum([0] + [r.size for r in rows])
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return {"rows": flat.astype(np.int64), "offsets": offsets, "settings": np.array(json.dumps(settings))}

    got = cached("partition", key, build)
    offsets, flat = got["offsets"], got["rows"]
    rows = [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    return rows, json.loads(str(got["settings"]))


def partition_rows(
    labels: np.ndarray,
    num_clients: int,
    partitioner: str,
    *,
    seed: int,
    alpha: float = 0.5,
    **options: Any,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Row indices of each client, and the resolved partitioner settings (for the summary).

    Raises ``ValueError`` naming the option for an unknown partitioner, an option the partitioner
    does not take, a bad value, or a configuration flwr-datasets cannot satisfy.
    """
    check_choice("partitioner", partitioner, PARTITIONERS)
    _check_option_names(partitioner, options)
    labels = _partition_labels(labels, partitioner)
    num_rows = int(labels.shape[0])
    if num_clients > num_rows:
        raise invalid("num_clients", num_clients, f"at most the number of examples ({num_rows})")

    part, resolved, fallback = _make_partitioner(
        partitioner, labels, num_clients, seed=seed, alpha=alpha, options=options
    )
    settings: dict[str, Any] = {"partitioner": partitioner, **resolved}

    from datasets import Dataset  # Hugging Face datasets: heavy, loaded when partitioning

    order = np.random.default_rng([seed, 0x9A27]).permutation(num_rows)
    table = Dataset.from_dict({"label": labels[order], "row": order.astype(np.int64)})
    try:
        try:
            rows = _assign(part, table, num_clients)
        except ValueError:
            if fallback is None:
                raise
            # flwr re-draws 10 times, then gives up (small alpha, many clients). With the default
            # minimum, take one unconstrained draw and top up the small clients instead.
            rows = _assign(fallback(), table, num_clients)
            rng = np.random.default_rng([seed, 0x70B])
            rows, moved = _top_up(rows, settings["min_partition_size"], rng)
            settings["topped_up_clients"] = moved
    except (ValueError, TypeError, AssertionError, IndexError) as err:
        raise ValueError(
            f"partitioner={partitioner!r} cannot split {num_rows} examples over num_clients={num_clients} "
            f"with {_describe(settings)}: {err}"
        ) from err

    empty = [cid for cid, r in enumerate(rows) if r.size == 0]
    if empty:
        raise ValueError(
            f"partitioner={partitioner!r} with {_describe(settings)} left {len(empty)} of "
            f"num_clients={num_clients} clients without data (e.g. client {empty[0]}); "
            "use fewer clients or a less extreme setting"
        )
    return rows, settings


def _check_option_names(partitioner: str, options: dict[str, Any]) -> None:
    """Refuse an option ``partitioner`` does not take (:data:`PARTITIONER_OPTIONS`), naming those it does."""
    allowed = PARTITIONER_OPTIONS[partitioner]
    for name in options:
        if name not in allowed:
            raise invalid(
                name,
                options[name],
                f"no value: partitioner={partitioner!r} takes "
                + (", ".join(allowed) if allowed else "no options"),
            )


def _partition_labels(labels: np.ndarray, partitioner: str) -> np.ndarray:
    """The labels to partition by: ``labels`` itself, or one dummy label per example for sequence targets
    (several labels per example), which only ``iid`` can split."""
    if labels.ndim <= 1:
        return labels
    if partitioner != "iid":
        raise invalid(
            "partitioner",
            partitioner,
            f"'iid', or clients given by the data function: the targets have shape {list(labels.shape)} "
            "(a sequence task), so there is no one label per example to partition by",
        )
    return np.zeros(int(labels.shape[0]), dtype=np.int64)


#: what the builders below return: the flwr-datasets partitioner, its settings as resolved (defaults filled
#: in, values checked), and a partitioner to fall back to when the first cannot meet its constraints (or None)
_Built = tuple[Any, dict[str, Any], Callable[[], Any] | None]


def _make_partitioner(
    partitioner: str,
    labels: np.ndarray,
    num_clients: int,
    *,
    seed: int,
    alpha: float,
    options: dict[str, Any],
) -> _Built:
    """The flwr-datasets partitioner ``partitioner`` names, built from the checked ``options``. Each builder
    imports flwr-datasets when it runs: a heavy import (datasets, pyarrow), only made when partitioning."""
    num_rows = int(labels.shape[0])
    if partitioner == "iid":
        from flwr_datasets.partitioner import IidPartitioner

        return IidPartitioner(num_partitions=num_clients), {}, None
    if partitioner == "dirichlet":
        return _dirichlet(num_rows, num_clients, seed=seed, alpha=alpha, options=options)
    if partitioner == "pathological":
        return _pathological(labels, num_clients, seed=seed, options=options)
    return _shard(num_rows, num_clients, seed=seed, options=options)


def _dirichlet(
    num_rows: int, num_clients: int, *, seed: int, alpha: float, options: dict[str, Any]
) -> _Built:
    """A Dirichlet(``alpha``) label split. With the default ``min_partition_size`` (not set by the user, and not
    0) the fallback is the same split with no minimum, whose small clients the caller tops up."""
    from flwr_datasets.partitioner import DirichletPartitioner

    alpha = check_float("alpha", alpha, low=0.0, low_open=True)
    auto_mps = options.get("min_partition_size") is None
    mps = default_min_partition_size(num_rows, num_clients) if auto_mps else options["min_partition_size"]
    mps = check_int("min_partition_size", mps, minimum=0, maximum=num_rows // num_clients)
    balancing = check_bool("self_balancing", options.get("self_balancing", False))

    def dirichlet(min_size: int) -> Any:
        return DirichletPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            alpha=alpha,
            min_partition_size=min_size,
            self_balancing=balancing,
            shuffle=True,
            seed=seed,
        )

    settings = {"alpha": alpha, "min_partition_size": mps, "self_balancing": balancing}
    return dirichlet(mps), settings, (lambda: dirichlet(0)) if auto_mps and mps != 0 else None


def _pathological(labels: np.ndarray, num_clients: int, *, seed: int, options: dict[str, Any]) -> _Built:
    """Each client holds ``num_classes_per_partition`` labels (2 by default), assigned by
    ``class_assignment_mode``."""
    from flwr_datasets.partitioner import PathologicalPartitioner

    num_labels = int(np.unique(labels).size)
    k = check_int(
        "num_classes_per_partition",
        options.get("num_classes_per_partition", 2),
        minimum=1,
        maximum=num_labels,
    )
    mode = check_choice(
        "class_assignment_mode",
        options.get("class_assignment_mode", "first-deterministic"),
        CLASS_ASSIGNMENT_MODES,
    )
    part = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=k,
        class_assignment_mode=mode,
        shuffle=True,
        seed=seed,
    )
    return part, {"num_classes_per_partition": k, "class_assignment_mode": mode}, None


def _shard(num_rows: int, num_clients: int, *, seed: int, options: dict[str, Any]) -> _Built:
    """Rows sorted by label and cut into shards, ``num_shards_per_partition`` of them per client (2 when neither
    it nor ``shard_size`` is given)."""
    from flwr_datasets.partitioner import ShardPartitioner

    shard_size = options.get("shard_size")
    per = options.get("num_shards_per_partition")
    if shard_size is None and per is None:
        per = 2
    if per is not None:
        per = check_int("num_shards_per_partition", per, minimum=1)
    if shard_size is not None:
        shard_size = check_int("shard_size", shard_size, minimum=1)
    keep = check_bool("keep_incomplete_shard", options.get("keep_incomplete_shard", False))
    if per is not None and per * num_clients > num_rows:
        raise invalid(
            "num_shards_per_partition",
            per,
            f"at most num_rows/num_clients = {num_rows // num_clients} (one example per shard)",
        )
    part = ShardPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_shards_per_partition=per,
        shard_size=shard_size,
        keep_incomplete_shard=keep,
        shuffle=True,
        seed=seed,
    )
    return (
        part,
        {"num_shards_per_partition": per, "shard_size": shard_size, "keep_incomplete_shard": keep},
        None,
    )


def _assign(part: Any, table: Any, num_clients: int) -> list[np.ndarray]:
    part.dataset = table
    with warnings.catch_warnings():
        # Dirichlet warns on every re-draw that misses min_partition_size; the final failure raises.
        warnings.filterwarnings("ignore", message=r"The specified min_partition_size")
        # ShardPartitioner's Dataset.sort trips a pyarrow deprecation warning (not ours to fix)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyarrow\..*")
        return [
            # [:] reads the column as one batch (datasets >= 4 iterates a bare column row by row)
            np.asarray(part.load_partition(i).with_format("numpy")[:]["row"], dtype=np.int64)
            for i in range(num_clients)
        ]


def _top_up(rows: list[np.ndarray], minimum: int, rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """Move random examples from the largest clients to clients below ``minimum`` examples.

    Returns the new row lists and how many clients were topped up. Label skew is kept where it
    matters (the donors are the big clients; a small client gets a few extra examples).
    """
    rows = [r.copy() for r in rows]
    short = [c for c, r in enumerate(rows) if r.size < minimum]
    for c in short:
        while rows[c].size < minimum:
            donor = max(range(len(rows)), key=lambda k: (rows[k].size, -k))
            take = rng.integers(rows[donor].size)
            rows[c] = np.append(rows[c], rows[donor][take])
            rows[donor] = np.delete(rows[donor], take)
    return rows, len(short)


def _describe(settings: dict[str, Any]) -> str:
    items = [f"{k}={v!r}" for k, v in settings.items() if k != "partitioner"]
    return ", ".join(items) if items else "default settings"
