"""What a real SuperLink does when a SuperNode dies mid-round, replayed in process: it answers the messages addressed
to the lost node itself (an error from node id 1, ``SUPERLINK_NODE_ID``, code ``NODE_UNAVAILABLE``) and stops listing
the node. Neither may be taken for a client: the error is no client's reply (not training client 1's), and a lost node
must not stall the next round waiting for ``min-nodes``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))
from loopback import LoopbackGrid

from fedsim.apps import client_app as client_module
from fedsim.apps import server_app as server_module
from fedsim.flower.grid import ClientIdGrid

NODES = 5
OVERRIDES = (
    f"seed=0 rounds=1 data.num_clients={NODES + 1} data.heldout_fraction=0.15 client.local_epochs=1 "
    "client.batch_size=64 privacy.sampling=all privacy.sampling_rate=none privacy.noise_placement=distributed "
    "privacy.mechanism.name=ddgauss privacy.accountant=rdp privacy.secagg.enabled=true privacy.secagg.neighbours=2"
)


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


class LostAfterKeys(LoopbackGrid):
    """The last node dies after sharing its keys: the SuperLink answers its train message with its own error, which
    arrives before the survivors' replies."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        dead = self.node_ids[-1]
        if not messages or messages[0].metadata.message_type != "train":
            return super().send_and_receive(messages, timeout=timeout)
        errors = []
        for m in messages:
            if int(m.metadata.dst_node_id) == dead:
                original = Message(m.content, dst_node_id=dead, message_type="train")
                error = Message(
                    Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable"), reply_to=original
                )
                error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
                errors.append(error)
        live = [m for m in messages if int(m.metadata.dst_node_id) != dead]
        return errors + list(super().send_and_receive(live, timeout=timeout))


def test_the_superlinks_error_for_a_lost_node_is_no_clients_reply(tmp_path):
    cfg = {
        "scenario": "quickstart",
        "overrides": OVERRIDES,
        "min-nodes": NODES,
        "run-dir": str(tmp_path / "run"),
        "diagnostics": True,
    }
    grid = LostAfterKeys(client_module.app, NODES, cfg)
    server_module.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x]
    # the round is released over the 4 survivors: one client dropped after sharing its keys, and client 1 (whose id is
    # the SuperLink's node id) is not mistaken for it
    assert [r["round"] for r in rows] == [1]
    assert rows[0]["non_private"]["failed"] == {"dropped": 1}
    assert rows[0]["non_private"]["received"] == NODES - 1


def test_a_lost_node_does_not_stall_the_next_round_waiting_for_min_nodes():
    inner = LoopbackGrid(client_module.app, NODES, {"scenario": "quickstart", "overrides": OVERRIDES})
    grid = ClientIdGrid(inner, min_nodes=NODES, connect_timeout=2)
    assert len(grid.get_node_ids()) == NODES  # the first round waits for min-nodes
    inner.node_ids.pop()  # a SuperNode died; the SuperLink stopped listing it
    assert len(grid.get_node_ids()) == NODES - 1  # the next round samples from the nodes still there, at once
