"""An in-process Flower Grid for tests: the shipped ServerApp's ``main`` talks to real ClientApps, no Ray, no network.

Each node is a ClientApp with its own :class:`flwr.app.Context` (``partition-id`` in its node config), as a
SuperNode would hold it. Messages are delivered by calling the ClientApp, exactly what a SuperNode's
ClientApp process does with a message it pulled; the Grid records every message and reply so that a test can
see what crossed the wire.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid


class LoopbackGrid(Grid):
    def __init__(self, client_app: Any, num_nodes: int, run_config: dict[str, Any]) -> None:
        self.client_app = client_app
        self.node_ids = [1_000_003 * (i + 1) for i in range(num_nodes)]  # not the partition ids
        self.contexts = {
            node: Context(
                run_id=1,
                node_id=node,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, node in enumerate(self.node_ids)
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self._pending: dict[str, Message] = {}

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            node = int(msg.metadata.dst_node_id)
            reply = self.client_app(msg, self.contexts[node])
            reply.metadata.__dict__["_src_node_id"] = node
            self.replies.append(reply)
            self._pending[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._pending.pop(m) for m in message_ids if m in self._pending]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
