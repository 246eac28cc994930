"""Calibration: the noise multiplier that meets a target (epsilon, delta) after T rounds."""

from __future__ import annotations

import math

from fedsim.privacy.accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    epsilon_at,
    validate_delta,
    validate_method,
    validate_rounds,
)
from fedsim.privacy.errors import PrivacyInputError
from fedsim.privacy.mechanism import Mechanism

__all__ = ["CALIBRATION_RANGE", "calibrate_all", "calibrate_noise"]

#: the noise multipliers :func:`calibrate_noise` searches by default (least, most)
CALIBRATION_RANGE = (0.05, 1e4)


def calibrate_noise(
    mechanism: Mechanism,
    target_epsilon: float,
    delta: float,
    rounds: int,
    method: str = DEFAULT_ACCOUNTANT,
    *,
    z_min: float = CALIBRATION_RANGE[0],
    z_max: float = CALIBRATION_RANGE[1],
    rel_tol: float = 1e-3,
) -> float | None:
    """Smallest noise multiplier (to ``rel_tol``) with epsilon after ``rounds`` rounds <= target.

    ``mechanism`` gives the sampling, population, clip and placement (its noise multiplier is ignored).
    Returns the upper end of the final bracket, so the returned ``z`` meets the target; None if even
    ``z_max`` does not (e.g. a paper bound that makes no statement). Paper bounds are calibrated as
    printed (for comparison only; they are not certificates).
    """
    try:
        target = float(target_epsilon)
    except (TypeError, ValueError):
        raise PrivacyInputError("target_epsilon", target_epsilon, "must be a positive number") from None
    if isinstance(target_epsilon, bool) or not (target > 0 and math.isfinite(target)):
        raise PrivacyInputError("target_epsilon", target_epsilon, "must be a positive finite number")
    delta = validate_delta(delta)
    rounds = validate_rounds(rounds)
    method = validate_method(method)

    def meets(z: float) -> bool:
        e = epsilon_at(mechanism.replace(noise_multiplier=z), rounds, delta, method)
        return e <= target  # NaN (no statement) does not meet

    if not meets(z_max):
        return None
    lo, hi = z_min, z_max
    if meets(lo):
        return lo
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_all(
    mechanism: Mechanism, target_epsilon: float, delta: float, rounds: int, methods=ACCOUNTANTS
) -> dict:
    """``{method: noise multiplier or None}`` for every method."""
    return {m: calibrate_noise(mechanism, target_epsilon, delta, rounds, m) for m in methods}
