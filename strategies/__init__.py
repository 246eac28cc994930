"""Flower strategies with client-level differential privacy (installed as ``fedsim.strategies``).

They subclass :class:`flwr.serverapp.strategy.Strategy`, so any Flower ServerApp can ``start()`` them;
fedsim's engines drive the same objects through ``begin_round`` / ``finish_round``.
"""

from fedsim.privacy.settings import AdaptiveClipping, PrivacySettings

from .dpfedavg import BudgetExhausted, DPFedAvg, RoundPlan
from .server_opt import SERVER_OPTIMIZERS, ServerOptimizer

__all__ = [
    "SERVER_OPTIMIZERS",
    "AdaptiveClipping",
    "BudgetExhausted",
    "DPFedAvg",
    "PrivacySettings",
    "RoundPlan",
    "ServerOptimizer",
]

from .agnostic import DPAgnosticFedAvg, project_to_simplex

__all__ += ["DPAgnosticFedAvg", "project_to_simplex"]
