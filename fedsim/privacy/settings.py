"""A run's privacy settings as one validated, frozen object, and the one place that says what works with what.

:class:`PrivacySettings` is the scenario's ``[privacy]`` table (or a Python caller's keywords) checked once: the
strategy, the engines' ``auto`` pick, the sweep and ``fedsim privacy`` take the round's
:class:`~fedsim.privacy.Mechanism` from :meth:`PrivacySettings.mechanism_at` and the noise mechanism from
:meth:`PrivacySettings.noise_source`; nothing rebuilds them from loose fields.

Every rule about combinations lives here, asked by the schema (through :class:`PrivacySettings`), the strategy,
``--resume`` (:func:`resume_refusal`) and the deployed ServerApp (:func:`deployment_refusal`), each refusal with
one message. What a noise mechanism supports it declares itself (:class:`fedsim.round.NoiseSource`: ``placements``,
``correlated``, ``single_release``, ``accountants``, ``fixed_for_rounds``); the rules below ask those declarations,
never a mechanism's name. See ``docs/architecture.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedsim.labels import see_docs
from fedsim.round.mechanism_options import check_mechanism_options
from fedsim.round.noise import NOISE_SOURCES, NoiseSource, make_noise_source, placement
from fedsim.round.sampling import ADD_REMOVE, Sampler, make_sampler, sampler_class
from fedsim.validation import (
    PrivacyInputError,
    composed_noise_multiplier,
    noise_and_clip,
    noise_multiplier_value,
    one_of,
    open_unit,
    positive_finite,
)

from .accountants import CERTIFIED_KIND, DEFAULT_ACCOUNTANT, validate_method
from .mechanism import Mechanism

__all__ = [
    "AdaptiveClipping",
    "PrivacySettings",
    "SecureAggregation",
    "check_combination",
    "deployment_refusal",
    "resume_refusal",
]

#: the mechanism a run uses when none is named: independent Gaussian noise every round
DEFAULT_MECHANISM = "independent"


@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation (SecAgg+, Bell, Bengtson, Ito, Raykova and Wichs, CCS 2020) of the clients' encodings: the
    server learns only their sum modulo ``2^bits``, so distributed noise protects each client against the server too.

    ``neighbours``: ``k``, how many other clients each client shares its secrets with (even: ``k/2`` on each side of a
    random ring, the Harary graph of SecAgg+); 0, or ``k`` at least the round's cohort minus one: every other client
    (full SecAgg, Bonawitz et al. 2017). ``threshold``: the fraction of a client's ``k + 1`` share holders (its
    neighbours and itself) needed to reconstruct its secrets, in (0.5, 1]: a majority, so no minority of colluding
    share holders can unmask it; it is also how many must survive for a round to complete (fewer: the round is
    aborted and nothing is released). ``dropout``: simulation only, the probability that a sampled client drops after
    sharing its keys (its masks are then removed with its neighbours' shares), so a sweep predicts what a deployment
    with such dropouts releases; a deployment has real dropouts and refuses this.
    """

    neighbours: int = 0
    threshold: float = 0.6
    dropout: float = 0.0

    def __post_init__(self) -> None:
        k = self.neighbours
        if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k % 2:
            raise PrivacyInputError(
                "secagg.neighbours", k, "must be an even integer >= 0 (0: every other client, full SecAgg)"
            )
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.5 < float(t) <= 1.0:
            raise PrivacyInputError(
                "secagg.threshold",
                t,
                "must be a fraction in (0.5, 1] of a client's share holders (a majority, so that no minority of "
                "colluding holders can reconstruct its secrets)",
            )
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0.0 <= float(d) < 1.0:
            raise PrivacyInputError("secagg.dropout", d, "must be a probability in [0, 1)")
        object.__setattr__(self, "threshold", float(t))
        object.__setattr__(self, "dropout", float(d))

    def degree(self, clients: int) -> int:
        """``k`` for a round of ``clients`` clients: ``neighbours``, or ``clients - 1`` (full SecAgg)."""
        full = max(int(clients) - 1, 0)
        return full if self.neighbours == 0 or self.neighbours >= full else self.neighbours

    def shares_needed(self, clients: int) -> int:
        """``t``: how many of a client's ``k + 1`` share holders must answer to reconstruct one of its secrets: the
        ``threshold`` fraction, and always a strict majority of the holders and at least 2 (the clients refuse less)."""
        holders = self.degree(clients) + 1
        return max(2, holders // 2 + 1, math.ceil(self.threshold * holders - 1e-9))


@dataclass(frozen=True)
class AdaptiveClipping:
    """Adaptive clipping of Andrew, Thakkar, McMahan and Ramaswamy (NeurIPS 2021).

    After each round the clip moves geometrically toward the ``target_quantile`` of the *unclipped* update
    norms: ``clip <- clip * exp(-learning_rate * (b - target_quantile))`` where ``b`` is the noised fraction
    of cohort clients whose update norm was <= the clip:
    ``b = (sum_i 1[|Delta_i| <= clip] + N(0, count_noise_multiplier^2)) / expected_cohort``.
    The count is a release of its own (sensitivity 1 under add/remove) and is recorded in the ledger beside
    the model release. ``count_noise_multiplier`` defaults to ``expected_cohort / 20`` (the paper's choice).
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_multiplier: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.target_quantile < 1.0:
            raise ValueError(f"target_quantile must be in (0, 1), got {self.target_quantile}")
        if self.learning_rate <= 0:
            raise ValueError(f"adaptive clipping learning_rate must be > 0, got {self.learning_rate}")
        if self.count_noise_multiplier is not None:
            # the range every noise multiplier keeps; 0 is not allowed (the count would be released un-noised)
            z = noise_multiplier_value("count_noise_multiplier", self.count_noise_multiplier, None)
            object.__setattr__(self, "count_noise_multiplier", z)


@dataclass(frozen=True)
class PrivacySettings:
    """What a run releases and how it is accounted, validated once (:func:`check_combination`).

    ``sampling`` (a registered sampler's name), ``sampling_rate`` / ``clients_per_round`` (the cohort, as the scheme
    takes it), ``min_separation`` / ``max_participations`` (a participation schedule), ``clip`` and
    ``noise_multiplier`` (``0``: the non-private baselines), ``noise_placement`` (``central`` or ``distributed``),
    ``mechanism`` (a registered noise mechanism, :data:`fedsim.round.NOISE_SOURCES`) with its ``mechanism_options``
    (the class's own fields), ``adaptive_clipping``, ``delta``, ``accountant`` (a certified one the mechanism can
    account), ``max_epsilon`` (stop before a round that would exceed it), ``target_epsilon`` (what the noise
    multiplier was or will be calibrated to; None: given), ``canaries`` (simulation: canary clients) and
    ``agnostic`` (the run also releases agnostic FL's per-domain losses).
    """

    sampling: str = "poisson"
    sampling_rate: float | None = None
    clients_per_round: int | None = None
    clip: float = 1.0
    noise_multiplier: float = 1.0
    noise_placement: str = "central"
    mechanism: str = DEFAULT_MECHANISM
    mechanism_options: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    min_separation: int | None = None
    max_participations: int | None = None
    adaptive_clipping: AdaptiveClipping | None = None
    delta: float = 1e-5
    accountant: str = DEFAULT_ACCOUNTANT
    max_epsilon: float | None = None
    target_epsilon: float | None = None
    canaries: int = 0
    agnostic: bool = False
    secagg: SecureAggregation | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "mechanism", one_of("mechanism", self.mechanism, tuple(NOISE_SOURCES)))
        # kept as sorted (key, value) pairs: frozen, comparable, and pickled as they are (Ray ships them)
        set_(self, "mechanism_options", tuple(sorted(dict(self.mechanism_options or {}).items())))
        sampler = sampler_class(self.sampling)
        rate, cpr = sampler.check_cohort(self.sampling_rate, self.clients_per_round)
        set_(self, "sampling_rate", rate)
        set_(self, "clients_per_round", cpr)
        sep, k = sampler.check_schedule(self.min_separation, self.max_participations)
        set_(self, "min_separation", sep)
        set_(self, "max_participations", k)
        clip, z = noise_and_clip(self.clip, self.noise_multiplier)
        set_(self, "clip", float(clip))
        set_(self, "noise_multiplier", float(z))
        set_(self, "delta", open_unit("delta", self.delta))
        validate_method(
            self.accountant, "accountant", kind=CERTIFIED_KIND
        )  # what a run reports as its epsilon
        if self.max_epsilon is not None:
            set_(self, "max_epsilon", positive_finite("max_epsilon", self.max_epsilon))
        if self.target_epsilon is not None:
            set_(self, "target_epsilon", positive_finite("target_epsilon", self.target_epsilon))
        if isinstance(self.canaries, bool) or not isinstance(self.canaries, int) or self.canaries < 0:
            raise PrivacyInputError("canaries", self.canaries, "must be an integer >= 0")
        check_combination(self, sampler, self.noise_class)
        # the class's own fields and its own checks of their values (the one check a scenario's table gets too)
        set_(
            self,
            "mechanism_options",
            tuple(sorted(check_mechanism_options(self.mechanism, self.options).items())),
        )

    # ------------------------------------------------------------------ what it builds
    @property
    def options(self) -> dict[str, Any]:
        """The noise mechanism's options (fields of its class), as a new dict."""
        return dict(self.mechanism_options)

    @property
    def noise_class(self) -> type[NoiseSource]:
        """The registered noise mechanism's class: what it draws and what it declares."""
        return NOISE_SOURCES[self.mechanism]

    @property
    def scheme(self) -> type[Sampler]:
        """The registered sampling scheme's class."""
        return sampler_class(self.sampling)

    @property
    def scheduled(self) -> bool:
        """Whether rounds are accounted over a schedule (a participation schedule, correlated noise, or both)."""
        return bool(self.scheme.scheduled or self.noise_class.correlated)

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0 and self.clip > 0

    def noise_source(self, seed: int | None) -> NoiseSource:
        """The run's noise mechanism, seeded (simulation) or from the operating system's entropy (``None``)."""
        return make_noise_source(self.mechanism, seed, **self.options)

    def sampler(self, seed: int | None) -> Sampler:
        """The run's sampler, seeded (simulation) or from the operating system's entropy (``None``)."""
        return make_sampler(self.sampling, seed)

    def mechanism_at(
        self, population: int, *, clip: float | None = None, public_population: int | None = None
    ) -> Mechanism:
        """The round's model release over ``population`` clients (``clip``: the clip applied this round, for adaptive
        clipping; ``public_population``: the population fixed before the run, None: the realised one is public)."""
        return Mechanism(
            population=int(population),
            sampling=self.sampling,
            sampling_rate=self.sampling_rate,
            clients_per_round=self.clients_per_round,
            clip=self.clip if clip is None else float(clip),
            noise_multiplier=self.noise_multiplier,
            noise_placement=self.noise_placement,
            min_separation=self.min_separation,
            max_participations=self.max_participations,
            public_population=public_population,
            noise_kind=self.noise_class.noise_kind,
        )

    def replace(self, **changes: Any) -> PrivacySettings:
        """A new validated object with some settings changed (the calibrated noise multiplier, another cohort).
        Changing ``sampling_rate`` clears ``clients_per_round`` and vice versa, unless both are given."""
        if "sampling_rate" in changes and "clients_per_round" not in changes:
            changes["clients_per_round"] = None
        if "clients_per_round" in changes and "sampling_rate" not in changes:
            changes["sampling_rate"] = None
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------- the rules
def check_combination(settings: Any, sampler: Any, noise: Any) -> None:
    """Refuse the combinations whose accounting does not hold, with one message each. ``settings``: anything with
    the fields of :class:`PrivacySettings`; ``sampler`` and ``noise``: the registered sampler and noise mechanism
    (classes or objects), whose declarations decide."""
    _check_noise(settings, sampler, noise)
    _check_schedule(settings, sampler, noise)
    _check_baselines(settings)
    _check_calibration(settings, noise)
    _check_canaries(settings, sampler)
    _check_secagg(settings, noise)


def _check_secagg(settings: Any, noise: Any) -> None:
    """Secure aggregation sums integers modulo ``2^bits``: the clients must add their own noise and encode it."""
    if getattr(settings, "secagg", None) is None:
        return
    where = placement(settings.noise_placement)
    if not where.clients_add_noise or not noise.encodes:
        encoding = ", ".join(n for n, c in NOISE_SOURCES.items() if c.encodes)
        raise PrivacyInputError(
            "secagg",
            "enabled",
            f"needs noise_placement='distributed' and a mechanism whose clients encode their noised update as "
            f"integers ({encoding}); got noise_placement={where.name!r}, mechanism={noise.name!r}",
        )


def _adaptive(settings: Any) -> bool:
    return getattr(settings, "adaptive_clipping", None) is not None


def _check_noise(settings: Any, sampler: Any, noise: Any) -> None:
    where = placement(settings.noise_placement)
    # correlated noise is central by its schedule's rule (_check_schedule), with that rule's message
    if where.name not in noise.placements and not noise.correlated:
        raise PrivacyInputError(
            "noise_placement",
            where.name,
            f"is not a placement mechanism={noise.name!r} supports (allowed: {', '.join(noise.placements)})",
        )
    allowed = noise.accountants
    if allowed is not None and settings.accountant not in allowed:
        raise PrivacyInputError(
            "accountant",
            settings.accountant,
            f"cannot account mechanism={noise.name!r} ({noise.noise_kind} noise); allowed: {', '.join(allowed)}",
        )
    relations = noise.neighbouring
    if relations is not None and sampler.neighbouring not in relations:
        raise PrivacyInputError(
            "sampling",
            settings.sampling,
            f"is accounted under {sampler.neighbouring!r} neighbours; mechanism={noise.name!r} is accounted under "
            f"{' or '.join(repr(r) for r in relations)} only (use sampling='poisson' or 'all'; "
            f"{see_docs('neighbouring')})",
        )
    gaussian = noise.noise_kind == Mechanism.__dataclass_fields__["noise_kind"].default
    if (noise.single_release or not gaussian) and not noise.correlated:  # correlated: the schedule's message
        what = f"mechanism={noise.name!r} ({noise.noise_kind} noise)"
        if _adaptive(settings):
            raise PrivacyInputError(
                "adaptive_clip",
                True,
                f"is not supported with {what}: adaptive clipping's count is a release of its own, with its own "
                "sensitivity, and this mechanism noises and accounts the model update only",
            )
        if settings.agnostic:
            raise PrivacyInputError(
                "strategy",
                "agnostic",
                f"agnostic FL's per-domain loss releases are releases of their own, with their own sensitivity, "
                f"and {what} noises and accounts the model update only",
            )


def _check_schedule(settings: Any, sampler: Any, noise: Any) -> None:
    """A correlated mechanism needs a participation schedule (or everyone every round): under Poisson or fixed-size
    sampling a client may take part in any round, and the mechanism's sensitivity and amplification by sampling
    are not what its accounting assumes. A schedule or a correlated mechanism is accounted for the model update
    alone, with central noise and a fixed clip."""
    correlated = bool(noise.correlated)
    scheduled = bool(sampler.scheduled)
    if correlated and not scheduled and not sampler.everyone:
        raise PrivacyInputError(
            "sampling",
            sampler.name,
            f"mechanism={noise.name!r} needs a participation schedule that bounds how often one client takes part: "
            "sampling='cyclic' (b groups in turn; min_separation = b) or 'min-separation' (min_separation, "
            f"max_participations), or 'all'; under {sampler.name!r} sampling a client may take part in any round, "
            "so its sensitivity and amplification by sampling would not be what the accounting assumes",
        )
    if not (correlated or scheduled):
        return
    what = f"mechanism={noise.name!r}" if correlated else f"sampling={sampler.name!r}"
    if placement(settings.noise_placement).clients_add_noise:
        raise PrivacyInputError(
            "noise_placement",
            settings.noise_placement,
            f"must be 'central' with {what}: its noise is drawn and combined across rounds by the server",
        )
    if _adaptive(settings):
        raise PrivacyInputError(
            "adaptive_clip",
            True,
            f"is not supported with {what}: the schedule's accounting assumes one clip and one noise std for the "
            "whole run, and covers the model update only (not adaptive clipping's count)",
        )
    if settings.agnostic:
        raise PrivacyInputError(
            "strategy",
            "agnostic",
            f"agnostic FL's per-domain loss releases are not accounted under {what}; use independent noise with "
            "poisson, fixed or all sampling",
        )


def _check_baselines(settings: Any) -> None:
    """What the non-private baselines (``noise_multiplier = 0``; ``clip = 0``, no clipping) cannot be combined
    with: a budget, distributed noise, adaptive clipping; and the noise of one round's releases on one cohort."""
    clip, z = settings.clip, settings.noise_multiplier
    if z == 0 and settings.max_epsilon is not None:
        raise PrivacyInputError(
            "max_epsilon",
            settings.max_epsilon,
            "no budget holds with noise_multiplier = 0 (not private); drop it",
        )
    if z == 0 and placement(settings.noise_placement).clients_add_noise:
        raise PrivacyInputError(
            "noise_placement",
            settings.noise_placement,
            "with noise_multiplier = 0 it adds no noise: use central",
        )
    if clip == 0 and _adaptive(settings):
        raise PrivacyInputError("clip", clip, "adaptive_clip needs a clip > 0 to adapt (0 means no clipping)")
    if _adaptive(settings) and z > 0:  # the model and the count on one cohort
        composed_noise_multiplier(
            {
                "noise_multiplier": z,
                "count_noise_multiplier": settings.adaptive_clipping.count_noise_multiplier,
            }
        )


def _check_calibration(settings: Any, noise: Any) -> None:
    target = getattr(settings, "target_epsilon", None)
    if target is None:
        return
    if _adaptive(settings):
        raise PrivacyInputError(
            "target_epsilon",
            target,
            "is calibrated for the model update alone; with adaptive_clip the count release adds to epsilon: "
            "set noise_multiplier and check the epsilon with max_epsilon instead",
        )
    if settings.noise_multiplier == 0:
        raise PrivacyInputError(
            "target_epsilon",
            target,
            "is set beside noise_multiplier=0, the non-private baseline: a calibration never gives a "
            "non-private run. For the baseline set target_epsilon=None; for the target, leave noise_multiplier "
            "unset or give it another value",
        )
    if noise.noise_kind != Mechanism.__dataclass_fields__["noise_kind"].default and not noise.calibrates:
        raise PrivacyInputError(
            "target_epsilon",
            target,
            f"calibrates Gaussian noise; mechanism={noise.name!r} draws {noise.noise_kind} noise: set "
            "noise_multiplier and check the epsilon with max_epsilon instead",
        )


def _check_canaries(settings: Any, sampler: Any) -> None:
    """Canary clients submit a direction scaled to the clip into the central clipped sum (fedsim.privacy.canaries).

    Steinke, Nasr and Jagielski's one-run bound holds for any mechanism that is (epsilon, delta)-DP with respect
    to adding or removing one canary, each canary inserted by an independent fair coin: it audits the whole
    run's output, so rounds may share noise (tree, banded-mf, BLT: a canary's rounds see correlated noise, which
    the certified epsilon of the whole run covers) and a schedule may decide a canary's rounds (cyclic groups,
    min-separation), as it decides every client's: a canary is given its slot from its own id, which no other
    canary's coin moves. Refused where the certified epsilon is not such a guarantee about one canary's
    insertion (replace-one neighbours, no clipping) or where a canary would have to do more than submit its
    update (a noise share, a domain loss). Which engines insert canaries is the engine's own declaration."""
    if not settings.canaries:
        return
    why = None
    if not settings.clip > 0:
        why = "clip=0 (no clipping: a canary's update is its direction scaled to the clip)"
    elif placement(settings.noise_placement).clients_add_noise:
        why = (
            f"noise_placement={settings.noise_placement!r} (a canary would have to add a noise share of its own, as "
            "each client of a distributed run does; canary clients submit their update only)"
        )
    elif settings.agnostic:
        why = "agnostic FL (a canary has no domain and no loss to report)"
    elif sampler.neighbouring != ADD_REMOVE:
        why = (
            f"sampling={sampler.name!r}, accounted under {sampler.neighbouring!r} neighbours "
            "(the one-run audit inserts or leaves out each canary by a coin, so it tests an add-remove "
            "guarantee, which a replace-one epsilon is not: a fixed-size cohort's sampling probability moves "
            "with every canary inserted; use sampling='poisson' with clients_per_round or sampling_rate, or a "
            f"participation schedule; {see_docs('neighbouring')})"
        )
    if why:
        raise canaries_refused(settings.canaries, why)


def canaries_refused(canaries: int, why: str) -> PrivacyInputError:
    """The one message refusing ``canaries`` canary clients, for the reason ``why``."""
    return PrivacyInputError(
        "privacy.canaries",
        canaries,
        f"is not supported with {why}; allowed with central noise and add-remove neighbours (poisson, all, "
        "cyclic or min-separation sampling; independent or correlated noise), on the local or Ray engine",
    )


# ---------------------------------------------------------------------------------------------------- other times
def resume_refusal(settings: Any, randomness: str, old_rounds: int, target_rounds: int) -> str | None:
    """Why a run with ``settings`` (its ``randomness``: ``"seeded"`` or not) cannot be continued from its checkpoint to
    ``target_rounds`` rounds (``old_rounds``: what its config says), or None if it can. Nothing here looks at files:
    the run directory's own checks are the runner's."""
    if settings.canaries:
        return (
            f"--resume of a run with privacy.canaries={settings.canaries} is refused: its all-rounds canary "
            "statistic is the largest score over every round, which the checkpoint does not keep; run it again "
            "from the start (nothing was changed)"
        )
    if randomness != "seeded":
        # the rounds after the checkpoint were released already, with noise that cannot be drawn again: running
        # them again would release a second, independent noising of the same clients that the ledger, which
        # counts each round once, would not account
        return (
            f"--resume needs privacy.randomness = 'seeded'; this run drew its cohorts and noise from "
            f"{randomness!r}, so the rounds after the checkpoint cannot be run again with the "
            "same noise, and new noise would release more than the ledger accounts; nothing was changed"
        )
    if target_rounds <= old_rounds:
        return None
    if settings.target_epsilon is not None:
        return (
            f"rounds={target_rounds}: this run's noise multiplier was calibrated to privacy.target_epsilon="
            f"{settings.target_epsilon} over {old_rounds} rounds; more rounds would spend more than that target. "
            "Start a new run with rounds and target_epsilon set together; nothing was changed"
        )
    why = extension_refusal(settings.noise_class, old_rounds, target_rounds)
    return (
        f"rounds={target_rounds}: {why}. Start a new run; nothing was changed ({see_docs('resume')})"
        if why
        else None
    )


def extension_refusal(noise: Any, old: int, target: int) -> str | None:
    """Why a run of ``old`` rounds with the noise mechanism ``noise`` (a registered class, object or name) cannot be
    extended to ``target`` rounds as the run of ``target`` rounds from scratch, or None if it can: the mechanism's
    own ``fixed_for_rounds`` says what it fixed for the planned rounds (independent noise and tree aggregation fix
    nothing)."""
    cls = NOISE_SOURCES[noise] if isinstance(noise, str) else noise
    fixed = getattr(cls, "fixed_for_rounds", None)
    if fixed is None:
        return None
    return (
        f"mechanism {cls.name!r} optimised {fixed} for the {old} rounds planned, and the checkpoint keeps them, so "
        f"{target} rounds from here would add noise optimised for {old} rounds, not the run that rounds={target} "
        f"gives from scratch (optimised for {target} rounds)"
    )


def simulated_dropout_refusal(settings: Any) -> str | None:
    """Why ``settings`` cannot run on Flower nodes (a deployment, or ``engine.name = "flower"``, which runs the real
    SecAgg+ protocol): a simulated dropout rate, which only the engines that simulate the protocol draw; or None."""
    secagg = getattr(settings, "secagg", None)
    if secagg is None or secagg.dropout <= 0:
        return None
    return (
        f"privacy.secagg.dropout={secagg.dropout:g} simulates clients that drop out (in process and on Ray); Flower "
        "nodes (a deployment, or engine.name = 'flower') have real ones, whose masks are removed from their "
        "neighbours' shares. Set privacy.secagg.dropout = 0"
    )


def deployment_refusal(settings: Any, trusted_server: bool, opt_in: str) -> str | None:
    """Why ``settings`` cannot run on real Flower nodes, or None. ``trusted_server``: the operator accepted that the
    server sees each client's update with only its own noise share (``opt_in`` names how to say so).

    With distributed placement and secure aggregation (``settings.secagg``: SecAgg+, :mod:`fedsim.secagg`) the server
    learns only the sum of the survivors' noised encodings, and the ledger's epsilon holds against it. Without it the
    server receives every client's update carrying only that client's share, so against the server a client is
    protected by ``1/sqrt(m)`` of the accounted noise for an expected cohort of m: refused unless the operator trusts
    the server. A simulated dropout rate and canary clients exist only in simulation."""
    if settings.canaries:
        return (
            f"privacy.canaries={settings.canaries}: canary clients exist only in simulation (fedsim run, "
            "fedsim sweep); a deployed ServerApp does not insert fabricated clients into a real population. "
            "Set privacy.canaries = 0 in the run config's scenario"
        )
    secagg = getattr(settings, "secagg", None)
    if (why := simulated_dropout_refusal(settings)) is not None:
        return why
    if placement(settings.noise_placement).clients_add_noise and secagg is None and not trusted_server:
        return (
            f"noise_placement = {settings.noise_placement!r} is refused with Flower nodes without secure "
            "aggregation: the server would receive each client's update carrying only that client's share of the "
            "noise, and against the server the certified epsilon would not hold. Enable [privacy.secagg] (SecAgg+, "
            "with mechanism 'ddgauss' or 'skellam': the server learns only the noised sum), use noise_placement = "
            "'central' (the server adds the noise: epsilon holds against everyone who sees the released model), "
            f"or, if the server is trusted and only third parties must be kept out, opt in with {opt_in} "
            f"({see_docs('distributed')})"
        )
    return None
