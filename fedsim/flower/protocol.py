"""The messages between fedsim's server side and its ClientApp: the keys, and how a round is written and read.

A train message carries the global model (one ArrayRecord) and a ConfigRecord:

===============================  ================================================================
key                              meaning
===============================  ================================================================
``server-round``                 the round
``fedsim.clip``                  the clip of this round (adaptive clipping changes it)
``fedsim.noise-share-std``       distributed noise: the std of the share each client adds (at least the node's own floor)
``fedsim.count-noise-share-std`` distributed noise with adaptive clipping: the share on the bit
``fedsim.loss-bound``            agnostic FL: report the loss of the global model, bounded by this
``fedsim.encoding.<key>``        a mechanism whose clients encode (ddgauss, skellam): the round's public encoding
                                 (``kind``, ``bits``, ``beta``, ``scale``, ``dim``, ``local_std_grid``,
                                 ``rotation_seed``)
===============================  ================================================================

A reply carries the client's model (``global + update``, the same keys, shapes and dtypes) and, where asked, a
MetricRecord with ``fedsim.loss`` (agnostic FL, in [0, 1]) or ``fedsim.unclipped-noised`` (the client's
noised unclipped bit). Nothing else: no norm, no number of examples. A client that encodes replies instead with
one array, ``fedsim.encoded`` (int64, the encoding's ``dim`` values in ``[0, 2^bits)``): what a secure sum adds.

This module imports nothing of fedsim's (the strategies and the apps both use it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

CFG_ROUND = "server-round"
CFG_CLIP = "fedsim.clip"
CFG_NOISE_STD = "fedsim.noise-share-std"
CFG_COUNT_NOISE_STD = "fedsim.count-noise-share-std"
CFG_LOSS_BOUND = "fedsim.loss-bound"
MET_UNCLIPPED_NOISED = (
    "fedsim.unclipped-noised"  # distributed noise: the unclipped bit plus the client's share
)
CFG_ENCODING = "fedsim.encoding."  # a prefix: one key per public encoding parameter
ENCODED = "fedsim.encoded"  # the reply's array of a client that encodes
MET_LOSS = (
    "fedsim.loss"  # agnostic FL: the client's loss of the global model, per example bounded, over the bound
)


def train_config(plan: Any, base: ConfigRecord | None = None, size: int | None = None) -> ConfigRecord:
    """The ConfigRecord of round ``plan.round``'s train messages (``base``: the caller's own keys; ``size``: the
    model's, for a plan whose clients encode)."""
    config = ConfigRecord(dict(base or {}))
    if getattr(plan, "encodes", False):
        if size is None:
            raise ValueError("a round whose clients encode needs the model's size for its encoding")
        for key, value in plan.encoding_for(int(size)).items():
            config[CFG_ENCODING + key] = value
    config[CFG_ROUND] = int(plan.round)
    config[CFG_CLIP] = float(plan.clip)
    if plan.noise_share_std > 0:
        config[CFG_NOISE_STD] = float(plan.noise_share_std)
    if plan.count_share_std > 0:
        config[CFG_COUNT_NOISE_STD] = float(plan.count_share_std)
    if plan.loss_bound is not None:
        config[CFG_LOSS_BOUND] = float(plan.loss_bound)
    return config


def train_messages(plan: Any, arrays: ArrayRecord, base: ConfigRecord | None = None) -> list[Message]:
    """One train message per sampled client (``dst_node_id`` = the client id; a ClientIdGrid maps it)."""
    size = sum(int(a.numpy().size) for a in arrays.values()) if getattr(plan, "encodes", False) else None
    record = RecordDict({"arrays": arrays, "config": train_config(plan, base, size)})
    return [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=int(c)) for c in plan.cohort]


def to_arrays(flat: np.ndarray, like: ArrayRecord) -> ArrayRecord:
    """``flat`` as an ArrayRecord with the keys, shapes and dtypes of ``like``."""
    out, i = {}, 0
    for key, arr in like.items():
        a = arr.numpy()
        n = a.size
        out[key] = Array(np.ascontiguousarray(np.asarray(flat[i : i + n]).reshape(a.shape).astype(a.dtype)))
        i += n
    if i != len(flat):
        raise ValueError(f"a model of {len(flat)} values does not match arrays of {i} values")
    return ArrayRecord(array_dict=out)


def flat_arrays(arrays: ArrayRecord) -> np.ndarray:
    """An ArrayRecord as one float64 vector (the order of its keys)."""
    parts = [np.asarray(a, dtype=np.float64).ravel() for a in arrays.to_numpy_ndarrays()]
    return np.concatenate(parts) if parts else np.zeros(0)


def reply_model(msg: Message, like: ArrayRecord) -> np.ndarray | None:
    """The flat model in a reply, or None if the reply is an error or does not match ``like`` key for key,
    shape for shape, dtype for dtype."""
    if msg.has_error():
        return None
    records = list(msg.content.array_records.values())
    if len(records) != 1:
        return None
    rec = records[0]
    if list(rec.keys()) != list(like.keys()):
        return None
    try:
        got = rec.to_numpy_ndarrays()
    except Exception:
        return None
    for g, w in zip(got, like.to_numpy_ndarrays(), strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return None
    parts = [np.asarray(a, dtype=np.float64).ravel() for a in got]
    return np.concatenate(parts) if parts else np.zeros(0)


def encoding_of(config: Any) -> dict[str, Any] | None:
    """The public encoding a train message's ``config`` carries (None: the round's clients do not encode)."""
    out = {k[len(CFG_ENCODING) :]: v for k, v in config.items() if str(k).startswith(CFG_ENCODING)}
    return out or None


def encoded_reply(encoded: np.ndarray) -> ArrayRecord:
    """The reply of a client that encodes: its encoding, one int64 array."""
    return ArrayRecord(array_dict={ENCODED: Array(np.ascontiguousarray(np.asarray(encoded, dtype=np.int64)))})


def reply_encoded(msg: Message, encoding: dict[str, Any]) -> np.ndarray | None:
    """The encoding in a reply, or None if the reply is an error or not ``encoding["dim"]`` integers in
    ``[0, 2^bits)``: a value outside the modulus would not be what a secure sum adds."""
    if msg.has_error():
        return None
    records = list(msg.content.array_records.values())
    if len(records) != 1 or list(records[0].keys()) != [ENCODED]:
        return None
    try:
        got = records[0][ENCODED].numpy()
    except Exception:
        return None
    if got.dtype != np.int64 or got.shape != (int(encoding["dim"]),):
        return None
    if got.size and (got.min() < 0 or got.max() >= 2 ** int(encoding["bits"])):
        return None
    return got


def reply_metrics(msg: Message) -> dict[str, float]:
    """The numeric metrics of a reply (NaN for a value that is not a number)."""
    out: dict[str, float] = {}
    if msg.has_error():
        return out
    for rec in msg.content.metric_records.values():
        for k, v in rec.items():
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                out[k] = math.nan
    return out


def reply_source(msg: Message, node_to_client: dict[int, int]) -> int:
    """The client a reply comes from (its node id, mapped back when the grid renamed nodes)."""
    node = int(msg.metadata.src_node_id)
    return node_to_client.get(node, node)
