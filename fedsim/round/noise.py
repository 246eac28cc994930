"""Noise: where it comes from (a pluggable noise source) and how it joins the clipped sum.

The Gaussian noise on the **sum** of clipped updates has std ``noise_multiplier * clip`` (the round's
:attr:`fedsim.privacy.Mechanism.noise_std`); the aggregate is divided by the **expected** cohort size, never the
realised count (the realised count is data-dependent and would leak).

A :class:`NoiseSource` provides every noise vector a round releases: :meth:`NoiseSource.noise` ``(round, purpose,
size, std)`` serves the central noise on the model update (``"model"``), each client's share of distributed noise
(``"share"``, with the client's id), the noised count of adaptive clipping (``"count"``) and agnostic FL's per-domain
loss noise (``"loss"``). :class:`NoiseSource` itself is independent Gaussian noise, each purpose from its own stream
(:mod:`fedsim.round.randomness`), seeded or from the operating system's entropy. A mechanism whose round-``t`` noise
combines earlier draws (tree aggregation, banded matrix factorisation, buffered Toeplitz noise) is a subclass that
overrides :meth:`NoiseSource.noise` for the purposes it correlates and keeps its past draws or buffers in
:meth:`NoiseSource.extra_state` (arrays allowed: a checkpoint saves them), registered in :data:`NOISE_SOURCES`.

A noise mechanism owns its privacy meaning, declared beside its draw (``docs/architecture.md``, "Seams"):

* ``noise_kind`` and :meth:`NoiseSource.dp_release`: what the ledger records for a round (a release whose
  ``to_dp_event`` dp-accounting composes), and ``accountants``: the certified accountants that can account it;
* ``placements`` and the client side: :meth:`NoiseSource.share_scale` (what each sampled client adds before sending
  under distributed placement) and :meth:`NoiseSource.server_noise` (what the server adds: all of it centrally,
  the missing shares otherwise). A placement (:data:`PLACEMENTS`) says only whether clients add noise;
* ``paper_bounds`` (the papers' closed forms describe its rounds), ``fixed_for_rounds`` (what it fixes for the
  planned rounds, so a run cannot be extended), ``correlated`` (it needs a participation schedule),
  ``single_release`` (it noises the model update only: adaptive clipping's count and agnostic FL's losses are
  refused).

A class that decides its own noise (overrides :meth:`NoiseSource.noise`, :meth:`NoiseSource.server_noise` or
:meth:`NoiseSource.share_scale`) without declaring its kind and event in the same class or below is refused when it
is registered or given to a strategy: nothing is ever accounted as Gaussian by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .partial import PartialSum
from .randomness import (
    STREAM_COUNT_NOISE,
    STREAM_LOSS_NOISE,
    STREAM_NOISE,
    STREAM_NOISE_SHARE,
    SeededState,
    make_component,
    make_rng,
    randomness_kind,
    register_component,
)


@dataclass(frozen=True)
class Placement:
    """Where a mechanism's noise is added: by the server alone, or as shares by the sampled clients (the server then
    adds the shares missing below the expected cohort). Which placements a mechanism supports, and what a share is,
    the mechanism says (:attr:`NoiseSource.placements`, :meth:`NoiseSource.share_scale`)."""

    name: str
    #: whether each sampled client adds its own share before its update leaves it
    clients_add_noise: bool
    #: what holds, and against whom (the run's summary and the ledger's caveats)
    caveat: str | None = None

    def present_shares(self, shares: float) -> float:
        """How many clients' shares are in a partial sum that counted ``shares`` noised updates."""
        return float(shares) if self.clients_add_noise else 0.0


#: the placements, by name (``privacy.noise_placement``)
PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in (
        Placement("central", clients_add_noise=False),
        Placement(
            "distributed",
            clients_add_noise=True,
            caveat="distributed noise is accounted as the noise of the whole expected cohort: assumes honest "
            "clients whose shares add up to it (the server adds the shares missing below the expected cohort)",
        ),
    )
}
NOISE_PLACEMENTS = tuple(PLACEMENTS)


def default_placement(noise: Any) -> str:
    """The placement a mechanism (class or object) runs with when none is asked for: central where it supports it,
    else the first it declares (noise that clients must add before secure aggregation: distributed)."""
    central = next(p for p in PLACEMENTS.values() if not p.clients_add_noise)
    return central.name if central.name in noise.placements else noise.placements[0]


def placement(name: str) -> Placement:
    """The registered placement ``name`` (a :class:`PrivacyInputError` naming the allowed ones otherwise)."""
    from fedsim.validation import one_of

    return PLACEMENTS[one_of("noise_placement", name, NOISE_PLACEMENTS)]


#: what a noise vector is for -> its stream (independent generators for independent purposes)
NOISE_PURPOSES: dict[str, int] = {
    "model": STREAM_NOISE,
    "share": STREAM_NOISE_SHARE,
    "count": STREAM_COUNT_NOISE,
    "loss": STREAM_LOSS_NOISE,
}


@dataclass
class NoiseSource(SeededState):
    """Independent Gaussian noise per round and purpose. ``seed=None``: the operating system's entropy.

    Subclasses (correlated noise across rounds) override :meth:`noise` and keep what they need in
    :meth:`extra_state` / :meth:`load_extra_state`; :meth:`for_clients` is what the clients' shares are drawn from
    (by default this source itself, which is small enough to ship to every worker)."""

    #: the seed of every noise stream (simulation); ``None``: the operating system's entropy
    seed: int | None = None
    #: the mechanism's name in the registry (:data:`NOISE_SOURCES`), which a scenario's ``privacy.mechanism`` gives
    name: ClassVar[str] = "independent"
    #: names this class's state was saved under before (checkpoints of earlier versions; not inherited)
    aliases: ClassVar[tuple[str, ...]] = ("gaussian",)

    @property
    def randomness(self) -> str:
        return randomness_kind(self.seed)

    def rng(self, round_: int, stream: int, *extra: int) -> Any:
        """The generator of ``stream`` in round ``round_`` (also for non-noise draws, such as the clients picked for
        federated evaluation)."""
        return make_rng(self.seed, self.stream_round(round_), stream, *extra)

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        """``N(0, std^2)`` for ``purpose`` in round ``round_``: an array of ``size`` draws (a float when ``size`` is
        None); ``std`` may be an array of per-coordinate stds (one stream: a client's share and its count noise).
        ``client``: a client's own stream (its noise share). A zero ``std`` gives zeros and draws nothing."""
        stream = NOISE_PURPOSES.get(purpose)
        if stream is None:
            raise ValueError(f"unknown noise purpose {purpose!r}; allowed: {', '.join(NOISE_PURPOSES)}")
        if not np.any(np.asarray(std) > 0):
            return 0.0 if size is None else np.zeros(size)
        extra = () if client is None else (int(client),)
        return self.rng(round_, stream, *extra).normal(0.0, std, size=size)

    def added_std(self, round_: int, std: float) -> float:
        """The std, per coordinate, of the model noise this source adds to the sum in round ``round_`` when each
        fresh draw has std ``std`` (what a row publishes as ``noise_std_sum``). Independent noise: ``std``."""
        return float(std)

    # ------------------------------------------------------------------ the mechanism's privacy meaning
    #: whether round t's noise combines earlier rounds' draws (needs a participation schedule to be accounted)
    correlated: ClassVar[bool] = False

    def prepare(self, rounds: int | None, min_sep: int, k: int | None) -> None:
        """Fix the mechanism for a run of ``rounds`` rounds (None: not known) in which one client takes part at
        most ``k`` times, ``min_sep`` rounds apart (a correlated mechanism optimises its strategy matrix here; the
        choice is then kept in :meth:`extra_state`, so a resumed run keeps it). Independent noise needs nothing."""

    def prefix_sensitivity_squared(
        self, n: int, min_sep: int, k: int | None, cyclic: bool = False
    ) -> tuple[np.ndarray, bool]:
        """``(s, exact)``: ``s[t-1]`` is the squared L2 sensitivity of the first ``t`` rounds' releases (per unit of
        clip and of noise std) when one client takes part at most ``k`` times, ``min_sep`` rounds apart, for
        ``t = 1..n``; ``exact`` False if some are upper bounds. ``cyclic``: the clients' patterns are a cyclic
        schedule's (group ``g`` at rounds ``g, g + min_sep, ...``), a subset of the patterns the gap allows.
        Independent noise: one unit per participation, ``min(k, ceil(t / min_sep))``, exact."""
        t = np.arange(1, n + 1)
        most = -(-t // min_sep)
        return (most if k is None else np.minimum(most, k)).astype(np.float64), True

    def amplified_sensitivity_squared(self, min_sep: int) -> float | None:
        """Under a cyclic schedule of ``min_sep`` groups with Poisson sampling within each group: the squared
        sensitivity of one participation when participations touch disjoint rounds' releases, so that each is a
        separately Poisson-sampled Gaussian (Choquette-Choo et al. 2023, amplified banded matrix factorization); None
        if the mechanism's participations overlap (then no amplification is claimed). Independent noise: 1."""
        return 1.0

    def describe(self) -> str:
        """One line for reports: the mechanism and its parameters."""
        return "independent Gaussian noise every round"

    # ------------------------------------------------------------------ what it releases, declared
    #: the distribution of one fresh draw, recorded in every round's :class:`fedsim.privacy.Mechanism`
    #: (``noise_kind``); only ``"gaussian"`` rounds are accounted by the Gaussian events and closed forms
    noise_kind: ClassVar[str] = "gaussian"
    #: the placements it supports (:data:`PLACEMENTS`)
    placements: ClassVar[tuple[str, ...]] = ("central", "distributed")
    #: the certified accountants (:data:`fedsim.privacy.ACCOUNTANTS`) that can account its releases; None: all
    accountants: ClassVar[tuple[str, ...] | None] = None
    #: the neighbouring relations (a sampler's ``neighbouring``) its accounting holds for; None: any
    neighbouring: ClassVar[tuple[str, ...] | None] = None
    #: whether the papers' closed forms (IGMM, its correction, the generalization population) describe its rounds
    paper_bounds: ClassVar[bool] = True
    #: what it fixes for the planned rounds before round 1 (so a run extended past them would not be the longer run
    #: from scratch: the resume refusal names it); None: nothing, a run extends
    fixed_for_rounds: ClassVar[str | None] = None
    #: whether only the model update may be released with it: adaptive clipping's count and agnostic FL's losses are
    #: releases of their own, with their own sensitivity, drawn and recorded by this mechanism (a mechanism that is not
    #: Gaussian is always taken as single-release by the rules)
    single_release: ClassVar[bool] = False

    def dp_release(self, round_: int, release: Any, schedule: Any | None = None) -> Any:
        """What the ledger records for round ``round_``'s ``release`` (a :class:`fedsim.privacy.Mechanism`: the
        round's cohort, clip and noise multiplier), under the run's participation-schedule accounting ``schedule``
        (a :class:`fedsim.privacy.ScheduleAccounting`; None: each round is its own release). Independent Gaussian
        noise: the round itself, a sampled Gaussian, or the schedule's :class:`fedsim.privacy.ScheduledGaussian`."""
        if getattr(release, "noise_kind", self.noise_kind) != self.noise_kind:
            raise ValueError(
                f"mechanism {self.name!r} records {self.noise_kind} releases; this round says "
                f"{release.noise_kind!r}"
            )
        return release if schedule is None else schedule.release(round_, release)

    def share_scale(self, noise_scale: float, shares: float) -> float:
        """Distributed placement: the scale of each of ``shares`` clients' shares (drawn with :meth:`noise`, purpose
        ``"share"``, by the client itself) that together make noise of scale ``noise_scale`` (the release's
        ``noise_std``). The expected cohort is the number of shares: a public parameter, never the realised cohort
        (see :func:`noise_share_std`). Gaussian noise: ``noise_scale / sqrt(shares)`` (variances add)."""
        return gaussian_share(noise_scale, shares)

    def server_noise(
        self, round_: int, size: int, release: Any, shares: float, purpose: str = "model"
    ) -> tuple:
        """``(noise, scale)``: what the server adds to round ``round_``'s sum of ``release`` (``size`` numbers; None:
        one number) when ``shares`` clients' shares are in it (0 with central placement): the noise of the expected
        cohort's shares that are missing, so that the total is at least what is accounted. Gaussian noise: std
        ``noise_std * sqrt(max(expected - shares, 0) / expected)``."""
        expected = release.expected_cohort
        full_var = release.noise_std**2 if release.noise_multiplier > 0 else 0.0  # z = 0 (clip may be inf)
        std = (
            math.sqrt(full_var * max(expected - float(shares), 0.0) / expected)
            if shares
            else math.sqrt(full_var)
        )
        return self.noise(round_, purpose, size, std), std

    # ------------------------------------------------------------------ clients that encode (secure aggregation)
    #: whether each client sends an encoding of its update that the server decodes after summing (integers modulo
    #: ``2^bits`` for secure aggregation: :mod:`fedsim.privacy.discrete_noise`) rather than its clipped update plus a
    #: float noise share; such a mechanism implements :meth:`encoding`, :meth:`encode` and :meth:`decode`
    encodes: ClassVar[bool] = False

    def set_model_size(self, size: int) -> None:
        """Told the size of the flat model update before the first release (a mechanism whose release depends on it,
        such as discrete noise on a rotated, padded vector, keeps it; a different size later is refused there)."""

    def check_release(self, release: Any, size: int) -> None:
        """Refuse, before any round, a release this mechanism cannot make for a model of ``size`` numbers (a
        :class:`fedsim.validation.PrivacyInputError` naming the option). Any release, here."""

    def public_randomness(self, round_: int) -> dict[str, int]:
        """The round's public randomness, drawn once by the server and sent to every sampled client with the round
        (seeded in simulation, the operating system's entropy otherwise): a random rotation's seed. None here."""
        return {}

    def encoding(self, release: Any, size: int) -> dict[str, Any]:
        """The public parameters every client of round's ``release`` encodes with (a function of the release and the
        model size ``size`` alone; with :meth:`public_randomness` it is what the server sends the clients)."""
        raise NotImplementedError(f"mechanism {self.name!r} does not encode client updates")

    def encode(
        self, round_: int, client: int, update: np.ndarray, clip: float, encoding: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """Client ``client``'s message for round ``round_``: its (unclipped) ``update`` clipped to ``clip``, encoded
        and noised with its own share as ``encoding`` says; ``(None, info)`` for an update that is not finite.
        ``info``: ``norm`` (before clipping) and what a simulation may sum for the server's non-private
        diagnostics."""
        raise NotImplementedError(f"mechanism {self.name!r} does not encode client updates")

    def decode(
        self, round_: int, partial: PartialSum, release: Any, encoding: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """``(sum, stats)``: the sum of the clients' updates and noise decoded from ``partial`` (the sum of their
        encodings), and what the row reports about the decoding (non-private where labelled)."""
        raise NotImplementedError(f"mechanism {self.name!r} does not encode client updates")

    #: whether it calibrates its noise multiplier to a target epsilon itself (:meth:`calibrate`); Gaussian noise is
    #: calibrated by the certified accountants (``fedsim.privacy.paper.calibration``), any other noise only so
    calibrates: ClassVar[bool] = False

    def calibrate(self, release: Any, target_epsilon: float, delta: float, rounds: int) -> float | None:
        """The noise multiplier at which ``rounds`` rounds of ``release`` spend ``target_epsilon`` at ``delta``, by
        this mechanism's own accounting (None: not reachable); only where :attr:`calibrates`."""
        raise NotImplementedError(f"mechanism {self.name!r} does not calibrate its own noise")

    def noise_floor_refusal(self, release: Any, shares: float) -> str | None:
        """Why a round whose sum holds ``shares`` clients' noise shares must not be released (its noise fell below
        the mechanism's floor), or None. The server tops up Gaussian noise: never."""
        return None

    def for_clients(self) -> NoiseSource:
        """The source the clients' noise shares come from (with distributed noise, shipped to the workers with the
        round's plan: a source holding large buffers returns a light one here)."""
        return self

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") in type(self).__dict__.get("aliases", ()):
            state = {**state, "name": self.name}
        super().load_state_dict(state)


#: The registry of noise mechanisms, by name (:func:`register_noise_source`); ``privacy.mechanism`` in a scenario.
NOISE_SOURCES: dict[str, type[NoiseSource]] = {}


#: what decides the noise a mechanism adds: its draw, the server's part and a client's share
DRAWS = ("noise", "server_noise", "share_scale", "encode", "decode")
#: what a noise mechanism must declare in the class that decides its noise (:data:`DRAWS`), or below it; a mechanism
#: whose noise is not Gaussian also says which accountants can account it
DECLARED = ("noise_kind", "dp_release")


def _owner(cls: type, attribute: str) -> type:
    return next(c for c in cls.__mro__ if attribute in c.__dict__)


def check_declared(cls: type[NoiseSource]) -> None:
    """Refuse a mechanism that decides its own noise (overrides one of :data:`DRAWS`) without declaring, in the same
    class or below, its ``noise_kind`` and :meth:`NoiseSource.dp_release` (and, for noise that is not Gaussian, its
    ``accountants``): it would otherwise inherit the Gaussian event of the class whose noise it replaced, and be
    accounted as Gaussian noise it does not add."""
    owners = {d: _owner(cls, d) for d in DRAWS}
    what, draw = max(owners.items(), key=lambda item: len(item[1].__mro__))  # the most derived
    declared = (*DECLARED, "accountants") if cls.noise_kind != "gaussian" else DECLARED
    missing = [a for a in declared if not issubclass(_owner(cls, a), draw)]
    if missing:
        raise TypeError(
            f"noise mechanism {cls.__name__} ({getattr(cls, 'name', '?')!r}) decides its own noise "
            f"({draw.__name__}.{what}) but does not declare {' and '.join(missing)} in {draw.__name__} or below: "
            "declare the distribution it draws (noise_kind) and what the ledger records for a round "
            "(dp_release), and which accountants can account it (accountants). Nothing is accounted as Gaussian by "
            "default"
        )
    for p in cls.placements:
        if p not in PLACEMENTS:
            raise TypeError(f"{cls.__name__}.placements: {p!r} is not one of {', '.join(PLACEMENTS)}")


def register_noise_source(cls: type[NoiseSource], *, replace: bool = False) -> type[NoiseSource]:
    """Add a noise mechanism (a :class:`NoiseSource` subclass with a ``name`` that declares its release:
    :func:`check_declared`); usable as a class decorator."""
    if isinstance(cls, type) and issubclass(cls, NoiseSource):
        check_declared(cls)
    return register_component(NOISE_SOURCES, cls, NoiseSource, replace=replace)


register_noise_source(NoiseSource)


def make_noise_source(noise: Any, seed: int | None, **options: Any) -> NoiseSource:
    """A noise source: a registered mechanism's name, built with ``seed`` and its ``options`` (the class's fields:
    ``bands`` for banded-mf, ``buffers`` for blt, ...; :func:`mechanism_options`), or a :class:`NoiseSource` object
    (used as it is; ``seed`` must then agree with its own seed or be None, and no options are given)."""
    if options and isinstance(noise, NoiseSource):
        raise ValueError(f"options {sorted(options)} are for a mechanism named by its name, not an object")
    if options:
        from fedsim.validation import PrivacyInputError, one_of

        cls = NOISE_SOURCES[one_of("mechanism", noise, tuple(NOISE_SOURCES))]
        allowed = mechanism_options(cls.name)
        for key in options:
            if key not in allowed:
                raise PrivacyInputError(
                    key,
                    options[key],
                    f"is not an option of mechanism {cls.name!r} (its options: {', '.join(allowed) or 'none'})",
                )
        return cls(seed, **options)
    return make_component(NOISE_SOURCES, noise, seed, "mechanism", NoiseSource)


def mechanism_options(name: str) -> tuple[str, ...]:
    """The options a registered mechanism takes (its dataclass fields beyond the seed and its state)."""
    import dataclasses

    cls = NOISE_SOURCES[name]
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "seed" and f.init and f.repr)


def noise_share_std(mechanism: Any) -> float:
    """Distributed noise: the std each sampled client adds so that ``expected_cohort`` of them sum to
    ``N(0, noise_std^2)`` (``mechanism``: the release the shares make up, a :class:`fedsim.privacy.Mechanism`).
    The expected cohort is a public parameter, never the realised one: a share computed from the realised cohort
    would tell every sampled client how many were sampled (under Poisson sampling that count is not covered by
    epsilon). The server tops up the shares below it that did not arrive (see :func:`private_mean`), so the total
    never falls below the accounted noise; a realised cohort larger than expected adds more noise than accounted
    (never less)."""
    return gaussian_share(mechanism.noise_std, mechanism.expected_cohort)


def gaussian_share(noise_std: float, shares: float) -> float:
    """The std of one of ``shares`` independent Gaussian shares whose sum has std ``noise_std``."""
    return float(noise_std) / math.sqrt(shares) if shares > 0 else 0.0


def private_mean(
    partial: PartialSum,
    mechanism: Any,
    noise: NoiseSource,
    round_: int,
    *,
    denominator: float | None = None,
) -> tuple[np.ndarray, float]:
    """``(sum of clipped updates + the release's noise) / denominator`` for the release ``mechanism`` (a
    :class:`fedsim.privacy.Mechanism`: its noise, expected cohort and placement), the server's part of the noise
    from ``noise`` (:meth:`NoiseSource.server_noise`, purpose ``"model"``) for round ``round_``. ``denominator``:
    default the expected cohort.

    Returns ``(mean, server_noise_scale)``. Central: the server adds all the noise. Distributed: each sampled client
    that replied added a share (:meth:`NoiseSource.share_scale`); the server adds the shares missing below the
    expected cohort (clients that were not sampled, did not reply or were rejected), so the total noise is at least
    the accounted one in every case.
    """
    expected = mechanism.expected_cohort
    denominator = expected if denominator is None else denominator
    if expected <= 0 or denominator <= 0:
        raise ValueError(f"expected_cohort must be > 0, got {expected}")
    shares = mechanism.placement.present_shares(partial.noise_shares)
    added, scale = noise.server_noise(round_, partial.dim, mechanism, shares)
    return (partial.total + added) / denominator, scale


def decoded_mean(
    partial: PartialSum, mechanism: Any, noise: NoiseSource, round_: int, encoding: dict[str, Any]
) -> tuple[np.ndarray, dict[str, Any]]:
    """:func:`private_mean` for a mechanism whose clients encode (:attr:`NoiseSource.encodes`): the decoded sum of
    the clients' encodings over the expected cohort, and the decoding's statistics. The server adds nothing: the
    noise is the clients' shares that arrived (a mechanism that cannot top them up accounts the fewest a released
    round holds, and refuses to release a round with fewer: :meth:`NoiseSource.noise_floor_refusal`)."""
    expected = mechanism.expected_cohort
    if expected <= 0:
        raise ValueError(f"expected_cohort must be > 0, got {expected}")
    total, stats = noise.decode(round_, partial, mechanism, encoding)
    return total / expected, stats
