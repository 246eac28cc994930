"""A noise mechanism named with its options, checked in one place.

A run's noise mechanism is a registered :class:`~fedsim.round.noise.NoiseSource` (:data:`NOISE_SOURCES`) and the
options its class takes: its dataclass fields beyond the seed and its state (:func:`mechanism_options`), such as
banded-mf's ``bands`` or blt's ``buffers``. A scenario gives them as the ``[privacy.mechanism]`` table (``name``
and the options), ``fedsim privacy`` as ``--mechanism`` and ``--option KEY=VALUE``. Both ask
:func:`check_mechanism_options`, so the two refuse the same input with the same words, and the values are checked by
the class itself, built once as the run builds it: a mechanism registered from outside fedsim gets its options
checked without a line here, and no second copy of a class's rules can drift from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedsim.validation import PrivacyInputError, one_of

from .noise import NOISE_SOURCES, make_noise_source, mechanism_options

__all__ = ["MOVED_OPTIONS", "RUN_SUPPLIED", "check_mechanism_options", "option_names"]

#: fields of a mechanism's class that the run fills in itself: a value given by hand would be replaced (the
#: correlated mechanisms are prepared for the run's own rounds when it starts), so one is refused, saying so
RUN_SUPPLIED: dict[str, str] = {
    "rounds": "the run's number of rounds, which the mechanism is prepared for when the run starts",
}

#: options that were keys of ``[privacy]`` (and flags of ``fedsim privacy``) before a mechanism's options became
#: its own table: refused there with the name they have now
MOVED_OPTIONS: tuple[str, ...] = ("bands", "buffers", "estimator")


def option_names(name: str) -> tuple[str, ...]:
    """The options a user may give the registered mechanism ``name``: its class's fields, but those the run
    supplies (:data:`RUN_SUPPLIED`)."""
    return tuple(k for k in mechanism_options(name) if k not in RUN_SUPPLIED)


def check_mechanism_options(name: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of the registered mechanism ``name``, checked: every key one of its options
    (:func:`option_names`), and the values accepted by its class (built once, with seed 0). An option set to None
    counts as not given (``--set privacy.mechanism.bands=none`` removes it), so it is left out of the result; the
    others are returned as given, so what a run records is what it was given.

    Raises :class:`~fedsim.validation.PrivacyInputError`: field ``mechanism`` for a name that is not registered;
    the option's key for an unknown option (naming the mechanism's options, and the mechanisms that take it, if
    any) and for a value the class refuses (the field the class names, which may join two options, such as blt's
    ``decays/output_scales``)."""
    name = one_of("mechanism", name, tuple(NOISE_SOURCES))
    given = {str(k): v for k, v in options.items() if v is not None}
    allowed = option_names(name)
    listed = ", ".join(allowed) or "none"
    for key, value in given.items():
        if key in RUN_SUPPLIED:
            raise PrivacyInputError(key, value, f"is not set as an option: it is {RUN_SUPPLIED[key]}")
        if key not in allowed:
            others = [n for n in NOISE_SOURCES if n != name and key in option_names(n)]
            where = (
                f"is an option of mechanism {' or '.join(others)}, not of {name!r}"
                if others
                else f"is not an option of mechanism {name!r}"
            )
            raise PrivacyInputError(key, value, f"{where} (its options: {listed})")
    try:
        make_noise_source(name, 0, **given)
    except PrivacyInputError:
        raise
    except (TypeError, ValueError) as exc:  # a class that checks less (a list where a number goes, a string)
        raise PrivacyInputError(
            "/".join(given), given, f"mechanism {name!r} refused its options: {exc}"
        ) from None
    return given
