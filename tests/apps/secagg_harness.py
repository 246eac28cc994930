"""A Flower App for testing SecAgg+ on a real SuperLink: the shipped ServerApp, watched, and a seeded ClientApp.

``tests/apps/test_secagg_deployment.py`` deploys it with ``scripts/deploy_smoke.sh`` (``FEDSIM_SMOKE_SERVERAPP`` =
``tests.apps.secagg_harness:server_app``, ``FEDSIM_SMOKE_CLIENTAPP`` = ``tests.apps.secagg_harness:client_app``).

``server_app`` runs :func:`fedsim.apps.server_app.main` itself, on a :class:`CapturingGrid` around the Grid Flower
gives it, so the test sees what the server saw:

* every message the server sends and every reply it receives is written to the run config's ``capture-dir``
  (one pickle per exchange, :func:`load_capture` reads them back): what crossed the wire, not what the server made
  of it;
* what :class:`~fedsim.flower.grid_engine.GridEngine` made of each SecAgg+ round (the unmasked modular sum, the
  survivors, the dropped clients, the abort) is written beside it (``secure-sum-r<round>.pkl``);
* with the run config's ``signal-dir`` (``deploy_smoke.sh`` sets it for a kill plan), after round ``n``'s share-keys
  replies are in it writes ``keys-shared-r<n>`` there and waits for ``resume-r<n>``: the script kills SuperNodes in
  that pause, so a node dies after sharing its keys and before its masked input, with no race against the server;
* with the run config's ``wait-nodes``, it first waits until that many SuperNodes are connected, so round 1 samples
  all of them while ``min-nodes`` stays low enough for the rounds after a node died
  (:class:`~fedsim.flower.grid.ClientIdGrid` waits for ``min-nodes`` before every round, not only the first).

``client_app`` is the fedsim ClientApp with seeded noise shares (:func:`fedsim.apps.client_app.make_client_app`'s
``noise_seed``, which the shipped app never has), so the test can recompute each client's encoding in-process from
the train message the server sent it. Only the noise is seeded: the keys, seeds and masks of SecAgg+ still come from
each node's operating system.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedsim.apps.client_app import make_client_app
from fedsim.flower.grid import wait_for_nodes
from fedsim.secagg.protocol import MESSAGE_TYPE as SECAGG_MESSAGE_TYPE
from fedsim.secagg.protocol import SHARE_KEYS, STAGE

#: the seed of the deployed ClientApp's noise shares (the test recomputes the encodings with it)
NOISE_SEED = 37
#: run-config keys this harness reads (besides the shipped ServerApp's)
CAPTURE_DIR = "capture-dir"
SIGNAL_DIR = "signal-dir"
WAIT_NODES = "wait-nodes"
#: how long the server waits for ``resume-r<n>`` before giving up (the kill takes well under a second)
RESUME_TIMEOUT_S = 120.0


def dump_message(msg: Message) -> dict[str, Any]:
    """A message as plain Python and numpy values: metadata, error, and every record's content."""
    md = msg.metadata
    out: dict[str, Any] = {
        "message_id": md.message_id,
        "reply_to": md.reply_to_message_id,
        "src": int(md.src_node_id),
        "dst": int(md.dst_node_id),
        "type": md.message_type,
        "group_id": md.group_id,
        "error": None,
        "arrays": {},
        "configs": {},
        "metrics": {},
    }
    if msg.has_error():
        out["error"] = {"code": int(msg.error.code), "reason": msg.error.reason}
    if msg.has_content():
        content = msg.content
        out["arrays"] = {
            name: {key: arr.numpy() for key, arr in rec.items()}
            for name, rec in content.array_records.items()
        }
        out["configs"] = {name: dict(rec) for name, rec in content.config_records.items()}
        out["metrics"] = {name: dict(rec) for name, rec in content.metric_records.items()}
    return out


def _write(path: Path, value: Any) -> None:
    """Pickle ``value`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(value))
    os.replace(tmp, path)


def _secagg_stage(messages: list[Message]) -> str | None:
    for msg in messages:
        if msg.metadata.message_type == SECAGG_MESSAGE_TYPE and msg.has_content():
            for rec in msg.content.config_records.values():
                if STAGE in rec:
                    return str(rec[STAGE])
    return None


class CapturingGrid(Grid):
    """A Grid that records every exchange with the nodes, and pauses after each SecAgg+ share-keys exchange.

    ``capture_dir``: where ``exchange-<seq>.pkl`` files go, each ``{"seq", "sent", "replies"}`` with the messages
    as :func:`dump_message` writes them (the sent ones after they were pushed, so they carry their message ids);
    ``signal_dir``: where the pause's marker and resume files are (None: no pause).
    """

    def __init__(self, grid: Grid, capture_dir: Path, signal_dir: Path | None) -> None:
        self._grid = grid
        self._capture = capture_dir
        self._signals = signal_dir
        self._seq = 0
        self._key_rounds = 0

    def _record(self, sent: list[Message], replies: list[Message]) -> None:
        self._seq += 1
        record = {
            "seq": self._seq,
            "sent": [dump_message(m) for m in sent],
            "replies": [dump_message(m) for m in replies],
        }
        _write(self._capture / f"exchange-{self._seq:04d}.pkl", record)

    def _pause_after_keys(self) -> None:
        self._key_rounds += 1
        if self._signals is None:
            return
        n = self._key_rounds
        (self._signals / f"keys-shared-r{n}").touch()
        resume = self._signals / f"resume-r{n}"
        deadline = time.monotonic() + RESUME_TIMEOUT_S
        while not resume.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"secagg harness: no {resume} within {RESUME_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    # ---------------------------------------------------------------- Grid API
    def set_run(self, run) -> None:  # type: ignore[override]
        self._grid.set_run(run)

    @property
    def run(self):  # type: ignore[override]
        return self._grid.run

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[override]
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(self._grid.push_messages(messages))
        self._record(messages, [])
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self._grid.pull_messages(message_ids))
        if replies:
            self._record([], replies)
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self._record(messages, replies)
        if _secagg_stage(messages) == SHARE_KEYS:
            self._pause_after_keys()
        return replies


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The shipped ServerApp's ``main`` on a :class:`CapturingGrid`, with each SecAgg+ round's outcome recorded."""
    # imported here, not with the module: a SuperNode starts a ClientApp process for every message, and each imports
    # this module; the server's modules would add over a second to each
    from fedsim.apps import server_app as fedsim_server
    from fedsim.flower.grid_engine import GridEngine

    cfg = dict(context.run_config)
    capture = Path(str(cfg[CAPTURE_DIR]))
    capture.mkdir(parents=True, exist_ok=True)
    signals = Path(str(cfg[SIGNAL_DIR])) if cfg.get(SIGNAL_DIR) else None
    if int(cfg.get(WAIT_NODES, 0) or 0) > 0:
        wait_for_nodes(grid, int(cfg[WAIT_NODES]), timeout=300.0)

    original = GridEngine._secure_train

    def recording(self: Any, plan: Any, arrays: Any, size: int) -> Any:
        partial = original(self, plan, arrays, size)
        result = self.last_secure_sum
        _write(
            capture / f"secure-sum-r{int(plan.round)}.pkl",
            {
                "round": int(plan.round),
                "total": result.total,
                "survivors": list(result.survivors),
                "dropped": list(result.dropped),
                "failures": dict(result.failures),
                "aborted": result.aborted,
                "stages": dict(result.stages),
            },
        )
        return partial

    GridEngine._secure_train = recording  # this ServerApp process runs this one run
    try:
        fedsim_server.main(CapturingGrid(grid, capture, signals), context)
    finally:
        GridEngine._secure_train = original


client_app = make_client_app(noise_seed=NOISE_SEED)


def load_capture(capture_dir: Path) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """The exchanges (in order) and each SecAgg+ round's outcome (by round) a run's ``capture-dir`` holds."""
    exchanges = [pickle.loads(p.read_bytes()) for p in sorted(capture_dir.glob("exchange-*.pkl"))]
    sums = {}
    for p in capture_dir.glob("secure-sum-r*.pkl"):
        got = pickle.loads(p.read_bytes())
        sums[got["round"]] = got
    return exchanges, sums
