"""An engine whose clients are Flower nodes: the round loop's cohort trains on whatever a Flower Grid reaches.

Under Flower's Simulation Engine the nodes are virtual SuperNodes; deployed, they are real SuperNodes behind a
SuperLink. Either way a round is: the plan's train messages (:mod:`fedsim.flower.protocol`) to the sampled
clients, their replies into the strategy's partial sum (``strategy.collect_replies``: the same checks as the
strategy's own Flower Message API), and an error, a malformed reply or a missing reply counted as rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from fedsim.privacy.settings import simulated_dropout_refusal
from fedsim.round import PartialSum, id_array
from fedsim.round.randomness import STREAM_SECAGG
from fedsim.secagg.protocol import secure_sum

from . import protocol


class GridEngine:
    """The :class:`fedsim.loop.Engine` of a Flower Grid.

    ``grid`` addresses nodes by client id (:class:`fedsim.flower.grid.ClientIdGrid`); ``strategy`` turns replies
    into the partial sum; ``like``: the global model's ArrayRecord layout (keys, shapes, dtypes), which the
    replies must match; ``evaluator(client_ids, weights)``: server-side evaluation on data the server holds.
    """

    name = "flower"

    def __init__(
        self,
        grid: Grid,
        strategy: Any,
        like: ArrayRecord,
        evaluator: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.grid = grid
        self.strategy = strategy
        self.like = like
        self.evaluator = evaluator
        self.timeout = timeout
        #: the last SecAgg+ round's outcome (fedsim.secagg.protocol.SecureSum)
        self.last_secure_sum: Any = None
        if (why := simulated_dropout_refusal(strategy.privacy)) is not None:
            raise ValueError(why)

    def available(self, round_: int | None = None) -> np.ndarray:
        """The client ids of the nodes connected now (what a round samples from and is accounted over)."""
        return id_array(self.grid.get_node_ids())

    @property
    def secure_aggregation(self) -> bool:
        """Whether rounds run the SecAgg+ protocol with the nodes (the strategy's ``privacy.secagg``)."""
        return getattr(self.strategy.privacy, "secagg", None) is not None

    def train(self, plan: Any, weights: np.ndarray) -> tuple[PartialSum, list[dict[str, Any]]]:
        arrays = protocol.to_arrays(weights, self.like)
        if self.secure_aggregation:
            if not plan.encodes:  # unreachable (the settings refuse it): never send anything unmasked instead
                raise RuntimeError("secure aggregation needs a mechanism whose clients encode")
            return self._secure_train(plan, arrays, weights.size), []
        sent = protocol.flat_arrays(arrays)  # what the clients start from (the global model as float32)
        replies = self.grid.send_and_receive(protocol.train_messages(plan, arrays), timeout=self.timeout)
        node_to_client = dict(getattr(self.grid, "node_to_client", {}) or {})
        partial = self.strategy.collect_replies(plan, sent, arrays, replies, node_to_client)
        return partial, []

    def _secure_train(self, plan: Any, arrays: ArrayRecord, size: int) -> PartialSum:
        """The round through SecAgg+ (:func:`fedsim.secagg.protocol.secure_sum`): the partial sum holds only the
        survivors' encodings summed modulo ``2^bits``; the graph comes from the strategy's generator (the operating
        system's entropy in deployment)."""
        rng = self.strategy.noise.rng(plan.round, STREAM_SECAGG)
        config = protocol.train_config(plan, size=size)
        result = secure_sum(
            self.grid, plan, arrays, config, self.strategy.privacy.secagg, rng, timeout=self.timeout
        )
        self.last_secure_sum = result
        partial = PartialSum(size)
        for reason, n in result.failures.items():
            partial.reject(n, reason=reason)
        partial.reject(len(result.dropped), reason="dropped")
        if result.aborted is not None:
            partial.secure_abort = result.aborted
        elif result.total is not None:
            partial.add_secure_sum(result.total, len(result.survivors))
        return partial

    def evaluate(self, client_ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        if self.evaluator is None:
            raise RuntimeError(
                "this GridEngine has no server-side evaluator: the server holds no evaluation data"
            )
        return self.evaluator(client_ids, weights)

    def close(self) -> None:
        pass
