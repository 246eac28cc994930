"""A round "as if under SecAgg+", without the cryptography: who drops, and whether the round could be unmasked.

The simulated engines already sum the clients' encodings modulo ``2^bits``, which is exactly what a secure sum gives
the server. What SecAgg+ adds to a round is its failure mode: a client that drops after sharing its keys contributes
nothing (its masks are removed with its neighbours' shares), and a round whose survivors hold fewer than ``t`` shares
of a secret the sum needs is aborted with nothing released. :func:`simulate_round` draws the same neighbour graph a
deployed server draws (:func:`fedsim.secagg.graph.harary`) and the dropouts (each sampled client independently with
probability ``secagg.dropout``), and applies the same recoverability rule (:func:`fedsim.secagg.graph.unrecoverable`),
so a sweep predicts which rounds a deployment with such dropouts completes, and with how much noise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .graph import harary, unrecoverable


@dataclass(frozen=True)
class SimulatedRound:
    """A round's graph and its clients that drop after sharing their keys (``dropped``), drawn before training;
    :meth:`aborted` says, after training, whether the round could be unmasked."""

    cohort: np.ndarray
    dropped: np.ndarray
    graph: dict[int, tuple[int, ...]]
    threshold: int

    def aborted(self, failed: Iterable[int] = ()) -> str | None:
        """Why the round cannot be unmasked (None: it can). ``failed``: sampled clients whose training failed: in a
        deployment they send no masked input either, so they count as dropped after sharing their keys."""
        gone = {int(c) for c in self.dropped} | {int(c) for c in failed}
        survivors = [int(c) for c in self.cohort if int(c) not in gone]
        dropped = sorted(gone.intersection(int(c) for c in self.cohort))
        if self.cohort.size < 2:
            return "fewer than 2 clients answered the key setup"
        return unrecoverable(self.graph, survivors, dropped, survivors, self.threshold)


def simulate_round(cohort: Any, secagg: Any, rng: Any) -> SimulatedRound:
    """The graph and the dropouts of one round of ``cohort`` (client ids) under ``secagg``
    (:class:`fedsim.privacy.settings.SecureAggregation`), drawn from ``rng`` (the strategy's secure-aggregation
    stream): first the graph, then one uniform per client, in cohort order."""
    ids = np.asarray(cohort, dtype=np.int64)
    graph = harary(ids.tolist(), secagg.degree(ids.size), rng) if ids.size else {}
    drop = (
        np.asarray(rng.random(ids.size)) < secagg.dropout if secagg.dropout > 0 else np.zeros(ids.size, bool)
    )
    return SimulatedRound(ids, ids[drop], graph, secagg.shares_needed(ids.size))
