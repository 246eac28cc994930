"""Server optimizers applied to the private mean update (a pseudo-gradient, Reddi et al. 2021).

They only post-process the already-private aggregate, so they cost no privacy.
"""

from __future__ import annotations

import numpy as np

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")


class ServerOptimizer:
    """``sgd``: w += lr*u; ``momentum``: v = m*v + u, w += lr*v; ``adam``: FedAdam with denominator eps."""

    def __init__(
        self,
        name: str = "sgd",
        lr: float = 1.0,
        momentum: float = 0.9,
        beta2: float = 0.99,
        eps: float = 1e-3,
    ) -> None:
        if name not in SERVER_OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}; got {name!r}")
        if lr <= 0:
            raise ValueError(f"server lr must be > 0, got {lr}")
        self.name, self.lr, self.momentum, self.beta2, self.eps = name, lr, momentum, beta2, eps
        self._m: np.ndarray | None = None
        self._v: np.ndarray | None = None

    def step(self, weights: np.ndarray, update: np.ndarray) -> np.ndarray:
        if self.name == "sgd":
            return weights + self.lr * update
        if self._m is None:
            self._m = np.zeros_like(update)
            self._v = np.zeros_like(update)
        if self.name == "momentum":
            self._m = self.momentum * self._m + update
            return weights + self.lr * self._m
        self._m = self.momentum * self._m + (1 - self.momentum) * update
        self._v = self.beta2 * self._v + (1 - self.beta2) * update * update
        return weights + self.lr * self._m / (np.sqrt(self._v) + self.eps)

    def state_dict(self) -> dict:
        return {"m": self._m, "v": self._v}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s moments (``None``: not started)."""
        self._m = None if state.get("m") is None else np.asarray(state["m"], dtype=np.float64).copy()
        self._v = None if state.get("v") is None else np.asarray(state["v"], dtype=np.float64).copy()
