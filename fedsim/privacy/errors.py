"""Errors raised by :mod:`fedsim.privacy`."""

from __future__ import annotations


class PrivacyInputError(ValueError):
    """Invalid input to the privacy accountant.

    The message always names the field (or command-line option), the value received and what is
    allowed, so that it can be shown to a user as a one-line error.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")
