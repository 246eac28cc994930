"""The rules for the parameters of a private round, in one place, and the error that names what was wrong.

The scenario schema, :class:`fedsim.privacy.Mechanism`, the strategies and the samplers all call these
functions, so the same bad value gives the same message wherever it enters: the field, the value received and
what is allowed. This module imports nothing of fedsim's.
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


def noise_and_clip(clip: Any, noise_multiplier: Any) -> tuple[float, float]:
    """The clip and the noise multiplier of a round: ``noise_multiplier = 0`` is the non-private baseline (clipped,
    un-noised), ``clip = 0`` plain FedAvg (no clipping), which has nothing to calibrate noise to, so it needs
    ``noise_multiplier = 0``."""
    c = nonnegative_finite("clip", clip, NO_CLIP)
    z = nonnegative_finite("noise_multiplier", noise_multiplier, NO_NOISE)
    if c == 0 and z != 0:
        raise PrivacyInputError(
            "clip", clip, f"0 means no clipping (plain FedAvg), which needs noise_multiplier = 0, got {z:g}"
        )
    return c, z


def baseline_combinations(
    clip: float, noise_multiplier: float, *, max_epsilon: Any, noise_placement: str, adaptive: bool
) -> None:
    """What the non-private baselines (:func:`noise_and_clip`) cannot be combined with: a budget
    (``max_epsilon``) or distributed noise with ``noise_multiplier = 0``, adaptive clipping with ``clip = 0``."""
    if noise_multiplier == 0 and max_epsilon is not None:
        raise PrivacyInputError(
            "max_epsilon", max_epsilon, "no budget holds with noise_multiplier = 0 (not private); drop it"
        )
    if noise_multiplier == 0 and noise_placement == "distributed":
        raise PrivacyInputError(
            "noise_placement", noise_placement, "with noise_multiplier = 0 it adds no noise: use central"
        )
    if clip == 0 and adaptive:
        raise PrivacyInputError("clip", clip, "adaptive_clip needs a clip > 0 to adapt (0 means no clipping)")


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
