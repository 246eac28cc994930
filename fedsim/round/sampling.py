"""Who takes part in a round: samplers, pluggable objects whose state a checkpoint can save.

A sampler draws the round's cohort from the client ids available in that round, from its own generator
(:mod:`fedsim.round.randomness`: ``(seed, round, STREAM_SAMPLING)`` when seeded, the operating system
otherwise), so the cohort does not depend on call order or worker count.

=========  =============================================================  ====================
name       cohort                                                          neighbouring relation
=========  =============================================================  ====================
poisson    each client independently with probability q (may be empty)     add/remove one client
fixed      exactly ``clients_per_round`` clients, uniformly, no repeats    replace one client
all        everyone                                                        add/remove one client
=========  =============================================================  ====================

:data:`SAMPLERS` is the registry: the scenario schema, :class:`fedsim.privacy.Mechanism` and the strategies take
their choices from it. A new participation scheme (cyclic groups, a minimum separation between a client's
rounds) is a new :class:`Sampler` with its state in :meth:`Sampler.state_dict`, and a new entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedsim.validation import cohort, one_of

from .randomness import STREAM_SAMPLING, SeededState, make_rng


def id_array(client_ids: Any) -> np.ndarray:
    """Sorted, unique client (or Flower node) ids as an integer array.

    Flower's node ids are random unsigned 64-bit integers, which overflow ``int64``: those get ``uint64``.
    """
    if isinstance(client_ids, np.ndarray) and client_ids.dtype.kind in "iu":
        ids = client_ids.ravel()
        if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):  # already sorted and unique (the usual case)
            return ids
        return np.unique(ids)
    values = sorted({int(c) for c in client_ids})
    big = bool(values) and values[-1] > np.iinfo(np.int64).max
    return np.asarray(values, dtype=np.uint64 if big else np.int64)


def sample_cohort(
    client_ids: np.ndarray | list[int],
    sampling: str,
    rng: Any,
    *,
    sampling_rate: float | None = None,
    clients_per_round: int | None = None,
) -> np.ndarray:
    """Draw one round's cohort from ``client_ids`` (order-independent: ids are sorted first).

    ``poisson``: each client independently with probability ``sampling_rate`` (may be empty), or with
    ``clients_per_round / len(client_ids)``; ``fixed``: exactly ``clients_per_round`` clients uniformly without
    replacement; ``all``: everyone. The arguments follow :func:`fedsim.validation.cohort`.
    """
    ids = id_array(client_ids)
    one_of("sampling", sampling, SAMPLINGS)
    rate, cpr = cohort(sampling, sampling_rate, clients_per_round, population=int(ids.size) or None)
    if sampling == "poisson":
        q = rate if rate is not None else cpr / ids.size
        return ids[rng.random(ids.size) < q]
    if sampling == "fixed":
        tau = cpr if cpr is not None else int(round(rate * ids.size))
        return np.sort(rng.choice(ids, size=int(tau), replace=False))
    return ids


@dataclass
class Sampler(SeededState):
    """Draws round ``t``'s cohort. ``seed=None``: from the operating system's entropy (deployment).

    Subclasses set :attr:`name` and implement :meth:`sample`; the state a checkpoint must save to continue the
    same sequence of cohorts is :meth:`state_dict` (for these counter-based samplers: their seed).
    """

    seed: int | None = None
    name: ClassVar[str] = ""

    def rng(self, round_: int) -> Any:
        return make_rng(self.seed, round_, STREAM_SAMPLING)

    def sample(self, round_: int, client_ids: Any, mechanism: Any) -> np.ndarray:
        """Round ``round_``'s cohort from ``client_ids`` for ``mechanism`` (a :class:`fedsim.privacy.Mechanism`
        over exactly these clients: the probability it accounts is the one sampled with)."""
        ids = id_array(client_ids)
        if mechanism.sampling != self.name or mechanism.population != ids.size:
            raise ValueError(
                f"a {self.name!r} sampler over {ids.size} clients cannot draw for a {mechanism.sampling!r} "
                f"mechanism over {mechanism.population}: sampling and accounting must use the same population"
            )
        if self.name == "poisson":
            return sample_cohort(ids, "poisson", self.rng(round_), sampling_rate=mechanism.q)
        if self.name == "fixed":
            return sample_cohort(ids, "fixed", self.rng(round_), clients_per_round=int(mechanism.tau))
        return ids


class PoissonSampler(Sampler):
    name = "poisson"


class FixedSizeSampler(Sampler):
    name = "fixed"


class EveryoneSampler(Sampler):
    name = "all"


SAMPLERS: dict[str, type[Sampler]] = {s.name: s for s in (PoissonSampler, FixedSizeSampler, EveryoneSampler)}
SAMPLINGS: tuple[str, ...] = tuple(SAMPLERS)


def make_sampler(name: str, seed: int | None) -> Sampler:
    return SAMPLERS[one_of("sampling", name, SAMPLINGS)](seed)
