"""Grids for testing SecAgg+ (fedsim.secagg.protocol) without a network.

* :class:`DirectGrid`: the nodes are bare SecAgg+ clients, each with its own :class:`flwr.app.Context`, answering
  with :func:`~fedsim.secagg.protocol.handle_query` and :func:`~fedsim.secagg.protocol.mask_input` of a given
  encoding: no training, no ClientApp, so the cryptographic properties are checked on arbitrary encodings in
  milliseconds. A client can stop answering from any stage on (a dropout).
* :class:`SecAggLoopbackGrid`: ``tests/apps/loopback.py``'s Grid of shipped ClientApps, with what a SuperNode adds: a
  ClientApp that raises becomes an error reply (as ``flwr.supernode.runtime.run_clientapp`` makes it), and nodes can
  stop answering, so the shipped ServerApp meets dropouts.

Both record every message sent and every reply, so a test sees exactly what crossed the wire.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode

from fedsim.flower.protocol import CFG_ROUND, train_config
from fedsim.privacy.settings import SecureAggregation
from fedsim.secagg.protocol import STAGE, STATE, SecureSum, handle_query, mask_input, masked_reply, secure_sum

_APPS = str(Path(__file__).resolve().parents[1] / "apps")
if _APPS not in sys.path:  # pytest puts tests/apps on sys.path only when it collects a test there
    sys.path.insert(0, _APPS)
from loopback import LoopbackGrid  # noqa: E402  (tests/apps/loopback.py)

#: the stages of a round in the order a client meets them (the masked input is the round's train message)
STAGES = ("setup", "share-keys", "masked-input", "unmask")


def stage_of(msg: Message) -> str:
    """The SecAgg+ stage a server message asks for (``masked-input`` for the train message)."""
    if msg.metadata.message_type == MessageType.TRAIN:
        return "masked-input"
    return str(next(iter(msg.content.config_records.values()))[STAGE])


def plan_for(cohort: Sequence[int], bits: int, dim: int) -> SimpleNamespace:
    """A round plan as :func:`secure_sum` and :func:`fedsim.flower.protocol.train_config` read it: the cohort and a
    public encoding of ``dim`` integers modulo ``2^bits`` (no noise: the clients here encode nothing themselves)."""
    return SimpleNamespace(
        round=1,
        cohort=np.asarray(cohort, dtype=np.int64),
        clip=1.0,
        noise_share_std=0.0,
        count_share_std=0.0,
        loss_bound=None,
        encodes=True,
        encoding_for=lambda size: {"bits": int(bits), "dim": int(dim)},
    )


class DirectGrid:
    """Bare SecAgg+ clients addressed by client id (node id = client id).

    ``encodings``: client -> the integers modulo ``2^bits`` it masks; ``silent``: client -> the first stage of
    :data:`STAGES` it no longer answers (it answers every stage before). ``secrets`` keeps each client's key pairs and
    self-mask seed as they were after its last answer, so a test can look for them in what the server received.
    A client that refuses a message raises here, as its ClientApp would: a correct server is never refused, so a
    refusal fails the test instead of passing as a dropout.
    """

    def __init__(
        self, encodings: dict[int, np.ndarray], bits: int, silent: dict[int, str] | None = None
    ) -> None:
        self.encodings = {int(c): np.asarray(e, dtype=np.int64) for c, e in encodings.items()}
        self.bits = int(bits)
        self.silent = {int(c): STAGES.index(s) for c, s in (silent or {}).items()}
        self.contexts = {
            c: Context(run_id=1, node_id=c, node_config={}, state=RecordDict(), run_config={})
            for c in self.encodings
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self.secrets: dict[int, dict[str, bytes]] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        out = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.sent.append(msg)
            client = int(msg.metadata.dst_node_id)
            if STAGES.index(stage_of(msg)) >= self.silent.get(client, len(STAGES)):
                continue
            reply = self._answer(msg, client)
            reply.metadata.__dict__["_src_node_id"] = client
            self.replies.append(reply)
            out.append(reply)
        return out

    def _answer(self, msg: Message, client: int) -> Message:
        context = self.contexts[client]
        config = next(iter(msg.content.config_records.values()))
        if msg.metadata.message_type == MessageType.TRAIN:
            server_round = int(config[CFG_ROUND])
            masked = mask_input(config, context, client, self.encodings[client], self.bits, server_round)
            content = RecordDict({"arrays": masked_reply(masked)})
        else:
            content = RecordDict({"secagg": handle_query(config, context, client)})
        if STATE in context.state:  # the unmasking stage deletes the state: keep what it held
            state = context.state[STATE]
            self.secrets[client] = {k: state[k] for k in ("sk1", "sk2", "seed") if k in state}
        return Message(content, reply_to=msg)


def run_secure_sum(
    encodings: dict[int, np.ndarray],
    bits: int,
    *,
    neighbours: int = 0,
    threshold: float = 0.6,
    silent: dict[int, str] | None = None,
    rng: Any = None,
    cohort: Sequence[int] | None = None,
) -> tuple[SecureSum, DirectGrid]:
    """One SecAgg+ round of :func:`secure_sum` over a :class:`DirectGrid` of ``encodings``' clients (``cohort``: the
    sampled order, default the encodings' order; ``rng``: the server's graph generator, default seeded)."""
    grid = DirectGrid(encodings, bits, silent)
    dim = len(next(iter(grid.encodings.values())))
    ids = list(grid.encodings) if cohort is None else [int(c) for c in cohort]
    model = ArrayRecord(array_dict={"w": Array(np.zeros(3, dtype=np.float32))})
    plan = plan_for(ids, bits, dim)
    result = secure_sum(
        grid,
        plan,
        model,
        train_config(plan, size=3),
        SecureAggregation(neighbours=neighbours, threshold=threshold),
        np.random.default_rng(0) if rng is None else rng,
    )
    return result, grid


def error_reply(exc: BaseException, msg: Message) -> Message:
    """The reply a SuperNode sends when its ClientApp raised (``flwr.supernode.runtime.run_clientapp``)."""
    reason = str(type(exc)) + ":<'" + str(exc) + "'>"
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


class SecAggLoopbackGrid(LoopbackGrid):
    """The loopback Grid with a SuperNode's behaviour on failure: a ClientApp that raises sends an error reply, and a
    node for which ``stops(context, msg)`` is true (``context``: the node's, whose node config holds its
    ``partition-id``) answers neither that message nor any later one."""

    def __init__(
        self,
        client_app: Any,
        num_nodes: int,
        run_config: dict[str, Any],
        stops: Callable[[Context, Message], bool] | None = None,
    ) -> None:
        super().__init__(client_app, num_nodes, run_config)
        self.stops = stops
        self.stopped: set[int] = set()

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            ids.append(mid)
            node = int(msg.metadata.dst_node_id)
            if node in self.stopped or (self.stops is not None and self.stops(self.contexts[node], msg)):
                self.stopped.add(node)
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as exc:
                reply = error_reply(exc, msg)
            reply.metadata.__dict__["_src_node_id"] = node
            self.replies.append(reply)
            self._pending[mid] = reply
        return ids
