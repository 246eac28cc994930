"""The in-process engine (:class:`LocalEngine`): the cohort trains in this process, one trainer for every client."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsim.round import PartialSum
from fedsim.training.trainer import ClientTrainer, TrainSettings


class LocalEngine:
    """Everything in this process: no start-up cost; the reference the other engines must match."""

    name = "local"

    def __init__(self, data: Any, settings: TrainSettings, device: str | None = None) -> None:
        self.data = data
        self.trainer = ClientTrainer(data, settings, device=device)
        self.dim = self.trainer.dim
        self.num_workers = 1
        #: the training path the cohort takes (``per-layer``, ``vmap`` or ``loop``), as configured and checked
        self.training_path = self.trainer.path.name
        #: why faster paths were refused (``"per-layer: <reason>"``, ...): empty when the first path tried was taken
        self.training_fallbacks: tuple[str, ...] = tuple(self.trainer.path.fallbacks)

    @classmethod
    def start(cls, scenario: Any, data: Any, settings: TrainSettings) -> LocalEngine:
        """The engine of ``engine.name = "local"`` (:mod:`fedsim.registry`): nothing of ``scenario.engine`` sizes it."""
        return cls(data, settings)

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        return self.trainer.train(plan, weights)

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return self.trainer.evaluate(client_ids, weights)

    def close(self) -> None:
        pass
