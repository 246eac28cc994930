"""The in-process engine (:class:`LocalEngine`): the cohort trains in this process, one trainer for every client."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsim.round import PartialSum
from fedsim.training.trainer import ClientTrainer, TrainSettings

from .threads import AUTO, choose_threads, torch_threads


class LocalEngine:
    """Everything in this process: no start-up cost; the reference the other engines must match.

    ``torch_threads``: torch's thread count while it trains and evaluates (``engine.torch_threads``: ``"auto"``
    chooses by training path, :mod:`fedsim.engine.threads`); the caller's count is given back after each call."""

    name = "local"

    def __init__(
        self, data: Any, settings: TrainSettings, device: str | None = None, torch_threads: int | str = AUTO
    ) -> None:
        self.data = data
        self.trainer = ClientTrainer(data, settings, device=device)
        #: the torch thread count the cohort trains with, and why (summary.json's engine)
        self.torch_threads, self.torch_threads_why = choose_threads(torch_threads, self.trainer.path.name)
        self.dim = self.trainer.dim
        self.num_workers = 1
        #: the training path the cohort takes (``per-layer``, ``vmap`` or ``loop``), as configured and checked
        self.training_path = self.trainer.path.name
        #: why faster paths were refused (``"per-layer: <reason>"``, ...): empty when the first path tried was taken
        self.training_fallbacks: tuple[str, ...] = tuple(self.trainer.path.fallbacks)

    @classmethod
    def start(cls, scenario: Any, data: Any, settings: TrainSettings) -> LocalEngine:
        """The engine of ``engine.name = "local"`` (:mod:`fedsim.registry`): of ``scenario.engine`` only
        ``torch_threads`` concerns it."""
        return cls(data, settings, torch_threads=scenario.engine.torch_threads)

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        with torch_threads(self.torch_threads):
            return self.trainer.train(plan, weights)

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        with torch_threads(self.torch_threads):
            return self.trainer.evaluate(client_ids, weights)

    def close(self) -> None:
        pass
