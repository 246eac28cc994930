"""fedsim.privacy: the project's central privacy accountant.

Public API::

    Mechanism, compose_same_cohort                 # what one round releases
    ACCOUNTANTS, epsilon_curve, compute_curve      # per-round epsilon by method
    Ledger                                         # released rounds, serialisable
    generalization_statement, corollary3_curve, min_population   # Theorem 1 (UAI / arXiv)
    audit_closed_forms                             # why the paper bounds are not certificates
    calibrate_noise                                # noise multiplier for a target (eps, delta)
    PrivacyInputError
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
from .mechanism import Mechanism, compose_same_cohort
from .ledger import Ledger
from .generalization import corollary3_curve, generalization_statement, min_population
from .audit import audit_closed_forms
from .calibration import calibrate_noise

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "VALID_BOUNDS",
    "method_kind",
    "PAPER_BOUNDS",
    "EpsilonCurve",
    "Ledger",
    "Mechanism",
    "PrivacyInputError",
    "audit_closed_forms",
    "calibrate_noise",
    "compose_same_cohort",
    "compute_curve",
    "corollary3_curve",
    "epsilon_curve",
    "generalization_statement",
    "min_population",
]
