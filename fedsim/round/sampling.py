"""Who takes part in a round, and what that means for privacy: one class per sampling scheme, registered by name.

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

A scheme owns its privacy meaning, in one place: how its cohort is described and checked (:meth:`Sampler.check_cohort`),
its sampling probability and expected cohort (:meth:`Sampler.q`, :meth:`Sampler.expected_cohort`), its
neighbouring relation, its dp-accounting event (:meth:`Sampler.dp_event`) and its PLD parameters
(:meth:`Sampler.pld_parameters`). :class:`fedsim.privacy.Mechanism` asks its scheme for all of these; nothing else
switches on a sampling name.

:data:`SAMPLERS` is the registry (:func:`register_sampler`): the scenario schema, :class:`fedsim.privacy.Mechanism` and
the strategies take their choices from it when they validate, so a scheme registered from outside the package is
accepted everywhere. A new participation scheme (cyclic groups, a minimum separation between a client's rounds) is a
new :class:`Sampler` subclass, with any state it keeps in :meth:`Sampler.state_dict`, and one call to
:func:`register_sampler`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedsim.validation import PrivacyInputError, cohort_values, one_of

from .randomness import STREAM_SAMPLING, SeededState, make_component, make_rng, register_component

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


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


@dataclass
class Sampler(SeededState):
    """A sampling scheme: draws round ``t``'s cohort (:meth:`sample`) and says what that means for privacy.

    ``seed=None``: the cohort comes from the operating system's entropy (deployment). The class methods describe the
    scheme for a :class:`fedsim.privacy.Mechanism` ``m`` (which holds the population, the rate or cohort size, the
    clip and the noise); a subclass sets :attr:`name`, :attr:`neighbouring` and :attr:`label`, and overrides what
    differs from Poisson-like defaults. The state a checkpoint must save to continue the same sequence of cohorts is
    :meth:`state_dict` (for these counter-based samplers: their seed).
    """

    seed: int | None = None
    name: ClassVar[str] = ""
    #: the neighbouring relation a round of this scheme is accounted under
    neighbouring: ClassVar[str] = ADD_REMOVE
    #: one line for reports and ``--help``
    label: ClassVar[str] = ""

    # ------------------------------------------------------------------ the cohort's description
    @classmethod
    def check_cohort(
        cls, sampling_rate: Any = None, clients_per_round: Any = None, population: int | None = None
    ) -> tuple[float | None, int | None]:
        """Check how a round's cohort is described; return ``(sampling_rate, clients_per_round)`` normalised.
        Default: exactly one of the rate and the (expected) cohort size. Checks that need the population are made
        when it is given."""
        rate, cpr = cohort_values(sampling_rate, clients_per_round, population)
        if (rate is None) == (cpr is None):
            raise PrivacyInputError(
                "sampling_rate/clients_per_round",
                (sampling_rate, clients_per_round),
                f"give exactly one of the two for sampling={cls.name!r}",
            )
        return rate, cpr

    @classmethod
    def q(cls, m: Any) -> float:
        """The probability that a given client takes part in a round."""
        return m.sampling_rate if m.sampling_rate is not None else m.clients_per_round / m.population

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        """Clients per round (the aggregate's denominator, a public number): the expected cohort size."""
        return m.clients_per_round if m.clients_per_round is not None else m.sampling_rate * m.population

    @classmethod
    def at_population(cls, m: Any, population: int) -> Any:
        """``m`` over another population, keeping what was given: the rate, or the clients per round."""
        if m.sampling_rate is not None:
            return m.replace(population=population)
        return m.replace(population=population, clients_per_round=m.clients_per_round)

    @classmethod
    def rate_is_fixed(cls, m: Any) -> bool:
        """Whether :meth:`at_population` keeps ``q`` (a rate was given) rather than the cohort size."""
        return m.sampling_rate is not None

    @classmethod
    def min_population(cls, m: Any) -> int:
        """The smallest population over which ``m``'s cohort can be drawn."""
        return 1

    @classmethod
    def describe(cls, m: Any) -> str:
        return f"{cls.name} q={cls.q(m):.4g}"

    # ------------------------------------------------------------------ accounting
    @classmethod
    def dp_event(cls, m: Any, gaussian: Any, relation: str) -> Any:
        """The dp-accounting event of one round: ``gaussian`` (the round's ``GaussianDpEvent``, its noise multiplier
        relative to the sensitivity under ``relation``) as this scheme samples it."""
        from dp_accounting import dp_event  # dp-accounting is loaded on first accounting, not at import

        if relation == REPLACE_ONE:
            raise PrivacyInputError(
                "relation",
                relation,
                f"a {cls.name!r} round has no dp-accounting event under replace-one (a ledger mixing fixed-size "
                "and add/remove rounds): account it with method='pld'",
            )
        return dp_event.PoissonSampledDpEvent(cls.q(m), gaussian)

    @classmethod
    def pld_parameters(cls, m: Any, relation: str) -> tuple[float, float, str]:
        """``(standard_deviation, sampling_prob, dp-accounting NeighboringRelation name)`` of one round's PLD with
        sensitivity 1 (dp-accounting's ``from_gaussian_mechanism``), under ``relation``."""
        if relation == ADD_REMOVE:
            if cls.neighbouring != ADD_REMOVE:
                raise PrivacyInputError(
                    "relation", relation, f"a {cls.name!r} (replace-one) round needs replace-one"
                )
            return (m.noise_std / m.clip, cls.q(m), "ADD_OR_REMOVE_ONE")
        # an add/remove round in a replace-one ledger: dp-accounting's REPLACE pair shifts by +-clip
        return (m.noise_std / m.clip, cls.q(m), "REPLACE_ONE")

    # ------------------------------------------------------------------ drawing
    def rng(self, round_: int) -> Any:
        return make_rng(self.seed, round_, STREAM_SAMPLING)

    def draw(self, ids: np.ndarray, rng: Any, m: Any) -> np.ndarray:
        """The cohort from the sorted ids: each client independently with probability ``q``."""
        return ids[rng.random(ids.size) < self.q(m)]

    def sample(self, round_: int, client_ids: Any, mechanism: Any) -> np.ndarray:
        """Round ``round_``'s cohort from ``client_ids`` for ``mechanism`` (a :class:`fedsim.privacy.Mechanism`
        over exactly these clients: the probability it accounts is the one sampled with)."""
        ids = id_array(client_ids)
        if mechanism.sampling != self.name or mechanism.population != ids.size:
            raise ValueError(
                f"a {self.name!r} sampler over {ids.size} clients cannot draw for a {mechanism.sampling!r} "
                f"mechanism over {mechanism.population}: sampling and accounting must use the same population"
            )
        return self.draw(ids, self.rng(round_), mechanism)


class PoissonSampler(Sampler):
    """Each client independently with probability ``q`` (the cohort may be empty); add/remove neighbours."""

    name = "poisson"
    label = "each client independently with probability q"

    @classmethod
    def describe(cls, m: Any) -> str:
        return f"Poisson q={cls.q(m):.4g}"


class FixedSizeSampler(Sampler):
    """Exactly ``clients_per_round`` clients, uniformly without replacement; replace-one neighbours (sensitivity of
    the sum: the diameter of one client's contribution, ``2*clip`` by default)."""

    name = "fixed"
    neighbouring = REPLACE_ONE
    label = "exactly clients_per_round clients, uniformly without replacement"

    @classmethod
    def check_cohort(cls, sampling_rate=None, clients_per_round=None, population=None):
        rate, cpr = super().check_cohort(sampling_rate, clients_per_round, population)
        if rate is not None and population is not None:
            tau = rate * population
            if abs(tau - round(tau)) > 1e-9 * max(1.0, tau) or round(tau) < 1:
                raise PrivacyInputError(
                    "sampling_rate",
                    sampling_rate,
                    f"for fixed-size sampling rate*population must be a whole number of clients >= 1 (got {tau:g}); "
                    "give clients_per_round instead",
                )
        return rate, cpr

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        if m.clients_per_round is not None:
            return m.clients_per_round
        return int(round(m.sampling_rate * m.population))

    @classmethod
    def min_population(cls, m: Any) -> int:
        return max(1, int(m.clients_per_round or 1))

    @classmethod
    def describe(cls, m: Any) -> str:
        return f"fixed tau={cls.expected_cohort(m):g} (q={cls.q(m):.4g})"

    @classmethod
    def dp_event(cls, m: Any, gaussian: Any, relation: str) -> Any:
        from dp_accounting import dp_event  # as above

        return dp_event.SampledWithoutReplacementDpEvent(m.population, int(cls.expected_cohort(m)), gaussian)

    @classmethod
    def pld_parameters(cls, m: Any, relation: str) -> tuple[float, float, str]:
        # dp-accounting's PLDAccountant has no event for sampling without replacement: the dominating pair
        # ((1-g) N(0,s^2) + g N(D,s^2), N(0,s^2)) with g = tau/N and D the replace-one sensitivity (privacy/certified.py)
        if relation == ADD_REMOVE:
            raise PrivacyInputError(
                "relation", relation, "a fixed-size (replace-one) round needs replace-one"
            )
        return (m.noise_std / m.replace_sensitivity, cls.q(m), "ADD_OR_REMOVE_ONE")

    def draw(self, ids: np.ndarray, rng: Any, m: Any) -> np.ndarray:
        return np.sort(rng.choice(ids, size=int(self.expected_cohort(m)), replace=False))


class EveryoneSampler(Sampler):
    """Every client, every round (no amplification by sampling); add/remove neighbours."""

    name = "all"
    label = "every client, every round"

    @classmethod
    def check_cohort(cls, sampling_rate=None, clients_per_round=None, population=None):
        rate, cpr = cohort_values(sampling_rate, clients_per_round, population)
        if rate is not None and rate != 1.0:
            raise PrivacyInputError(
                "sampling_rate", sampling_rate, "must be omitted (or 1) for sampling='all'"
            )
        if cpr is not None and population is not None and cpr != population:
            raise PrivacyInputError(
                "clients_per_round",
                cpr,
                f"must be omitted (or equal population={population}) for sampling='all'",
            )
        if cpr is not None and population is None:
            raise PrivacyInputError("clients_per_round", cpr, "must be omitted for sampling='all'")
        return None, None  # everyone: nothing to describe

    @classmethod
    def q(cls, m: Any) -> float:
        return 1.0

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        return m.population

    @classmethod
    def at_population(cls, m: Any, population: int) -> Any:
        return m.replace(population=population)

    @classmethod
    def rate_is_fixed(cls, m: Any) -> bool:
        return True

    @classmethod
    def describe(cls, m: Any) -> str:
        return "everyone"

    @classmethod
    def dp_event(cls, m: Any, gaussian: Any, relation: str) -> Any:
        return gaussian  # under replace-one its noise multiplier is relative to the replace-one sensitivity

    @classmethod
    def pld_parameters(cls, m: Any, relation: str) -> tuple[float, float, str]:
        if relation == ADD_REMOVE:
            return (m.noise_std / m.clip, 1.0, "ADD_OR_REMOVE_ONE")
        return (m.noise_std / m.replace_sensitivity, 1.0, "ADD_OR_REMOVE_ONE")

    def draw(self, ids: np.ndarray, rng: Any, m: Any) -> np.ndarray:
        return ids


#: The one registry of sampling schemes, by name (:func:`register_sampler`).
SAMPLERS: dict[str, type[Sampler]] = {}


def register_sampler(cls: type[Sampler], *, replace: bool = False) -> type[Sampler]:
    """Add a sampling scheme (a :class:`Sampler` subclass with a ``name``) to :data:`SAMPLERS`; usable as a class
    decorator. The scenario schema, :class:`fedsim.privacy.Mechanism` and the strategies accept it from then on."""
    if isinstance(cls, type) and cls.neighbouring not in (ADD_REMOVE, REPLACE_ONE):
        raise ValueError(f"{cls.__name__}.neighbouring must be {ADD_REMOVE!r} or {REPLACE_ONE!r}")
    return register_component(SAMPLERS, cls, Sampler, replace=replace)


for _cls in (PoissonSampler, FixedSizeSampler, EveryoneSampler):
    register_sampler(_cls)


def sampling_names() -> tuple[str, ...]:
    """The registered sampling schemes' names (read at validation time, so later registrations count)."""
    return tuple(SAMPLERS)


def sampler_class(name: Any) -> type[Sampler]:
    """The registered scheme called ``name``; :class:`PrivacyInputError` naming the allowed ones otherwise."""
    return SAMPLERS[one_of("sampling", name, sampling_names())]


def check_cohort(
    sampling: Any, sampling_rate: Any = None, clients_per_round: Any = None, population: int | None = None
) -> tuple[float | None, int | None]:
    """The scheme's own check of how a round's cohort is described (:meth:`Sampler.check_cohort`)."""
    return sampler_class(sampling).check_cohort(sampling_rate, clients_per_round, population)


def make_sampler(sampling: Any, seed: int | None) -> Sampler:
    """A sampler: a registered scheme's name, or a :class:`Sampler` object (used as it is; ``seed`` must then agree
    with its own seed or be None)."""
    return make_component(SAMPLERS, sampling, seed, "sampling", Sampler)


def sample_cohort(
    client_ids: np.ndarray | list[int],
    sampling: str,
    rng: Any,
    *,
    sampling_rate: float | None = None,
    clients_per_round: int | None = None,
) -> np.ndarray:
    """Draw one round's cohort from ``client_ids`` with ``rng`` (order-independent: ids are sorted first), as the
    registered scheme ``sampling`` draws it, for the cohort described by ``sampling_rate`` or
    ``clients_per_round`` (:meth:`Sampler.check_cohort`)."""
    from types import SimpleNamespace

    ids = id_array(client_ids)
    cls = sampler_class(sampling)
    population = int(ids.size) or None
    rate, cpr = cls.check_cohort(sampling_rate, clients_per_round, population)
    m = SimpleNamespace(population=int(ids.size), sampling_rate=rate, clients_per_round=cpr)
    return cls(None).draw(ids, rng, m)
