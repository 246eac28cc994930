"""The rules for the parameters of a private round, in one place, and the error that names what was wrong.

The scenario schema, :class:`fedsim.privacy.Mechanism`, the strategies and the samplers all call these
functions, so the same bad value gives the same message wherever it enters: the field, the value received and
what is allowed. Below every package too: :class:`ScenarioError` and :func:`parse_value` (how a command-line
value is read), which reporting code raises and uses without importing the scenarios package. This module
imports nothing of fedsim's.
"""

from __future__ import annotations

import math
from typing import Any


class PrivacyInputError(ValueError):
    """Invalid input to a private round or to the accountant.

    The message always names the field (or command-line option), the value received and what is allowed, so
    that it can be shown to a user as a one-line error.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")


class ScenarioError(ValueError):
    """A scenario could not be found, parsed or validated (or a sweep's settings refer to one that is not there).

    A ``ValueError``. Defined in :mod:`fedsim.validation`, below every package, so that reporting code can raise it
    without importing the scenarios package (which imports reporting code); :mod:`fedsim.scenarios` exports it
    under the same name."""


def parse_value(raw: str) -> Any:
    """A value written on the command line (``--set``, ``--grid``, ``--reference``) read as TOML, else as the bare
    word it is (``poisson``); ``none``/``null`` is None. The one reading of such a value."""
    import tomllib

    raw = raw.strip()
    if raw.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string such as poisson or mnist1d


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def positive_finite(name: str, value: Any) -> float:
    """``value`` as a float > 0 and finite."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrivacyInputError(name, value, "must be a positive finite number") from None
    if isinstance(value, bool) or not math.isfinite(v) or v <= 0:
        raise PrivacyInputError(name, value, "must be a positive finite number")
    return v


def nonnegative_finite(name: str, value: Any, zero_means: str) -> float:
    """``value`` as a float >= 0 and finite; ``zero_means`` says what 0 does (in the error message)."""
    allowed = f"must be a finite number >= 0 (0: {zero_means})"
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrivacyInputError(name, value, allowed) from None
    if isinstance(value, bool) or not math.isfinite(v) or v < 0:
        raise PrivacyInputError(name, value, allowed)
    return v


#: what noise_multiplier = 0 and clip = 0 mean (the non-private baselines of a comparison)
NO_NOISE = "no noise: clipped, un-noised DP-FedAvg, not private (epsilon is infinite)"
NO_CLIP = "no clipping: plain FedAvg, which needs noise_multiplier = 0"

#: the noise multipliers (besides 0) that the accountants and the noise draws handle, chosen well inside where they
#: break: below 1e-6 one round's epsilon is above 1e11, and at about 1e-150 the accountants' arithmetic fails
#: (1/z^2 overflows; dp-accounting divides by z^2 and rounds epsilon to an integer grid); above 1e6 the noise drowns
#: any update and epsilon is about 0, and at about 1e150 z^2 overflows. A schedule's accounting divides z by the
#: run's sensitivity (4e-4 for tree aggregation over 20,000 cyclic rounds at z = 1), which this range leaves room
#: for.
NOISE_MULTIPLIER_RANGE = (1e-6, 1e6)
#: the largest float32: training, and so the clipped updates and the noise added to them, are float32
FLOAT32_MAX = 3.4028234663852886e38


def noise_multiplier_value(name: str, value: Any, zero_means: str | None = NO_NOISE) -> float:
    """``value`` as a noise multiplier: in :data:`NOISE_MULTIPLIER_RANGE`, or 0 where ``zero_means`` says what 0
    does (None: 0 is refused)."""
    lo, hi = NOISE_MULTIPLIER_RANGE
    allowed = (
        f"must be 0 ({zero_means}) or a number in [{lo:g}, {hi:g}]"
        if zero_means
        else f"must be a number in [{lo:g}, {hi:g}]"
    ) + (
        ", the range where the accountants and the noise draws are numerically meaningful (below it one round's "
        "epsilon exceeds 1e11 and the accountants' arithmetic overflows; above it the noise drowns any update)"
    )
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise PrivacyInputError(name, value, allowed) from None
    if isinstance(value, bool) or not (lo <= v <= hi or (v == 0 and zero_means)):
        raise PrivacyInputError(name, value, allowed)
    return abs(v)  # -0.0 is 0


def noise_and_clip(clip: Any, noise_multiplier: Any) -> tuple[float, float]:
    """The clip and the noise multiplier of a round: ``noise_multiplier = 0`` is the non-private baseline (clipped,
    un-noised), ``clip = 0`` plain FedAvg (no clipping), which has nothing to calibrate noise to, so it needs
    ``noise_multiplier = 0``. A noise multiplier is in :data:`NOISE_MULTIPLIER_RANGE`, and the clip and the noise
    std on the sum (``noise_multiplier * clip``) are at most float32's largest number (:data:`FLOAT32_MAX`)."""
    c = nonnegative_finite("clip", clip, NO_CLIP)
    z = noise_multiplier_value("noise_multiplier", noise_multiplier)
    if c > FLOAT32_MAX or z * c > FLOAT32_MAX:
        raise PrivacyInputError(
            "clip",
            clip,
            f"the clip and the noise std on the sum (noise_multiplier * clip = {z * c:g}) must be at most "
            f"{FLOAT32_MAX:.4g}, float32's largest number (updates and their noise are float32)",
        )
    if c == 0 and z != 0:
        raise PrivacyInputError(
            "clip", clip, f"0 means no clipping (plain FedAvg), which needs noise_multiplier = 0, got {z:g}"
        )
    return c, z


def composed_noise_multiplier(releases: dict[str, Any]) -> None:
    """The noise multipliers of one round's releases on one cohort (``{field: z}``, None for a release the run does
    not make; the first is the model's) compose to one Gaussian of noise multiplier ``(sum z_i^-2)^-1/2``
    (:func:`fedsim.privacy.compose_same_cohort`), which must be in :data:`NOISE_MULTIPLIER_RANGE` too: two
    releases at the least noise multiplier compose to less."""
    given = {k: float(v) for k, v in releases.items() if v is not None}
    if len(given) < 2 or not all(v > 0 for v in given.values()):  # one without noise: not private at all
        return
    z = sum(v**-2 for v in given.values()) ** -0.5
    lo = NOISE_MULTIPLIER_RANGE[0]
    if z < lo:
        raise PrivacyInputError(
            " and ".join(given),
            tuple(given.values()),
            f"the round's releases compose to one Gaussian of noise multiplier {z:.3g}, below {lo:g}, the least "
            "the accountants take: raise one of them",
        )


def target_out_of_reach(
    field: str,
    target: Any,
    rounds: int,
    delta: float,
    noise_range: tuple[float, float],
    epsilon_range: tuple[float, float],
    method: str,
) -> PrivacyInputError:
    """The error for a target epsilon that calibration cannot meet: the noise multipliers it searches
    (``noise_range``, least to most) give ``epsilon_range`` (at the least noise, at the most) after ``rounds`` rounds
    at ``delta`` by ``method``, and the target is outside it."""
    high, low = epsilon_range
    return PrivacyInputError(
        field,
        target,
        f"calibration cannot meet it: after {rounds} rounds at delta={delta:g}, the noise multipliers it searches "
        f"({noise_range[0]:g} to {noise_range[1]:g}) give epsilon {high:.4g} down to {low:.4g} ({method}); allowed: "
        f"a target in [{low:.4g}, {high:.4g}] for these rounds and delta, or give a noise multiplier instead",
    )


def one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise PrivacyInputError(name, value, f"must be one of {', '.join(allowed)}")
    return value


def open_unit(name: str, value: Any) -> float:
    """A probability in (0, 1), such as delta."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrivacyInputError(name, value, "must be a number in (0, 1)") from None
    if isinstance(value, bool) or not (0.0 < v < 1.0):
        raise PrivacyInputError(name, value, "must be in (0, 1)")
    return v


def cohort_values(
    sampling_rate: Any = None, clients_per_round: Any = None, population: int | None = None
) -> tuple[float | None, int | None]:
    """The numbers that describe a round's cohort, checked and normalised: a rate in ``(0, 1]`` and a whole number of
    clients in ``[1, population]``; either may be None. Which of them a sampling scheme takes, and what else it
    requires, is the scheme's own rule (:meth:`fedsim.round.sampling.Sampler.check_cohort`)."""
    rate, cpr = sampling_rate, clients_per_round
    if rate is not None:
        try:
            rate_f = float(rate)
        except (TypeError, ValueError):
            raise PrivacyInputError("sampling_rate", rate, "must be a number in (0, 1]") from None
        if isinstance(rate, bool) or not math.isfinite(rate_f) or not (0.0 < rate_f <= 1.0):
            raise PrivacyInputError("sampling_rate", rate, "must be in (0, 1]")
        rate = rate_f
    if cpr is not None:
        if isinstance(cpr, float) and cpr.is_integer():
            cpr = int(cpr)
        upper = "" if population is None else f", population={population}"
        if not is_int(cpr) or cpr < 1 or (population is not None and cpr > population):
            raise PrivacyInputError(
                "clients_per_round", clients_per_round, f"must be an integer in [1{upper}]"
            )
    return rate, cpr
