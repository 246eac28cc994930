"""fedsim.privacy: what certifies. The mechanism a round releases, its DP events, the ledger, the accountants.

Public API::

    Mechanism, compose_same_cohort                 # what one round releases (and its dp-accounting event)
    ACCOUNTANTS, epsilon_curve, compute_curve      # the one registry of accountants, by name
    Ledger                                         # released rounds, serialisable
    PrivacyInputError

What analyses the papers (generalization from privacy, the audit of the paper bounds, calibration) is in
:mod:`fedsim.privacy.paper`, which builds on this package; this package never imports it.
"""

from .accountants import (
    ACCOUNTANTS,
    CERTIFIED,
    PAPER_BOUNDS,
    VALID_BOUNDS,
    EpsilonCurve,
    compute_curve,
    epsilon_curve,
    method_kind,
)
from .errors import PrivacyInputError
from .ledger import Ledger
from .mechanism import Mechanism, compose_same_cohort

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "PAPER_BOUNDS",
    "VALID_BOUNDS",
    "EpsilonCurve",
    "Ledger",
    "Mechanism",
    "PrivacyInputError",
    "compose_same_cohort",
    "compute_curve",
    "epsilon_curve",
    "method_kind",
]
