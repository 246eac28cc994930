"""Small helpers that turn bad option values into ValueErrors naming the option."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def invalid(option: str, value: Any, allowed: str | Iterable[Any]) -> ValueError:
    """A ValueError that names the option, the value given and what is allowed."""
    if not isinstance(allowed, str):
        allowed = "one of " + ", ".join(repr(a) for a in allowed)
    return ValueError(f"invalid {option}={value!r}: allowed {allowed}")


def check_choice(option: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise invalid(option, value, allowed)
    return value


def check_int(option: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(option, value, _int_range(minimum, maximum))
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise invalid(option, value, _int_range(minimum, maximum))
    return value


def check_float(
    option: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    desc = _float_range(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(option, value, desc)
    value = float(value)
    if not math.isfinite(value):
        raise invalid(option, value, desc)
    if low is not None and (value < low or (low_open and value == low)):
        raise invalid(option, value, desc)
    if high is not None and (value > high or (high_open and value == high)):
        raise invalid(option, value, desc)
    return value


def check_bool(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(option, value, "true or false")
    return value


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def _float_range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    return f"a number in {lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"
