"""What one federated round releases, as a frozen, validated description.

Conventions (see ``shared/reference/privacy-formulas.md``):

* Each sampled client's update is clipped to L2 norm ``clip``; noise of scale ``noise_multiplier * clip``
  (``noise_std``: for Gaussian noise, its std) is added to the **sum** of clipped updates, and the sum divided by
  the expected cohort size (``expected_cohort``), never by the realised count. The expected cohort (and the
  sampling probability, when a cohort size is given) comes from the **public population**
  (``public_population``): a number fixed before the run, never the realised population, which one client
  changes under add/remove neighbours (McMahan et al.'s fixed-denominator estimator). ``population`` is the
  realised number of clients sampled from: the accounting is over it (it matters for fixed-size sampling only).
* The neighbouring relation follows the sampling scheme: Poisson sampling and "everyone" are
  accounted under add/remove-one-client (L2 sensitivity of the sum = ``clip``); fixed-size sampling
  without replacement under replace-one-client (L2 sensitivity of the sum = the diameter of one
  client's contribution, ``2*clip`` by default; the papers' ``D``).
* Non-model releases (e.g. adaptive clipping's noised count of 0/1 bits, or per-domain loss sums
  in agnostic FL) are described by the same class: ``clip`` is the bound on one client's
  contribution (1 for a bit or a loss in [0, 1]) and ``diameter`` the largest change when one
  client's contribution is replaced (1 for a bit or a loss in [0, 1]; default ``2*clip``, which is
  right for a vector in an L2 ball). Under add/remove the sensitivity is ``clip``; under
  replace-one it is ``diameter``.
* ``noise_kind`` names the distribution (``"gaussian"`` unless the run's noise mechanism draws another,
  :attr:`fedsim.round.NoiseSource.noise_kind`). The Gaussian events, PLDs and closed forms below describe Gaussian
  rounds only and refuse any other: another kind of round is accounted by the release its mechanism records
  (:meth:`fedsim.round.NoiseSource.dp_release`).
* ``noise_placement="distributed"`` (each sampled client adds a share of the noise, the server the shares missing
  below the expected cohort) is accounted exactly like central noise of the same scale. That assumes honest
  clients whose shares add up to it; see :attr:`caveats`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from fedsim.round.noise import NOISE_PLACEMENTS, Placement, placement
from fedsim.round.sampling import ADD_REMOVE, REPLACE_ONE, Sampler, sampler_class
from fedsim.validation import PrivacyInputError, is_int, noise_and_clip, positive_finite

__all__ = ["NOISE_PLACEMENTS", "ZERO_OUT", "Mechanism", "compose_same_cohort"]

#: the relation of a guarantee whose population size is public (:attr:`Mechanism.relation`)
ZERO_OUT = "zero-out"

#: fields saved only when set (a participation schedule's; the public population), so a ledger of other rounds is
#: saved exactly as before they existed
OPTIONAL_FIELDS = ("min_separation", "max_participations", "public_population")
#: the noise a :class:`Mechanism` describes unless it says otherwise (saved only when it is another)
GAUSSIAN = "gaussian"


@dataclass(frozen=True)
class Mechanism:
    """One round's release: sampling, clipping and Gaussian noise on the sum of clipped updates.

    Exactly one of ``sampling_rate`` and ``clients_per_round`` is given for ``poisson`` (the rate
    ``q``, or the expected cohort ``q*population``) and for ``fixed`` (the cohort size ``tau``, or
    ``tau/population``, which must then be a whole number of clients); neither for ``all`` (a value
    consistent with everyone, rate 1 or ``clients_per_round == population``, is accepted).

    A participation schedule (``cyclic``, ``min-separation``) also takes ``min_separation`` (``b``: the groups of a
    cyclic schedule, the least gap between one client's rounds otherwise) and, for ``min-separation``,
    ``max_participations`` (``k``); ``sampling_rate`` is then the probability that a client who may take part
    does. Such a round is accounted over its schedule (:class:`fedsim.privacy.ScheduledGaussian`), not alone.

    ``public_population``: the population size fixed before the run, from which the public constants come (the
    denominator, and ``q = clients_per_round / public_population``); ``None``: ``population`` is itself public
    (zero-out neighbours, :attr:`relation`).
    """

    population: int
    sampling: str = "poisson"
    sampling_rate: float | None = None
    clients_per_round: int | None = None
    clip: float = 1.0
    noise_multiplier: float = 1.0
    noise_placement: str = "central"
    diameter: float | None = None
    min_separation: int | None = None
    max_participations: int | None = None
    public_population: int | None = None
    noise_kind: str = GAUSSIAN

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        if not isinstance(self.noise_kind, str) or not self.noise_kind:
            raise PrivacyInputError(
                "noise_kind", self.noise_kind, "must be a non-empty string (e.g. 'gaussian')"
            )
        if not is_int(self.population) or self.population < 1:
            raise PrivacyInputError("population", self.population, "must be an integer >= 1")
        if self.public_population is not None:
            if not is_int(self.public_population) or self.public_population < 1:
                raise PrivacyInputError(
                    "public_population",
                    self.public_population,
                    "must be an integer >= 1 (the population size fixed before the run) or None",
                )
            object.__setattr__(self, "public_population", int(self.public_population))
        scheme = sampler_class(self.sampling)
        placement(self.noise_placement)
        clip, z = noise_and_clip(self.clip, self.noise_multiplier)
        object.__setattr__(self, "clip", clip)
        object.__setattr__(self, "noise_multiplier", z)
        if self.diameter is not None:
            d = positive_finite("diameter", self.diameter)
            if d > 2 * self.clip * (1 + 1e-12):
                raise PrivacyInputError(
                    "diameter", self.diameter, f"must be in (0, 2*clip] = (0, {2 * self.clip:g}]"
                )
            object.__setattr__(self, "diameter", d)
        rate, cpr = scheme.check_cohort(
            self.sampling_rate,
            self.clients_per_round,
            self.population if self.public_population is None else self.public_population,
        )
        object.__setattr__(self, "sampling_rate", rate)
        object.__setattr__(self, "clients_per_round", cpr)
        sep, k = scheme.check_schedule(self.min_separation, self.max_participations)
        object.__setattr__(self, "min_separation", sep)
        object.__setattr__(self, "max_participations", k)
        if sep is not None and self.population < scheme.min_population(self):
            raise PrivacyInputError(
                "min_separation",
                sep,
                f"must be at most the population ({self.population}) for {self.sampling!r}",
            )

    # ------------------------------------------------------------------ derived quantities
    @property
    def scheme(self) -> type[Sampler]:
        """The sampling scheme (:mod:`fedsim.round.sampling`): it owns ``q``, the expected cohort, the neighbouring
        relation, the dp-accounting event and the PLD parameters of this round."""
        return sampler_class(self.sampling)

    @property
    def q(self) -> float:
        """Sampling probability: the rate (poisson), ``tau/population`` (fixed), 1 (all)."""
        return self.scheme.q(self)

    @property
    def tau(self) -> float:
        """Clients per round: ``tau`` (fixed), ``population`` (all), ``q*population`` (poisson)."""
        return self.scheme.expected_cohort(self)

    @property
    def expected_cohort(self) -> float:
        """The aggregate's denominator: ``q*population`` (poisson), ``tau`` (fixed), ``population`` (all)."""
        return self.tau

    @property
    def neighbouring(self) -> str:
        """``"add-remove"`` (poisson, all) or ``"replace-one"`` (fixed): the scheme's relation."""
        return self.scheme.neighbouring

    @property
    def relation(self) -> str:
        """The neighbouring relation the guarantee is stated for: :attr:`neighbouring`, except that an add/remove
        mechanism without a public population (:attr:`public_population` None) computes its public constants from
        the realised population, which is then public: ``"zero-out"`` (a client's data replaced by one that
        contributes nothing), accounted with the same numbers as add/remove."""
        if self.neighbouring == ADD_REMOVE and self.public_population is None:
            return ZERO_OUT
        return self.neighbouring

    @property
    def replace_sensitivity(self) -> float:
        """L2 change of the sum when one client's contribution is replaced (``diameter``, default 2*clip)."""
        return self.diameter if self.diameter is not None else 2.0 * self.clip

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the SUM under :attr:`neighbouring`: ``clip`` or the diameter (2*clip)."""
        return self.replace_sensitivity if self.neighbouring == "replace-one" else self.clip

    @property
    def private(self) -> bool:
        """Whether this release is differentially private at all: ``noise_multiplier = 0`` (the non-private
        baseline) and ``clip = 0`` (plain FedAvg) are not, and every accountant reports epsilon = infinity."""
        return self.noise_multiplier > 0 and self.clip > 0

    @property
    def noise_std(self) -> float:
        """Std of the Gaussian added to the sum of clipped updates: ``noise_multiplier * clip``."""
        return self.noise_multiplier * self.clip

    @property
    def normalized_noise(self) -> float:
        """Noise std divided by :attr:`sensitivity`: dp-accounting's noise multiplier for the event."""
        return self.noise_std / self.sensitivity if self.private else 0.0

    @property
    def placement(self) -> Placement:
        """Where the noise is added (:data:`fedsim.round.PLACEMENTS`): by the server, or as the clients' shares."""
        return placement(self.noise_placement)

    @property
    def gaussian(self) -> bool:
        """Whether its noise is Gaussian, so that the Gaussian events, PLDs and closed forms describe it."""
        return self.noise_kind == GAUSSIAN

    def _require_gaussian(self, what: str) -> None:
        if not self.gaussian:
            raise PrivacyInputError(
                "noise_kind",
                self.noise_kind,
                f"{what} describes Gaussian noise; a {self.noise_kind!r} round is accounted by its mechanism's own "
                "release (NoiseSource.dp_release), never as Gaussian",
            )

    @property
    def caveats(self) -> tuple[str, ...]:
        caveat = self.placement.caveat
        return () if caveat is None else (caveat,)

    def sampling_key(self) -> tuple:
        """Identifies the cohort draw: releases with the same key in one round share the sampled cohort."""
        return (
            self.sampling,
            self.population,
            round(self.q, 15),
            self.neighbouring,
            self.min_separation,
            self.max_participations,
        )

    # ------------------------------------------------------------------ conversions
    def to_dp_event(self, relation: str | None = None):
        """The dp-accounting event of ONE round, under ``relation`` (default: :attr:`neighbouring`): a
        ``GaussianDpEvent`` whose noise multiplier is relative to the sensitivity under ``relation`` (``clip``, or the
        replace-one sensitivity ``D = 2*clip``), sampled as the scheme samples (:meth:`Sampler.dp_event`):

        * poisson: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (add/remove, sensitivity clip);
        * fixed: ``SampledWithoutReplacementDpEvent(population, tau, GaussianDpEvent(z*clip/D))``
          (replace-one; with ``tau = population`` it is the Gaussian mechanism with sensitivity ``2*clip``, which
          the test suite checks against the exact Gaussian);
        * all: ``GaussianDpEvent(z)``; under replace-one (a ledger that also holds fixed-size rounds)
          ``GaussianDpEvent(z*clip/D)``, the Gaussian with the replace-one sensitivity.

        A Poisson round has no dp-accounting event under replace-one: :class:`PrivacyInputError`.
        """
        from dp_accounting import dp_event  # dp-accounting is loaded on first accounting, not at import

        self._require_gaussian("Mechanism.to_dp_event")
        relation = relation or self.neighbouring
        sensitivity = self.replace_sensitivity if relation == REPLACE_ONE else self.clip
        return self.scheme.dp_event(self, dp_event.GaussianDpEvent(self.noise_std / sensitivity), relation)

    def pld_parameters(self, relation: str | None = None) -> tuple[float, float, str]:
        """``(standard_deviation, sampling_prob, dp-accounting relation name)`` of one round's PLD with sensitivity 1
        under ``relation`` (default: :attr:`neighbouring`), from the scheme (:meth:`Sampler.pld_parameters`)."""
        self._require_gaussian("Mechanism.pld_parameters")
        return self.scheme.pld_parameters(self, relation or self.neighbouring)

    def at_population(self, population: int) -> Mechanism:
        """This mechanism over another population, keeping what was given (the rate, or the clients per round)."""
        return self.scheme.at_population(self, int(population))

    def igmm_params(self) -> dict:
        """The papers' parameters: ``N``, ``tau``, ``sigma = z*clip/tau`` (noise on the average), ``D``."""
        self._require_gaussian("the papers' closed forms")
        tau = self.tau
        return dict(
            N=self.population,
            tau=tau,
            sigma=self.noise_multiplier * self.clip / tau,
            D=self.replace_sensitivity,
        )

    def replace(self, **changes) -> Mechanism:
        """A new validated mechanism with some fields changed (e.g. the clip of adaptive clipping).

        Changing ``sampling_rate`` clears ``clients_per_round`` and vice versa, unless both are given.
        """
        if "sampling_rate" in changes and "clients_per_round" not in changes:
            changes["clients_per_round"] = None
        if "clients_per_round" in changes and "sampling_rate" not in changes:
            changes["sampling_rate"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Its fields; a participation schedule's (``min_separation``, ``max_participations``) and the public
        population only when set, so a ledger of other rounds is saved exactly as before they existed."""
        d = dataclasses.asdict(self)
        for key in OPTIONAL_FIELDS:
            if d[key] is None:
                del d[key]
        if d["noise_kind"] == GAUSSIAN:
            del d["noise_kind"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Mechanism:
        return from_fields(cls, d, "mechanism")


def from_fields(cls: type, d: dict, name: str) -> object:
    """The dataclass ``cls`` from its saved fields ``d``; an unknown field is a :class:`PrivacyInputError` naming it
    (a ledger written by another version, or edited)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
        raise PrivacyInputError(name, sorted(unknown), f"unknown fields; allowed: {sorted(fields)}")
    return cls(**d)


def compose_same_cohort(mechanisms: Iterable[Mechanism]) -> Mechanism:
    """Several Gaussian releases computed on the SAME sampled cohort, as one equivalent mechanism.

    With independent noise, releases with normalised noise multipliers ``z_i`` (noise std over
    sensitivity) are jointly one Gaussian mechanism with
    ``z_eff = (sum_i z_i^-2)^(-1/2)`` (scale each coordinate block by 1/std_i: the L2 sensitivity of
    the concatenation is ``sqrt(sum_i (Delta_i/s_i)^2)``). Composing before sampling is exact for the
    worst case. Accounting the releases as separately sampled events would UNDER-report epsilon: each
    would get its own amplification by sampling although the same clients are in all of them (the
    test suite shows the gap). The result keeps the first mechanism's clip and diameter and carries
    ``z_eff`` relative to them.
    """
    mechs = list(mechanisms)
    if not mechs:
        raise PrivacyInputError("mechanisms", mechs, "need at least one release")
    key = mechs[0].sampling_key()
    for m in mechs[1:]:
        if m.sampling_key() != key:
            raise PrivacyInputError(
                "mechanisms", m.sampling_key(), f"releases composed on one cohort must share sampling {key}"
            )
    if len(mechs) == 1:
        return mechs[0]
    for m in mechs:
        m._require_gaussian("compose_same_cohort")
    if not all(m.private for m in mechs):  # one un-noised release on the cohort: the round is not private
        return dataclasses.replace(mechs[0], noise_multiplier=0.0)
    z_eff = sum(m.normalized_noise**-2 for m in mechs) ** -0.5
    first = mechs[0]
    # noise_multiplier such that noise_std / sensitivity == z_eff for the first mechanism's geometry
    z = z_eff * first.sensitivity / first.clip
    return dataclasses.replace(first, noise_multiplier=z)
