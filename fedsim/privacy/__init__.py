"""fedsim.privacy: what certifies. The mechanism a round releases, its DP events, the ledger, the accountants.

Public API::

    Mechanism, compose_same_cohort                 # what one round releases (and its dp-accounting event)
    ACCOUNTANTS, epsilon_curve, compute_curve      # the one registry of accountants, by name
    register_accountant, certified_methods         # add an accountant; the certified ones now
    Ledger, DpRelease                              # released rounds (any release that knows its DP event)
    register_release_kind, RELEASE_KINDS           # a release kind a saved ledger loads back
    ScheduledGaussian, ScheduleAccounting          # a round under a participation schedule or correlated noise
    PrivacySettings, AdaptiveClipping              # a run's privacy settings, validated once (and their rules)
    PrivacyInputError

What analyses the papers (generalization from privacy, the audit of the paper bounds, calibration) is in
:mod:`fedsim.privacy.paper`, which builds on this package; its core never imports it (``row_bounds.py``, which reads
a run's rows against the papers, sits above both).
"""

from .accountants import (
    ACCOUNTANTS,
    CERTIFIED,
    PAPER_BOUNDS,
    VALID_BOUNDS,
    Accountant,
    EpsilonCurve,
    accountant_names,
    certified_methods,
    compute_curve,
    epsilon_curve,
    method_kind,
    register_accountant,
)
from .discrete import RDP_ORDERS, DDGaussRound, SkellamRound, epsilon_from_rdp
from .errors import PrivacyInputError
from .ledger import RELEASE_KINDS, DpRelease, Ledger, register_release_kind
from .mechanism import Mechanism, compose_same_cohort
from .schedule import ScheduleAccounting, ScheduledGaussian
from .settings import AdaptiveClipping, PrivacySettings

register_release_kind(ScheduledGaussian)

# the distributed discrete mechanisms (ddgauss, skellam) and their release kinds: registered with fedsim.privacy
from . import discrete_noise as _discrete_noise  # noqa: E402, F401

__all__ = [
    "ACCOUNTANTS",
    "CERTIFIED",
    "PAPER_BOUNDS",
    "RDP_ORDERS",
    "RELEASE_KINDS",
    "VALID_BOUNDS",
    "Accountant",
    "AdaptiveClipping",
    "DDGaussRound",
    "DpRelease",
    "EpsilonCurve",
    "Ledger",
    "Mechanism",
    "PrivacyInputError",
    "PrivacySettings",
    "ScheduleAccounting",
    "ScheduledGaussian",
    "SkellamRound",
    "accountant_names",
    "certified_methods",
    "compose_same_cohort",
    "compute_curve",
    "epsilon_curve",
    "epsilon_from_rdp",
    "method_kind",
    "register_accountant",
    "register_release_kind",
]
