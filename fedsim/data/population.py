"""``FederatedData``, the interface every dataset's clients share, and the domain helpers every kind uses.

A population is split into domains, contiguous blocks of client ids (:func:`split_domains`: ``domains=K`` equal
blocks, or a list of fractions for unequal blocks). Held-out clients are drawn with the seed, stratified by
domain, and are never trained on; every domain keeps at least one training client. Concept shift between domains
is a per-domain label map (:func:`label_maps`).

The kinds of dataset (:mod:`fedsim.data.federated`: arrays and synthetic data; :mod:`fedsim.data.shakespeare`:
one client per role of the plays) subclass :class:`FederatedData` from here, below the builder that picks one
(:func:`fedsim.data.build_federated_data`), so that no dataset module imports the module that dispatches to it.
"""

from __future__ import annotations

import functools
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedsim.data._validate import check_int, invalid
from fedsim.factories import IGNORE_INDEX

_TAG_HELDOUT = 0x4E1D
_TAG_LABELS = 0x1AB5


class FederatedData(ABC):
    """A population of clients: who trains, who is held out, each client's data and domain."""

    dataset: str
    num_clients: int
    seed: int
    heldout_fraction: float
    input_shape: tuple[int, ...]
    num_classes: int
    #: the shape of one example's targets: ``()`` for a label, ``(T,)`` for a sequence task's ``[n, T]`` targets
    target_shape: tuple[int, ...] = ()

    def __init__(
        self,
        *,
        dataset: str,
        num_clients: int,
        seed: int,
        heldout_fraction: float,
        domain_sizes: tuple[int, ...],
        domains_requested: bool,
        input_shape: tuple[int, ...],
        num_classes: int,
    ) -> None:
        self.dataset = dataset
        self.num_clients = num_clients
        self.seed = seed
        self.heldout_fraction = heldout_fraction
        self.domain_sizes = domain_sizes
        self.domains_requested = domains_requested
        self.input_shape = tuple(int(v) for v in input_shape)
        self.num_classes = num_classes
        self._domain_starts = np.concatenate([[0], np.cumsum(domain_sizes)]).astype(np.int64)
        self.heldout_per_domain = _allocate_heldout(heldout_fraction, domain_sizes)

    @property
    def input_dim(self) -> int:
        """Features per example: the product of ``input_shape``."""
        return int(np.prod(self.input_shape))

    # ---- abstract
    @abstractmethod
    def client_data(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s examples: ``x`` float32 ``[n, *input_shape]``, ``y`` int64 [n] (fresh arrays)."""

    @abstractmethod
    def num_examples_array(self, cids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Number of examples of each client in ``cids`` (int64), without generating any data."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary for the run's report."""

    # ---- clients
    def num_examples(self, cid: int) -> int:
        cid = self._check_cid(cid)
        return int(self.num_examples_array(np.asarray([cid]))[0])

    @functools.cached_property
    def heldout_clients(self) -> np.ndarray:
        """Sorted ids of the clients never trained on (the unseen clients)."""
        rng = np.random.default_rng([self.seed, _TAG_HELDOUT])
        parts = [
            start + rng.choice(size, size=k, replace=False)
            for start, size, k in zip(
                self._domain_starts[:-1], self.domain_sizes, self.heldout_per_domain, strict=True
            )
            if k > 0
        ]
        out = np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)
        out.setflags(write=False)
        return out

    @functools.cached_property
    def train_clients(self) -> np.ndarray:
        """Sorted ids of the clients that may be sampled for training."""
        mask = np.ones(self.num_clients, dtype=bool)
        mask[self.heldout_clients] = False
        out = np.flatnonzero(mask).astype(np.int64)
        out.setflags(write=False)
        return out

    @property
    def num_train_clients(self) -> int:
        return self.num_clients - int(sum(self.heldout_per_domain))

    @property
    def num_heldout_clients(self) -> int:
        return int(sum(self.heldout_per_domain))

    def is_heldout(self, cid: int) -> bool:
        cid = self._check_cid(cid)
        h = self.heldout_clients
        i = int(np.searchsorted(h, cid))
        return i < h.size and int(h[i]) == cid

    # ---- domains
    @property
    def num_domains(self) -> int:
        return len(self.domain_sizes)

    def domain(self, cid: int) -> int:
        """Domain (client group) of client ``cid``, in ``range(num_domains)``."""
        cid = self._check_cid(cid)
        return int(np.searchsorted(self._domain_starts, cid, side="right") - 1)

    def domains_of(self, cids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Vectorised ``domain``: the domain of each client id in ``cids`` (int64)."""
        cids = np.asarray(cids, dtype=np.int64)
        return (np.searchsorted(self._domain_starts, cids, side="right") - 1).astype(np.int64)

    def domain_clients(self, d: int, *, heldout: bool = False) -> np.ndarray:
        """Sorted training (or held-out) client ids of domain ``d``."""
        d = check_int("domain", d, minimum=0, maximum=self.num_domains - 1)
        ids = self.heldout_clients if heldout else self.train_clients
        lo, hi = self._domain_starts[d], self._domain_starts[d + 1]
        return ids[(ids >= lo) & (ids < hi)]

    # ---- plumbing
    def _check_cid(self, cid: Any) -> int:
        if isinstance(cid, bool) or not isinstance(cid, numbers.Integral) or not 0 <= cid < self.num_clients:
            raise invalid("cid", cid, f"an integer client id in [0, {self.num_clients - 1}]")
        return int(cid)

    def _common_description(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_clients": self.num_clients,
            "num_train_clients": self.num_train_clients,
            "num_heldout_clients": self.num_heldout_clients,
            "heldout_fraction": self.heldout_fraction,
            "seed": self.seed,
            "input_shape": list(self.input_shape),
            "input_dim": self.input_dim,
            "target_shape": list(self.target_shape),
            "num_classes": self.num_classes,
            "num_domains": self.num_domains,
            "domain_sizes": list(self.domain_sizes),
            "heldout_per_domain": list(self.heldout_per_domain),
        }

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # derived from the seed; recomputed on first use after unpickling (keeps huge populations small)
        state.pop("train_clients", None)
        state.pop("heldout_clients", None)
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dataset={self.dataset!r}, num_clients={self.num_clients}, "
            f"heldout={self.num_heldout_clients}, domains={self.num_domains}, seed={self.seed})"
        )


# --------------------------------------------------------------------------- domains
def relabel(label_map: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``label_map[y]`` for labels or sequence targets ``y``, leaving :data:`~fedsim.factories.IGNORE_INDEX`
    (padding) as it is: indexing with it would wrap around to the last class."""
    scored = y != IGNORE_INDEX
    return np.where(scored, label_map[np.where(scored, y, 0)], y)


def label_maps(seed: int, num_domains: int, num_classes: int, swaps: int) -> np.ndarray:
    """Concept shift between domains: ``maps[d][y]`` is domain d's label for an example of class y.

    Domain 0 keeps the labels; in every domain d >= 1, ``swaps`` disjoint pairs of classes (drawn with the
    seed, per domain) exchange their labels. The inputs are the same, the labelling convention differs: no
    single model is right for every domain, and minimising the pooled loss favours the large domains.
    """
    if 2 * swaps > num_classes:
        raise invalid(
            "domain_label_swaps", swaps, f"at most num_classes // 2 = {num_classes // 2} disjoint pairs"
        )
    maps = np.tile(np.arange(num_classes), (num_domains, 1))
    for d in range(1, num_domains):
        pick = np.random.default_rng([seed, _TAG_LABELS, d]).permutation(num_classes)
        for a, b in pick[: 2 * swaps].reshape(-1, 2):
            maps[d, a], maps[d, b] = b, a
    return maps


def split_domains(num_clients: int, domains: Any) -> tuple[tuple[int, ...], bool]:
    """Block sizes of the domains (contiguous client ids), and whether domains were asked for."""
    if domains is None:
        return (num_clients,), False
    if isinstance(domains, numbers.Integral) and not isinstance(domains, bool):
        k = check_int("domains", domains, minimum=1, maximum=num_clients)
        return tuple(int(len(b)) for b in np.array_split(np.arange(num_clients), k)), True
    allowed = (
        f"None, an integer in [1, num_clients={num_clients}], or a list of positive fractions summing to 1 "
        "with at least one client per domain"
    )
    if isinstance(domains, (str, bytes)) or not isinstance(domains, Sequence) or len(domains) == 0:
        raise invalid("domains", domains, allowed)
    try:
        fr = np.asarray([float(f) for f in domains])
    except (TypeError, ValueError):
        raise invalid("domains", domains, allowed) from None
    if not np.all(np.isfinite(fr)) or np.any(fr <= 0) or abs(fr.sum() - 1.0) > 1e-6:
        raise invalid("domains", list(domains), allowed)
    sizes = _largest_remainder(fr / fr.sum() * num_clients, num_clients)
    if np.any(sizes < 1):
        raise invalid("domains", list(domains), allowed)
    return tuple(int(s) for s in sizes), True


def _largest_remainder(quotas: np.ndarray, total: int, caps: np.ndarray | None = None) -> np.ndarray:
    """Integers summing to ``total``, each the floor of its quota or one more (capped by ``caps``)."""
    base = np.floor(quotas).astype(np.int64)
    if caps is not None:
        base = np.minimum(base, caps)
    rest = quotas - base
    for i in np.argsort(-rest, kind="stable"):
        if base.sum() >= total:
            break
        if caps is None or base[i] < caps[i]:
            base[i] += 1
    # with caps, any still-missing units go wherever room is left
    for i in range(len(base)):
        while base.sum() < total and (caps is None or base[i] < caps[i]):
            base[i] += 1
    return base


def _allocate_heldout(fraction: float, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """How many held-out clients each domain gets: round(fraction * N) in all, proportional to size."""
    n = int(sum(sizes))
    total = int(math.floor(fraction * n + 0.5))
    if fraction > 0:
        total = max(total, 1)
    caps = np.asarray(sizes, dtype=np.int64) - 1  # every domain keeps a training client
    if total > caps.sum():
        raise invalid(
            "heldout_fraction",
            fraction,
            f"a fraction leaving at least one training client per domain ({n} clients, {len(sizes)} domains)",
        )
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    return tuple(int(k) for k in _largest_remainder(fraction * sizes_arr, total, caps))


def size_stats(sizes: np.ndarray) -> dict[str, float]:
    """The spread of per-client counts (examples per client) as ``data.json`` reports it (non-private)."""
    sizes = np.asarray(sizes)
    return {
        "min": int(sizes.min()),
        "median": float(np.median(sizes)),
        "mean": float(sizes.mean()),
        "max": int(sizes.max()),
    }
