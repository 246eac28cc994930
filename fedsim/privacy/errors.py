"""Errors raised by :mod:`fedsim.privacy` (the one error class lives in :mod:`fedsim.validation`)."""

from fedsim.validation import PrivacyInputError

__all__ = ["PrivacyInputError"]
