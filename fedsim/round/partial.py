"""Clipping and the partial sum: what crosses process boundaries in a round.

Conventions (``shared/reference/privacy-formulas.md`` section 1): an update is a flat vector (all of the model's
tensors concatenated); ``clip`` is flat L2 clipping to norm ``clip``; a zero norm is fine; a non-finite update is
*rejected* (it contributes zero and is counted), never clipped into the sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def bounded_value(value: Any, low: float, high: float) -> float | None:
    """A client's scalar that enters a noised sum, clamped to ``[low, high]``; ``None`` when it is not a finite
    number (NaN, +-inf, not numeric): the caller must then reject the client's whole reply, because a clamp lets
    NaN through (``min(max(nan, 0), 1)`` is NaN) and one NaN would poison every later release."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return min(max(v, low), high)


#: Why a client's update contributes zero to a round (``PartialSum.failures``):
#: ``error`` local training raised, or a Flower client replied with an error; ``non_finite`` a NaN or inf in the
#: update or in a value that enters a noised sum; ``wrong_shape`` an update or reply that does not match the
#: model; ``timeout`` not finished within ``engine.round_timeout_s``; ``worker_lost`` the Ray worker training it
#: died; ``no_reply`` a sampled Flower node that never replied; ``not_sampled`` a reply from a node that was not
#: sampled (never aggregated).
FAILURES = (
    "error",
    "non_finite",
    "wrong_shape",
    "timeout",
    "worker_lost",
    "no_reply",
    "not_sampled",
    "dropped",  # secure aggregation: shared its keys, sent no masked input (its masks removed by its neighbours)
)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def clip_update(update: Any, clip: float) -> tuple[Any, float, bool]:
    """Flat-L2 clip one update (a 1-D numpy array or torch tensor).

    Returns ``(clipped, norm_before_clipping, finite)``. A non-finite update returns ``(zeros, nan, False)``:
    the caller must count it and must not let it reach the model.
    """
    if _is_torch(update):
        import torch  # torch only for tensor updates: the server side of a round needs numpy alone

        finite = bool(torch.isfinite(update).all())
        if not finite:
            return torch.zeros_like(update), math.nan, False
        norm = float(torch.linalg.vector_norm(update.double()))
    else:
        update = np.asarray(update)
        finite = bool(np.isfinite(update).all())
        if not finite:
            return np.zeros_like(update), math.nan, False
        norm = float(np.linalg.norm(update.astype(np.float64, copy=False)))
    if norm > clip:
        return update * (clip / norm), norm, True
    return update, norm, True


@dataclass
class PartialSum:
    """A sum of clipped client updates, mergeable across workers (only this crosses process boundaries).

    ``count``: clients whose clipped update is in ``total``; ``rejected``: clients whose update was dropped
    (non-finite, wrong shape or dtype, error reply) and contributes zero; ``unclipped``: clients whose update
    norm was <= the clip (the bits of adaptive clipping); ``noise_shares``: distributed-noise shares included;
    ``unclipped_noised`` / ``count_shares``: distributed noise with adaptive clipping, the sum of the clients'
    own noised bits and how many are in it.

    A rejected client contributes zero to every sum; the server still adds the round's full noise (and tops up
    the noise shares of distributed noise), and the round is accounted as planned: a failure changes neither
    the sensitivity nor the mechanism.
    """

    dim: int
    total: np.ndarray = field(default=None)  # type: ignore[assignment]
    count: int = 0
    rejected: int = 0
    #: ``rejected`` by reason (:data:`FAILURES`): what the round's row counts under ``non_private.failed``
    failures: dict[str, int] = field(default_factory=dict)
    unclipped: int = 0
    noise_shares: int = 0
    unclipped_noised: float = 0.0
    count_shares: int = 0
    norms: list[float] = field(default_factory=list)
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    #: secure aggregation aborted the round (too few survivors to unmask the sum): why; nothing may be released
    secure_abort: str | None = None

    def __post_init__(self) -> None:
        if self.total is None:
            self.total = np.zeros(self.dim, dtype=np.float64)

    def add(
        self, update: Any, clip: float, *, already_clipped_and_noised: bool = False, weight: float = 1.0
    ) -> float:
        """Clip ``update`` and add ``weight`` times it. Returns the norm before clipping (nan when rejected).

        ``weight`` is a per-client aggregation weight fixed by the server *before* the round (agnostic FL's
        ``lambda_d / m_d``); the caller calibrates the noise to the largest weight.

        ``already_clipped_and_noised`` is for distributed noise: the client clipped its update and added its
        noise share; clipping again here would shrink the noise, so the update is only checked to be finite.
        """
        if _is_torch(update):
            update = update.detach().to("cpu", copy=False).double().numpy()
        update = np.asarray(update)
        if update.shape != (self.dim,):
            self.reject(reason="wrong_shape")
            return math.nan
        if already_clipped_and_noised:
            if not np.isfinite(update).all():
                self.reject(reason="non_finite")
                return math.nan
            self.total += update
            self.count += 1
            self.noise_shares += 1
            return math.nan
        clipped, norm, finite = clip_update(update, clip)
        if not finite:
            self.reject(reason="non_finite")
            return math.nan
        self.total += clipped if weight == 1.0 else weight * clipped
        self.count += 1
        self.unclipped += int(norm <= clip)
        self.norms.append(norm)
        return norm

    def add_rows(self, rows: np.ndarray, clip: float) -> np.ndarray:
        """:meth:`add` for the rows of a CPU numpy array ``[K, dim]``, in numpy alone: the same norms (the square
        root of each row's dot product, as ``np.linalg.norm``), clipping, counts and norm list, without going
        through torch as :meth:`add_batch` does (its thread pool costs more than the sum for small blocks on a busy
        CPU). A row whose norm is not finite is rejected. Returns the norms before clipping (nan for rejected)."""
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"add_rows needs a [K, {self.dim}] array, got shape {rows.shape}")
        norms = np.sqrt(np.fromiter((row.dot(row) for row in rows), float, rows.shape[0]))
        ok = np.isfinite(norms)
        if not ok.all():
            self.reject(int((~ok).sum()), reason="non_finite")
            norms = np.where(ok, norms, math.nan)
        scale = np.where(ok & (norms > clip), clip / np.where(ok, np.maximum(norms, 1e-300), 1.0), 1.0)
        self.total += scale[ok] @ rows[ok]
        self.count += int(ok.sum())
        self.unclipped += int(np.count_nonzero(norms[ok] <= clip))
        self.norms.extend(norms[ok].tolist())
        return norms

    def add_batch(self, updates: Any, clip: float, weights: Any = None, *, block: int = 64) -> np.ndarray:
        """:meth:`add` for the rows of ``updates`` (``[K, dim]``, numpy or torch, on any device) at once.

        The same arithmetic in float64, row by row: a row whose norm is not finite (a nan or inf in it) is
        rejected; the others are clipped to ``clip`` and added with their ``weights`` (default 1). Only the
        ``[dim]`` sum and the ``K`` norms leave the device. Returns the norms before clipping (nan for rejected
        rows). A numpy array is viewed as a CPU tensor (no copy): one implementation serves both.
        """
        if getattr(updates, "ndim", None) != 2:
            raise ValueError(
                f"add_batch needs a [K, dim] array of updates, got shape {getattr(updates, 'shape', None)}"
            )
        k = int(updates.shape[0])
        if int(updates.shape[1]) != self.dim:  # like add(): a wrong shape is the clients' fault, counted
            self.reject(k, reason="wrong_shape")
            return np.full(k, math.nan)
        if k == 0:
            return np.zeros(0)
        import torch  # torch only for tensor updates: the server side of a round needs numpy alone

        u = updates.detach() if _is_torch(updates) else torch.from_numpy(np.asarray(updates))
        w = (
            torch.ones(k, dtype=torch.float64, device=u.device)
            if weights is None
            else torch.as_tensor(np.asarray(weights, dtype=np.float64), device=u.device)
        )
        norms_t, finite_t = [], []
        total = torch.zeros(self.dim, dtype=torch.float64, device=u.device)
        for i in range(0, k, block):
            rows = u[i : i + block].double()
            nrm = torch.linalg.vector_norm(rows, dim=1)
            fin = torch.isfinite(nrm)  # a nan or inf anywhere makes the norm non-finite
            if not bool(fin.all()):
                rows = torch.where(fin[:, None], rows, 0.0)
            scale = torch.where(nrm > clip, clip / nrm, torch.ones_like(nrm))
            total += torch.mv(rows.T, torch.where(fin, scale * w[i : i + block], 0.0))
            norms_t.append(nrm)
            finite_t.append(fin)
        norms = torch.cat(norms_t).cpu().numpy()
        finite = torch.cat(finite_t).cpu().numpy()
        total_np = total.cpu().numpy()
        self.total += total_np
        accepted = int(finite.sum())
        self.count += accepted
        self.reject(k - accepted, reason="non_finite")
        self.unclipped += int((finite & (norms <= clip)).sum())
        self.norms.extend(float(v) for v in norms[finite])
        return np.where(finite, norms, math.nan)

    def add_encoded(
        self, encoded: np.ndarray, norm: float, sums: dict[str, np.ndarray] | None = None
    ) -> None:
        """Add one client's encoding (a mechanism whose clients encode: :attr:`fedsim.round.NoiseSource.encodes`),
        already clipped and noised by the client, to ``extras["encoded"]`` (its length is the encoding's, not the
        model's; integers below 2^53 add exactly in float64), with ``sums``: what a simulation also sums for the
        server's diagnostics (``extras`` of the same name). ``norm``: the update's norm before clipping (nan where
        the client does not say)."""
        for key, vec in {"encoded": encoded, **(sums or {})}.items():
            vec = np.asarray(vec, dtype=np.float64)
            self.extras[key] = vec.copy() if key not in self.extras else self.extras[key] + vec
        self.count += 1
        self.noise_shares += 1
        if math.isfinite(norm):
            self.norms.append(float(norm))

    def add_secure_sum(self, total: np.ndarray, clients: int) -> None:
        """Add the sum of ``clients`` clients' encodings modulo ``2^bits``, as secure aggregation gives it (only the
        sum: each client's encoding stays hidden), to ``extras["encoded"]``: decoding reduces it modulo ``2^bits`` as
        it does a simulation's plain sum of the same encodings."""
        self.add_encoded(np.asarray(total, dtype=np.float64), math.nan)
        self.count += int(clients) - 1
        self.noise_shares += int(clients) - 1

    def add_noised_count(self, value: float) -> None:
        """Distributed noise with adaptive clipping: add one client's unclipped bit, already noised by the client."""
        self.unclipped_noised += float(value)
        self.count_shares += 1

    def reject(self, n: int = 1, *, reason: str) -> None:
        """Count ``n`` clients that contribute zero, for ``reason`` (one of :data:`FAILURES`)."""
        if reason not in FAILURES:
            raise ValueError(f"unknown failure reason {reason!r}; allowed: {', '.join(FAILURES)}")
        if n > 0:
            self.rejected += n
            self.failures[reason] = self.failures.get(reason, 0) + n

    def add_extra(self, key: str, index: int, value: float, size: int) -> None:
        """Accumulate a small per-round statistic (e.g. per-domain loss sums), merged by addition."""
        vec = self.extras.setdefault(key, np.zeros(size))
        vec[index] += value

    def merge(self, other: PartialSum) -> PartialSum:
        if other.dim != self.dim:
            raise ValueError(f"cannot merge partial sums of dimension {self.dim} and {other.dim}")
        self.total += other.total
        self.count += other.count
        self.rejected += other.rejected
        for reason, n in other.failures.items():
            self.failures[reason] = self.failures.get(reason, 0) + n
        self.unclipped += other.unclipped
        self.noise_shares += other.noise_shares
        self.unclipped_noised += other.unclipped_noised
        self.count_shares += other.count_shares
        self.norms.extend(other.norms)
        self.secure_abort = self.secure_abort or other.secure_abort
        for key, vec in other.extras.items():
            if key in self.extras:
                self.extras[key] = self.extras[key] + vec
            else:
                self.extras[key] = vec.copy()
        return self


def flatten(arrays: list[np.ndarray]) -> np.ndarray:
    """Concatenate arrays into one float64 vector (the flat norm is taken over it)."""
    if not arrays:
        return np.zeros(0)
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def unflatten(vec: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    out, i = [], 0
    for a in like:
        n = int(np.prod(a.shape))
        out.append(vec[i : i + n].reshape(a.shape).astype(a.dtype, copy=False))
        i += n
    if i != vec.size:
        raise ValueError(f"vector of size {vec.size} does not match arrays of total size {i}")
    return out
