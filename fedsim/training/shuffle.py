"""Per-client batch order for local SGD, computed for many clients at once.

A client's example order in epoch ``e`` of round ``t`` is the argsort of 64-bit keys
``mix(client_key(seed, t, cid, e) + index)``, where ``mix`` is SplitMix64 (Steele, Lea and
Flood 2014): a counter-based generator. Every client's order depends only on ``(seed, round, client id,
epoch)``, never on which other clients share its worker or chunk, so the loop
(:meth:`~fedsim.training.trainer.ClientTrainer.train_one`) and the vectorised path
(:mod:`fedsim.training.vectorized`) shuffle identically, and the orders of a whole cohort cost one NumPy
sort instead of one generator per client.

``seed=None`` (a deployment, not a simulation) draws the base key from the operating system's entropy.
"""

from __future__ import annotations

import numpy as np

from fedsim.data.synthetic import splitmix64
from fedsim.round import STREAM_CLIENT


def _absorb(key: np.ndarray, value: np.ndarray | int) -> np.ndarray:
    return splitmix64(key + np.asarray(value, dtype=np.uint64))


def client_orders(
    seed: int | None,
    server_round: int,
    client_ids: list[int] | np.ndarray,
    sizes: list[int] | np.ndarray,
    epochs: int,
) -> np.ndarray:
    """Batch orders ``[epochs, sum(sizes)]``: for each epoch, client ``j``'s permutation of
    ``range(sizes[j])`` occupies ``[offsets[j], offsets[j] + sizes[j])`` (local indices, int64)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    out = np.empty((int(epochs), total), dtype=np.int64)
    if total == 0:
        return out
    with np.errstate(over="ignore"):
        if seed is None:
            base = np.random.default_rng().integers(0, 2**63, dtype=np.uint64)
        else:
            base = np.uint64(int(seed) & (2**64 - 1))
        base = _absorb(
            _absorb(splitmix64(np.asarray(base, dtype=np.uint64)), int(server_round) & (2**64 - 1)),
            STREAM_CLIENT,
        )
        cids = np.asarray([int(c) & (2**64 - 1) for c in client_ids], dtype=np.uint64)
        client_key = _absorb(np.full(cids.shape, base, dtype=np.uint64), cids)
        seg = np.repeat(np.arange(sizes.size), sizes)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        local = np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)
        # one sort key: the client's position in the high bits, the example's random key in the rest
        nbits = int(sizes.size - 1).bit_length()
        high = seg.astype(np.uint64) << np.uint64(64 - nbits) if nbits else np.uint64(0)
        for e in range(int(epochs)):
            key = _absorb(np.repeat(_absorb(client_key, e), sizes), local.astype(np.uint64))
            order = np.argsort(
                high | (key >> np.uint64(nbits)), kind="stable"
            )  # a permutation within each client
            out[e] = local[order]
    return out
