"""The round's plan: what the server decided before a round, the one object that goes from the strategy through the
engine to the trainer.

It lives here, low in the package, because it travels: a Ray worker unpickles it every round, and this module
imports nothing heavier than NumPy (the strategies import Flower, which would cost each worker about 0.4 s of imports
on its first round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .noise import NoiseSource, noise_share_std

#: the name of adaptive clipping's release (the noised count of unclipped updates) in a round's releases
CLIP_COUNT = "clip-count"


@dataclass
class RoundPlan:
    """What the server decided before a round: who trains and what the round releases. The one object that goes
    from the strategy through the engine to the trainer.

    ``mechanism`` (the model release, a :class:`fedsim.privacy.Mechanism`) is the only source of the round's clip and noise std; ``releases`` are every
    release of the round, each on the round's cohort (the model first); ``noise`` is where the clients' noise shares
    come from (distributed noise: the noise source's :meth:`~fedsim.round.NoiseSource.for_clients`, seeded in
    simulation, the operating system otherwise; None with central noise)."""

    round: int
    cohort: np.ndarray
    mechanism: Any
    releases: list[tuple[str, Any]] = field(default_factory=list)
    noise: NoiseSource | None = None
    client_weights: dict[int, float] | None = None  # per-client aggregation weights (agnostic FL)
    loss_bound: float | None = None  # ask clients for their bounded loss of the global model (agnostic FL)
    #: the round's public randomness (:meth:`~fedsim.round.NoiseSource.public_randomness`: a rotation's seed), drawn
    #: once by the server for a mechanism whose clients encode
    public: dict[str, int] = field(default_factory=dict)

    @property
    def encodes(self) -> bool:
        """Whether the clients send encodings the server decodes (:attr:`~fedsim.round.NoiseSource.encodes`)."""
        return self.noise is not None and self.noise.encodes and self.mechanism.placement.clients_add_noise

    def encoding_for(self, size: int) -> dict[str, Any]:
        """What every client encodes its update of ``size`` numbers with this round: the mechanism's public
        parameters for the round's release and the round's public randomness."""
        assert self.noise is not None
        return {**self.noise.encoding(self.mechanism, size), **self.public}

    @property
    def population(self) -> int:
        return self.mechanism.population

    @property
    def clip(self) -> float:
        """The clip applied to every update this round (``inf``: no clipping, the plain-FedAvg baseline)."""
        return self.mechanism.clip if self.mechanism.clip > 0 else math.inf

    def release(self, name: str) -> Any:
        return next((m for n, m in self.releases if n == name), None)

    def share_std(self, name: str = "model") -> float:
        """Distributed noise: the scale (Gaussian noise: the std) of each sampled client's share of release ``name``,
        as the noise mechanism defines a share (:meth:`~fedsim.round.NoiseSource.share_scale`); 0 where the clients
        add no noise."""
        m = self.mechanism if name == "model" else self.release(name)
        if m is None or not m.placement.clients_add_noise:
            return 0.0
        if self.noise is not None:
            return self.noise.share_scale(m.noise_std, m.expected_cohort)
        if not m.gaussian:  # only the mechanism knows what a share of its noise is
            raise ValueError(f"a share of {m.noise_kind} noise needs the plan's noise mechanism (plan.noise)")
        return noise_share_std(m)

    @property
    def noise_share_std(self) -> float:
        """Each client's share of the model update's noise (0 with central noise)."""
        return self.share_std("model")

    @property
    def count_share_std(self) -> float:
        """Distributed noise with adaptive clipping: each client's share of the noise on its unclipped bit."""
        return self.share_std(CLIP_COUNT)

    def sampled(self, client: int) -> bool:
        """Whether ``client`` is in this round's cohort."""
        if not hasattr(self, "_members"):
            self._members = frozenset(int(c) for c in self.cohort)
        return int(client) in self._members
