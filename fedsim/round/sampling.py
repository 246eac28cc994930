"""Who takes part in a round, and what that means for privacy: one class per sampling scheme, registered by name.

A sampler draws the round's cohort from the client ids available in that round, from its own generator
(:mod:`fedsim.round.randomness`: ``(seed, round, STREAM_SAMPLING)`` when seeded, the operating system
otherwise), so the cohort does not depend on call order or worker count.

==============  =========================================================  ====================
name            cohort                                                     neighbouring relation
==============  =========================================================  ====================
poisson         each client independently with probability q               add/remove one client
fixed           exactly ``clients_per_round`` clients, uniformly            replace one client
all             everyone                                                   add/remove one client
cyclic          the clients split into ``b`` fixed groups by the seed;     add/remove one client
                round t trains group ``t mod b`` (optionally each member
                with probability q): a client takes part once every b
min-separation  each client whose last round is at least ``b`` rounds ago  add/remove one client
                (and that has taken part fewer than ``k`` times) with
                probability q
==============  =========================================================  ====================

``cyclic`` and ``min-separation`` are participation schedules (:class:`ScheduledSampler`): they bound how often one
client takes part (at most ``k`` times, at least ``min_separation`` rounds apart), which is what correlated-noise
mechanisms (tree aggregation, banded matrix factorization, BLT) need to be accounted. Their rounds are not
accounted one at a time: the strategy records the schedule's release (:class:`fedsim.privacy.ScheduledGaussian`),
whose sensitivity comes from the noise mechanism's strategy matrix for the participation patterns the schedule
allows. The sampler checks every cohort it returns against the schedule and keeps each client's last round and
number of rounds (:meth:`Sampler.state_dict`, so a resumed run keeps enforcing it).

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

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedsim.validation import PrivacyInputError, cohort_values, is_int, one_of

from .randomness import STREAM_SAMPLING, SeededState, make_component, make_rng, register_component

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


def public_population(m: Any) -> int:
    """The population size a scheme's public constants come from: ``m.public_population``, fixed before the run (the
    sampling probability when a cohort size is given, and the aggregate's denominator), else ``m.population``.

    Under add/remove neighbours the realised population is what one client changes, so nothing released may depend
    on it: a run fixes its public population before its first round (:class:`fedsim.strategies.DPFedAvg`'s
    ``population``) and every released quantity is computed from that; the accounting stays over the clients actually
    sampled from. A mechanism without one (``fedsim privacy``, a ledger written before the field existed, a strategy
    told no population) treats its population as public: zero-out neighbours, accounted exactly as add/remove."""
    pub = getattr(m, "public_population", None)
    return int(pub) if pub is not None else int(m.population)


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

    #: the seed of the cohorts' generator (simulation); ``None``: the operating system's entropy
    seed: int | None = None
    #: the scheme's name in the registry (:data:`SAMPLERS`), which a scenario's ``privacy.sampling`` gives
    name: ClassVar[str] = ""
    #: the neighbouring relation a round of this scheme is accounted under
    neighbouring: ClassVar[str] = ADD_REMOVE
    #: one line for reports and ``--help``
    label: ClassVar[str] = ""
    #: whether this scheme is a participation schedule (:class:`ScheduledSampler`), accounted over the schedule
    scheduled: ClassVar[bool] = False
    #: whether every client takes part in every round (a schedule of one group: noise correlated across rounds is
    #: accounted over it without a participation schedule)
    everyone: ClassVar[bool] = False

    # ------------------------------------------------------------------ the cohort's description
    @classmethod
    def check_schedule(
        cls, min_separation: Any = None, max_participations: Any = None
    ) -> tuple[int | None, int | None]:
        """Check the schedule's parameters; return ``(min_separation, max_participations)`` normalised. A scheme
        that is not a schedule takes neither."""
        for name, value in (("min_separation", min_separation), ("max_participations", max_participations)):
            if value is not None:
                raise PrivacyInputError(
                    name,
                    value,
                    f"is a participation schedule's parameter; sampling={cls.name!r} takes none (schedules: "
                    f"{', '.join(n for n, c in SAMPLERS.items() if c.scheduled)})",
                )
        return None, None

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
        """The probability that a given client takes part in a round: the rate, or the expected cohort over the
        public population (:func:`public_population`), never over the realised one."""
        return m.sampling_rate if m.sampling_rate is not None else m.clients_per_round / public_population(m)

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        """Clients per round (the aggregate's denominator, a public number): the expected cohort size, from the
        public population (:func:`public_population`)."""
        return (
            m.clients_per_round if m.clients_per_round is not None else m.sampling_rate * public_population(m)
        )

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
        """The smallest population over which ``m``'s cohort can be drawn: a cohort given as ``clients_per_round``
        (an expected size under Poisson sampling, ``q = clients_per_round / population <= 1``) needs at least that
        many clients; a rate, one."""
        return max(1, int(m.clients_per_round)) if m.clients_per_round is not None else 1

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
        return make_rng(self.seed, self.stream_round(round_), STREAM_SAMPLING)

    def draw(self, ids: np.ndarray, rng: Any, m: Any) -> np.ndarray:
        """The cohort from the sorted ids: each client independently with probability ``q``."""
        return ids[rng.random(ids.size) < self.q(m)]

    def sample(self, round_: int, client_ids: Any, mechanism: Any) -> np.ndarray:
        """Round ``round_``'s cohort from ``client_ids`` for ``mechanism`` (a :class:`fedsim.privacy.Mechanism`
        over exactly these clients: the probability it accounts is the one sampled with)."""
        return self.draw(self.checked_ids(client_ids, mechanism), self.rng(round_), mechanism)

    def checked_ids(self, client_ids: Any, mechanism: Any) -> np.ndarray:
        """The sorted ids, checked against ``mechanism``: this scheme, over exactly these clients."""
        ids = id_array(client_ids)
        if mechanism.sampling != self.name or mechanism.population != ids.size:
            raise ValueError(
                f"a {self.name!r} sampler over {ids.size} clients cannot draw for a {mechanism.sampling!r} "
                f"mechanism over {mechanism.population}: sampling and accounting must use the same population"
            )
        return ids


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
    def q(cls, m: Any) -> float:
        # drawn without replacement from the clients actually offered: replace-one neighbours keep their number
        return cls.expected_cohort(m) / m.population

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        if m.clients_per_round is not None:
            return m.clients_per_round
        return int(round(m.sampling_rate * public_population(m)))

    @classmethod
    def min_population(cls, m: Any) -> int:
        return max(1, int(cls.expected_cohort(m)))

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
    everyone = True

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
        return public_population(m)

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


#: the tag of the generator that splits the clients into cyclic groups (its own stream: never a round's cohort draw)
_GROUPS_TAG = 1


def _schedule_value(name: str, value: Any, low: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value) or value < low:
        raise PrivacyInputError(name, value, f"must be an integer >= {low}")
    return int(value)


@dataclass
class ScheduledSampler(Sampler):
    """A participation schedule: one client takes part at most ``max_participations`` times, at least
    ``min_separation`` rounds apart (the mechanism's :attr:`~fedsim.privacy.Mechanism.min_separation` and
    :attr:`~fedsim.privacy.Mechanism.max_participations`). A subclass draws the cohort (:meth:`draw_scheduled`);
    :meth:`sample` then checks it against the schedule, whatever drew it, and records it. A cohort that breaks
    the schedule is an error, never a round: the accounting assumes the schedule."""

    scheduled: ClassVar[bool] = True
    #: whether Poisson sampling within the schedule may be accounted as amplification (cyclic groups, where each
    #: participation is an independent draw in the client's own rounds; Choquette-Choo et al. 2023)
    amplifies: ClassVar[bool] = False
    #: each client's last round and number of rounds so far (the history the schedule is enforced on)
    last: dict[int, int] = field(default_factory=dict, repr=False)
    count: dict[int, int] = field(default_factory=dict, repr=False)
    last_round: int = 0

    @classmethod
    def check_cohort(cls, sampling_rate=None, clients_per_round=None, population=None):
        rate, cpr = cohort_values(sampling_rate, clients_per_round, population)
        if cpr is not None:
            raise PrivacyInputError(
                "clients_per_round",
                clients_per_round,
                f"must be omitted for sampling={cls.name!r}: the schedule decides who may take part; give "
                "sampling_rate, the probability that a client who may take part does",
            )
        return rate, None

    @classmethod
    def q(cls, m: Any) -> float:
        """The probability that a client who may take part in a round does (1 without ``sampling_rate``)."""
        return m.sampling_rate if m.sampling_rate is not None else 1.0

    @classmethod
    def rate_is_fixed(cls, m: Any) -> bool:
        return True

    @classmethod
    def at_population(cls, m: Any, population: int) -> Any:
        return m.replace(population=population, sampling_rate=m.sampling_rate)

    @classmethod
    def dp_event(cls, m: Any, gaussian: Any, relation: str) -> Any:
        raise PrivacyInputError(
            "sampling",
            cls.name,
            "is a participation schedule: its rounds are accounted over the schedule (a "
            "fedsim.privacy.ScheduledGaussian release per round, from the noise mechanism's sensitivity under the "
            "schedule), not one round at a time",
        )

    @classmethod
    def pld_parameters(cls, m: Any, relation: str) -> tuple[float, float, str]:
        cls.dp_event(m, None, relation)
        raise AssertionError  # pragma: no cover - dp_event raises

    # ------------------------------------------------------------------ drawing and enforcing
    def draw_scheduled(self, ids: np.ndarray, round_: int, m: Any) -> np.ndarray:
        raise NotImplementedError

    def may_take_part(self, ids: np.ndarray, round_: int, m: Any) -> np.ndarray:
        """A mask over ``ids``: whether each client may take part in round ``round_`` under the schedule."""
        sep, k = m.min_separation, m.max_participations
        last = np.array([self.last.get(int(c), -(10**12)) for c in ids], dtype=np.int64)
        ok = round_ - last >= sep
        if k is not None:
            ok &= np.array([self.count.get(int(c), 0) for c in ids], dtype=np.int64) < k
        return ok

    def sample(self, round_: int, client_ids: Any, mechanism: Any) -> np.ndarray:
        ids = self.checked_ids(client_ids, mechanism)
        if round_ <= self.last_round:
            raise ValueError(
                f"round {round_} is sampled after round {self.last_round}: a participation schedule draws its "
                "rounds once each, in order"
            )
        cohort = self.draw_scheduled(ids, int(round_), mechanism)
        allowed = self.may_take_part(cohort, int(round_), mechanism)
        if not np.all(allowed):
            bad = [int(c) for c in cohort[~allowed][:5]]
            raise PrivacyInputError(
                "cohort",
                bad,
                f"took part in round {round_} against the schedule (at most "
                f"{mechanism.max_participations or 'any number of'} rounds, at least {mechanism.min_separation} "
                "apart) that the accounting assumes",
            )
        for c in cohort:
            c = int(c)
            self.last[c] = int(round_)
            self.count[c] = self.count.get(c, 0) + 1
        self.last_round = int(round_)
        return cohort

    def extra_state(self) -> dict[str, Any]:
        ids = np.array(sorted(self.last), dtype=np.int64)
        return {
            "last_round": self.last_round,
            "clients": ids,
            "last": np.array([self.last[int(c)] for c in ids], dtype=np.int64),
            "count": np.array([self.count[int(c)] for c in ids], dtype=np.int64),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        ids = np.asarray(state.get("clients", []), dtype=np.int64)
        self.last = dict(
            zip(ids.tolist(), np.asarray(state.get("last", []), dtype=np.int64).tolist(), strict=True)
        )
        self.count = dict(
            zip(ids.tolist(), np.asarray(state.get("count", []), dtype=np.int64).tolist(), strict=True)
        )
        self.last_round = int(state.get("last_round", 0))


@dataclass
class CyclicSampler(ScheduledSampler):
    """Cyclic participation (Choquette-Choo et al. 2023; Gboard's DP-FTRL): the clients are split once into ``b``
    groups, ``b = min_separation``, each client independently and uniformly (from its own seeded generator, or the
    operating system's entropy): so one client's presence moves no other client, which the add/remove accounting
    needs (balanced groups cut from a permutation would shift everyone after it), and the sizes vary around
    ``N / b`` (the aggregate's denominator is the expected cohort ``q N / b``, a public number); round ``t`` (from 1) trains group ``(t - 1) mod b``, each member with
    probability ``sampling_rate`` (default: the whole group). A client takes part at most ``ceil(T / b)`` times in
    ``T`` rounds, exactly ``b`` apart. The groups are fixed over the ids of the first round: a later round offering
    other clients is refused (in a deployment, keep stable client ids over the nodes, as
    :class:`fedsim.flower.ClientIdGrid` does)."""

    name = "cyclic"
    label = "b fixed groups in turn (b = min_separation), each member with probability q"
    amplifies = True
    groups: dict[int, int] = field(default_factory=dict, repr=False)

    @classmethod
    def check_schedule(cls, min_separation=None, max_participations=None):
        if min_separation is None:
            raise PrivacyInputError(
                "min_separation", None, "sampling='cyclic' needs it: the number of groups b (>= 1)"
            )
        if max_participations is not None:
            raise PrivacyInputError(
                "max_participations",
                max_participations,
                "must be omitted for sampling='cyclic' (a client takes part every b-th round: ceil(rounds/b) times)",
            )
        return _schedule_value("min_separation", min_separation, 1), None

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        return cls.q(m) * public_population(m) / m.min_separation

    @classmethod
    def min_population(cls, m: Any) -> int:
        return int(m.min_separation)

    @classmethod
    def describe(cls, m: Any) -> str:
        inner = "" if m.sampling_rate is None else f", q={m.sampling_rate:.4g} within the group"
        return f"cyclic b={m.min_separation}{inner}"

    def _split(self, ids: np.ndarray, m: Any) -> None:
        b = int(m.min_separation)
        if ids.size < b:
            raise PrivacyInputError(
                "min_separation", b, f"must be at most the number of clients ({ids.size}): b groups of them"
            )
        if self.seed is None:
            u = make_rng(None, 0, STREAM_SAMPLING).random(ids.size)
        else:  # each client's group from its own generator: the same whoever else is there
            u = np.array([make_rng(self.seed, 0, STREAM_SAMPLING, _GROUPS_TAG, int(c)).random() for c in ids])
        self.groups = {
            int(c): int(g) for c, g in zip(ids, np.minimum((u * b).astype(np.int64), b - 1), strict=True)
        }

    def draw_scheduled(self, ids: np.ndarray, round_: int, m: Any) -> np.ndarray:
        if not self.groups:
            self._split(ids, m)
        elif len(self.groups) != ids.size or any(int(c) not in self.groups for c in ids):
            raise PrivacyInputError(
                "sampling",
                "cyclic",
                f"round {round_} offers {ids.size} clients, not the {len(self.groups)} its groups were drawn over: "
                "a cyclic schedule needs the same clients every round (map nodes to stable client ids, or use "
                "sampling='min-separation', which enforces the separation over whichever clients are offered)",
            )
        group = (round_ - 1) % int(m.min_separation)
        members = np.array([c for c in ids if self.groups[int(c)] == group], dtype=ids.dtype)
        if m.sampling_rate is None:
            return members
        return members[self.rng(round_).random(members.size) < m.sampling_rate]

    def extra_state(self) -> dict[str, Any]:
        ids = np.array(sorted(self.groups), dtype=np.int64)
        return {
            **super().extra_state(),
            "group_clients": ids,
            "group": np.array([self.groups[int(c)] for c in ids], dtype=np.int64),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        ids = np.asarray(state.get("group_clients", []), dtype=np.int64)
        self.groups = dict(
            zip(ids.tolist(), np.asarray(state.get("group", []), dtype=np.int64).tolist(), strict=True)
        )


@dataclass
class MinSeparationSampler(ScheduledSampler):
    """Any client whose last round was at least ``b = min_separation`` rounds ago and that has taken part fewer than
    ``max_participations`` times (if given) takes part with probability ``sampling_rate``, independently. Works over
    whichever clients a round offers (nodes may come and go). No amplification by the sampling is claimed: the
    accounting takes the worst pattern the schedule allows. The aggregate's denominator is the steady-state
    expected cohort ``q N / (1 + q (b - 1))`` (a client waits ``1/q`` rounds on average, then sits out ``b - 1``),
    a public number."""

    name = "min-separation"
    label = "each client at least min_separation rounds after its last, with probability q"

    @classmethod
    def check_cohort(cls, sampling_rate=None, clients_per_round=None, population=None):
        rate, _ = super().check_cohort(sampling_rate, clients_per_round, population)
        if rate is None:
            raise PrivacyInputError(
                "sampling_rate", None, "sampling='min-separation' needs it: the probability q in (0, 1]"
            )
        return rate, None

    @classmethod
    def check_schedule(cls, min_separation=None, max_participations=None):
        if min_separation is None:
            raise PrivacyInputError(
                "min_separation",
                None,
                "sampling='min-separation' needs it: the least gap b (>= 1) between rounds",
            )
        k = (
            None
            if max_participations is None
            else _schedule_value("max_participations", max_participations, 1)
        )
        return _schedule_value("min_separation", min_separation, 1), k

    @classmethod
    def expected_cohort(cls, m: Any) -> float:
        q = cls.q(m)
        return q * public_population(m) / (1.0 + q * (m.min_separation - 1))

    @classmethod
    def describe(cls, m: Any) -> str:
        cap = "" if m.max_participations is None else f", k={m.max_participations}"
        return f"min-separation b={m.min_separation}{cap} q={cls.q(m):.4g}"

    def draw_scheduled(self, ids: np.ndarray, round_: int, m: Any) -> np.ndarray:
        draws = self.rng(round_).random(ids.size) < self.q(m)  # one draw per client, eligible or not
        return ids[draws & self.may_take_part(ids, round_, m)]


#: The one registry of sampling schemes, by name (:func:`register_sampler`).
SAMPLERS: dict[str, type[Sampler]] = {}


def register_sampler(cls: type[Sampler], *, replace: bool = False) -> type[Sampler]:
    """Add a sampling scheme (a :class:`Sampler` subclass with a ``name``) to :data:`SAMPLERS`; usable as a class
    decorator. The scenario schema, :class:`fedsim.privacy.Mechanism` and the strategies accept it from then on."""
    if isinstance(cls, type) and cls.neighbouring not in (ADD_REMOVE, REPLACE_ONE):
        raise ValueError(f"{cls.__name__}.neighbouring must be {ADD_REMOVE!r} or {REPLACE_ONE!r}")
    return register_component(SAMPLERS, cls, Sampler, replace=replace)


for _cls in (PoissonSampler, FixedSizeSampler, EveryoneSampler, CyclicSampler, MinSeparationSampler):
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
    if cls.scheduled:
        raise PrivacyInputError(
            "sampling",
            sampling,
            "is a participation schedule: draw its cohorts with a Sampler over the rounds",
        )
    m = SimpleNamespace(population=int(ids.size), sampling_rate=rate, clients_per_round=cpr)
    return cls(None).draw(ids, rng, m)
