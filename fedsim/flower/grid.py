"""A Grid that addresses nodes by *client id* (the scenario's training client a node holds).

Flower's node ids are random integers, so a strategy that samples over sorted node ids would pick a different
cohort in every run and in every engine. :class:`ClientIdGrid` asks every node once which client it is (the
``query.fedsim_identity`` message the fedsim ClientApp answers from its ``partition-id``), then shows the
strategy client ids instead of node ids (``get_node_ids``) and rewrites each message's destination from client
id to node id on the way out. DPFedAvg then samples *client ids* with its seeded generator, exactly as the
fedsim engines do, and the same seed gives the same cohort on Flower as on Ray or in-process.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

IDENTITY_MESSAGE_TYPE = "query.fedsim_identity"
KEY_CLIENT_ID = "fedsim.client-id"
KEY_PARTITION_ID = "fedsim.partition-id"


def wait_for_nodes(grid: Grid, min_nodes: int, timeout: float = 120.0, poll: float = 0.2) -> list[int]:
    """Block until at least ``min_nodes`` nodes are connected; their ids (TimeoutError after ``timeout`` s).

    Flower registers (simulated or real) SuperNodes asynchronously: right after the ServerApp starts,
    ``grid.get_node_ids()`` may still be empty.
    """
    deadline = time.monotonic() + timeout
    last = -1
    while len(nodes := [int(n) for n in grid.get_node_ids()]) < min_nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {min_nodes} nodes connected after {timeout:.0f} s")
        if len(nodes) != last:
            log(INFO, "Waiting for nodes to connect: %d of %d", len(nodes), min_nodes)
            last = len(nodes)
        time.sleep(poll)
    return nodes


class NodeIdentityError(RuntimeError):
    """A node did not say which client it is, or two nodes claim the same client."""


def query_identities(grid: Grid, node_ids: Iterable[int], timeout: float | None = None) -> dict[int, int]:
    """node id -> client id, asked of each node (raises :class:`NodeIdentityError` on any bad reply)."""
    nodes = sorted(int(n) for n in node_ids)
    messages = [
        Message(
            content=RecordDict({"config": ConfigRecord({})}),
            message_type=IDENTITY_MESSAGE_TYPE,
            dst_node_id=n,
        )
        for n in nodes
    ]
    mapping: dict[int, int] = {}
    errors: list[str] = []
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = int(reply.metadata.src_node_id)
        if reply.has_error():
            errors.append(f"node {node}: {reply.error.reason}")
            continue
        rec = next(iter(reply.content.config_records.values()), None)
        if rec is None or KEY_CLIENT_ID not in rec:
            errors.append(f"node {node}: reply has no {KEY_CLIENT_ID!r}")
            continue
        mapping[node] = int(rec[KEY_CLIENT_ID])
    missing = set(nodes) - set(mapping)
    if errors or missing:
        detail = "; ".join(errors) or f"no reply from nodes {sorted(missing)}"
        raise NodeIdentityError(f"could not learn which client each node holds: {detail}")
    clients = list(mapping.values())
    if len(set(clients)) != len(clients):
        dup = sorted({c for c in clients if clients.count(c) > 1})
        raise NodeIdentityError(f"several nodes hold the same client(s) {dup}: check their partition-id")
    return mapping


class ClientIdGrid(Grid):
    """Wraps a Grid so that node ids seen by the strategy are the nodes' client ids.

    Nodes that join later are asked who they are the next time ``get_node_ids`` is called; nodes that left
    are dropped. ``node_to_client`` holds the current mapping. The first ``get_node_ids`` waits (up to
    ``connect_timeout`` s) until ``min_nodes`` nodes are connected; later ones take the nodes connected then.
    """

    def __init__(
        self, grid: Grid, min_nodes: int = 1, timeout: float | None = None, connect_timeout: float = 120.0
    ) -> None:
        self._grid = grid
        self._timeout = timeout
        self._min_nodes = min_nodes
        self._connect_timeout = connect_timeout
        self.node_to_client: dict[int, int] = {}
        self.client_to_node: dict[int, int] = {}
        self._waited = False

    # ---------------------------------------------------------------- mapping
    def refresh(self) -> dict[int, int]:
        # min_nodes is how many to wait for before the first round; a node lost later must not stall the next round
        if self._waited:
            nodes = {int(n) for n in self._grid.get_node_ids()}
        else:
            nodes = set(wait_for_nodes(self._grid, self._min_nodes, self._connect_timeout))
            self._waited = True
        new = nodes - set(self.node_to_client)
        for gone in set(self.node_to_client) - nodes:
            self.client_to_node.pop(self.node_to_client.pop(gone), None)
        if new:
            found = query_identities(self._grid, new, timeout=self._timeout)
            for node, client in found.items():
                if client in self.client_to_node:
                    log(
                        WARNING,
                        "client %d: node %d replaces node %d",
                        client,
                        node,
                        self.client_to_node[client],
                    )
                    self.node_to_client.pop(self.client_to_node[client], None)
                self.node_to_client[node] = client
                self.client_to_node[client] = node
            log(INFO, "ClientIdGrid: %d node(s) identified, %d in all", len(found), len(self.node_to_client))
        return self.node_to_client

    def _to_node(self, msg: Message) -> Message:
        cid = int(msg.metadata.dst_node_id)
        if cid not in self.client_to_node:
            raise KeyError(f"no connected node holds client {cid}")
        return Message(
            content=msg.content,
            message_type=msg.metadata.message_type,
            dst_node_id=self.client_to_node[cid],
            group_id=msg.metadata.group_id,
            ttl=msg.metadata.ttl,
        )

    # ---------------------------------------------------------------- Grid API
    def set_run(self, run) -> None:  # type: ignore[override]
        self._grid.set_run(run)

    @property
    def run(self):  # type: ignore[override]
        return self._grid.run

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[override]
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return sorted(self.refresh().values())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages([self._to_node(m) for m in messages])

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self._grid.send_and_receive([self._to_node(m) for m in messages], timeout=timeout)
