"""What a SecAgg+ round costs (issue 37): fedsim's secure sum beside the same round without secure aggregation and
beside Flower's legacy SecAgg+ workflow, on one transport, one machine, one table.

Per configuration (``--clients`` x ``--params`` x ``--dropouts``), one round of each of:

* **fedsim SecAgg+**: :func:`fedsim.secagg.protocol.secure_sum` (setup, share-keys, the masked input on the round's
  train message, unmask) with a ClientApp that does what fedsim's (:mod:`fedsim.apps.client_app`) train and
  ``fedsim_secagg`` handlers do with an encoded update: :meth:`fedsim.round.NoiseSource.encode` (``ddgauss``, as
  :meth:`fedsim.training.trainer.ClientTrainer._add_one` calls it for a plan with an encoding), then
  :func:`~fedsim.secagg.protocol.mask_input` / :func:`~fedsim.secagg.protocol.handle_query`; the server ends with the
  survivors' sum modulo ``2^bits`` in a :class:`fedsim.round.PartialSum` (``add_secure_sum``, as
  :class:`fedsim.flower.grid_engine.GridEngine` does).
* **no SecAgg**: the same train message and the same encoding, sent back unmasked (``fedsim.encoded``, int64), read
  and summed as the strategy does (:func:`fedsim.flower.protocol.reply_encoded`, ``PartialSum.add_encoded``).
* **Flower legacy SecAgg+**: ``flwr.server.workflow.SecAggPlusWorkflow`` driven directly (its four stages through
  ``__call__``, a :class:`flwr.server.compat.LegacyContext` holding the model and a client manager with one
  ``GridClientProxy`` per node; no ``DefaultWorkflow``) against ``ClientApp(client_fn, mods=[secaggplus_mod])``
  whose ``NumPyClient.fit`` returns the update.

The update: training is left out, so that the table measures the protocol. Each client's "update" is a fixed random
vector of ``d`` float32 values of L2 norm 1 (drawn once, before any timing). The train messages carry a float32
global model of ``d`` values in all three (what a round sends down).

Comparable settings: the same neighbour count ``k`` (``--neighbours``; fedsim's ``privacy.secagg.neighbours``, Flower's
``num_shares = k + 1``: its share holders include the client itself) and the same threshold ``t``
(``SecureAggregation.shares_needed``, passed to Flower as an integer ``reconstruction_threshold``). What differs, on
purpose, because each side keeps its own quantisation:

* fedsim encodes with ``ddgauss`` at ``--bits`` (default 16): clip, randomized Hadamard rotation (the vector is
  padded to a power of two: 16,384 / 131,072 / 1,048,576 values for 10k / 100k / 1M), scaling, conditional
  stochastic rounding, the client's discrete Gaussian noise share, modulo ``2^bits``; the masked input travels as
  uint16 (uint32 above 16 bits), the unmasked encoding as int64 (fedsim's wire format for it);
* Flower quantises ``d`` values stochastically to ``2^22`` levels on ``[-1, 1]`` (``clipping_range = 1``: an update of
  norm 1 has every coordinate in it; ``max_weight = 1`` with ``num_examples = 1``, so its weighting does not scale the
  update down before quantising), masks modulo ``2^32`` and sends int64 ``.npy`` bytes; its keys are EC P-384, its
  share encryption Fernet, its masks NumPy's ``RandomState`` (see :mod:`fedsim.secagg.crypto` on why fedsim does not
  reuse them). Its ``aggregate_fit`` is a strategy's: here one that takes the unmasked sum the workflow hands it
  (FedAvg would re-average ``n`` copies of that same sum), so both sides stop at the aggregate.

Transport: 100 real SuperNodes (each with a ClientApp process per message) do not fit this benchmark's 2 cores, so
every protocol runs over one in-process loopback Grid (:class:`WireGrid`, as ``tests/apps/loopback.py``) that
serialises every message to Flower's protobuf (``flwr.common.serde.message_to_proto``, ``SerializeToString``) and
back on both sides: bytes are counted on that wire and the serialisation is paid as a network would make it paid.
Flower 1.42's SuperLink and SuperNodes move a message as content-addressed objects (``Message.deflate``, arrays in
chunks); the check at the start prints both sizes for one message of each kind. Message ids are random (Flower hashes
the content for its object ids: not paid here). No network latency, no SuperLink, no timeouts: a dropped client is
one whose message is never delivered, and the server goes on at once where a deployment waits for its timeout.

Dropouts: ``round(dropout * n)`` clients, drawn at random per repeat (the same ones for the three protocols), drop
after sharing their keys: they never receive their masked-input message (fedsim: the train message; Flower: stage 2,
collect masked vectors; no SecAgg: the train message).

What is timed, per round: wall time of the server's call (the clients run inside it, one after the other, on the
same thread: the wall time is the server's plus every client's); the server's CPU time (``time.process_time`` of
that call less the clients' share, which the transport measures the same way around each delivery: deserialising
the message, the ClientApp, serialising its reply); the clients' CPU time per client. Process time, not the
thread's: Flower's Shamir sharing runs in a thread pool (on the client when sharing, on the server when
reconstructing), whose work the caller waits for; nothing else runs meanwhile (BLAS is limited to one thread, as
the trainer encodes), so each interval's process time is its own. On 2 cores that pool can make a stage's wall
time shorter than its CPU time; a wall time above 1.2 x the round's process time is starred in the table (another
process held the cores meanwhile). The median over ``--repeats`` repeats (``--big-repeats`` for
configurations of at least ``--big`` client-parameters, e.g. 100 x 1M: each row says how many).

Before any timing, one small round of each protocol with dropouts checks the results: fedsim's secure sum must equal
the plain modular sum of the survivors' encodings (and the unmasked round's sum); Flower's must be within its
quantisation of the survivors' mean. Every timed round is checked the same way (fedsim's by assertion: a broken
protocol cannot be timed), outside its timing.

Run it alone (the load average is printed at the start and the end): other CPU-heavy processes on 2 cores distort
every timing.

    python benchmarks/secagg.py                                   # 10/50/100 clients x 10k/100k/1M x 0%/10%
    python benchmarks/secagg.py --quick                           # 10 clients x 10k parameters (a smoke run)
    python benchmarks/secagg.py --clients 50 --params 100000 --dropouts 0.1 --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-bench-")

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedsim.flower import protocol as wire
from fedsim.privacy import PrivacySettings
from fedsim.privacy.settings import SecureAggregation
from fedsim.round import PartialSum
from fedsim.secagg import protocol as secagg
from fedsim.training.trainer import ClientPlan, blas_threads

CLIP = 1.0
Z = 1.0
ROUND = 1
#: Flower's quantisation: its default levels and modulus; the range every coordinate of a norm-1 update lies in
LEGACY_LEVELS = 1 << 22
LEGACY_MODULUS = 1 << 32
LEGACY_RANGE = 1.0


def load() -> float:
    return os.getloadavg()[0]


# ==================================================================================================== the transport
class WireGrid(Grid):
    """An in-process Grid whose every message and reply crosses a protobuf wire, byte for byte.

    ``push_messages`` serialises each message as the server would (``message_to_proto``), then, as the node: parses
    it, runs the node's ClientApp with the node's :class:`~flwr.app.Context` and serialises the reply; the server
    parses the reply when it pulls it. ``down``/``up``: bytes each node received and sent; ``client_cpu``: the
    process time spent on the nodes' side (parsing, the ClientApp, serialising the reply), which the caller subtracts from
    the server's. A node in ``dropped`` never receives a message for which ``drops(message)`` holds (it dropped
    out): the server still serialises it, and gets no reply. ``samples``: with ``keep_samples``, the first message and
    reply of each kind (by ``kind(message)``), for the wire-size check.
    """

    def __init__(
        self,
        client_app: ClientApp,
        contexts: dict[int, Context],
        *,
        dropped: Iterable[int] = (),
        drops: Callable[[Message], bool] = lambda _m: False,
        kind: Callable[[Message], str] = lambda m: m.metadata.message_type,
        keep_samples: bool = False,
    ) -> None:
        self.client_app = client_app
        self.contexts = contexts
        self.dropped = set(dropped)
        self.drops = drops
        self.kind = kind
        self.keep_samples = keep_samples
        self.samples: dict[str, tuple[Message, Message]] = {}
        self.down = dict.fromkeys(contexts, 0)
        self.up = dict.fromkeys(contexts, 0)
        self.client_cpu = 0.0
        self._pending: dict[str, bytes] = {}

    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        raise NotImplementedError("WireGrid has no Run: the benchmark drives the stages itself")

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            data = message_to_proto(msg).SerializeToString()
            node = int(msg.metadata.dst_node_id)
            ids.append(mid)
            if node in self.dropped and self.drops(msg):
                continue  # the node dropped out: the message is never pulled
            start = time.process_time()
            received = message_from_proto(ProtoMessage.FromString(data))
            reply = self.client_app(received, self.contexts[node])
            reply.metadata.__dict__["_src_node_id"] = node
            out = message_to_proto(reply).SerializeToString()
            self.client_cpu += time.process_time() - start
            self.down[node] += len(data)
            self.up[node] += len(out)
            self._pending[mid] = out
            if self.keep_samples:
                self.samples.setdefault(self.kind(msg), (msg, reply))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [
            message_from_proto(ProtoMessage.FromString(self._pending.pop(m)))
            for m in message_ids
            if m in self._pending
        ]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def contexts_for(nodes: list[int]) -> dict[int, Context]:
    """One fresh Context per node, as a SuperNode holds it for a run (the protocols keep their secrets there)."""
    return {
        node: Context(
            run_id=1,
            node_id=node,
            node_config={"partition-id": i, "num-partitions": len(nodes)},
            state=RecordDict(),
            run_config={},
        )
        for i, node in enumerate(nodes)
    }


def deflated_bytes(msg: Message) -> int:
    """What Flower 1.42 moves for ``msg``: its content-addressed objects (``Message.deflate`` and its descendants')."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


# ==================================================================================================== one configuration
@dataclass
class Setup:
    """What every protocol's round of ``n`` clients and ``d`` parameters shares, built once, outside every timing."""

    n: int
    d: int
    bits: int
    secagg: SecureAggregation
    nodes: list[int]
    updates: dict[int, np.ndarray]
    model: np.ndarray
    noise: Any
    plan: ClientPlan

    @classmethod
    def build(cls, n: int, d: int, bits: int, neighbours: int, threshold: float, seed: int) -> Setup:
        settings = PrivacySettings(
            sampling="all",
            clip=CLIP,
            noise_multiplier=Z,
            noise_placement="distributed",
            accountant="rdp",
            mechanism="ddgauss",
            mechanism_options={"bits": bits},
            secagg=SecureAggregation(neighbours=neighbours, threshold=threshold),
        )
        release = settings.mechanism_at(n)
        noise = settings.noise_source(seed)  # seeded: the encodings are the same in the three rounds
        noise.set_model_size(d)
        encoding = {**noise.encoding(release, d), **noise.public_randomness(ROUND)}
        nodes = list(range(1, n + 1))
        rng = np.random.default_rng([seed, n, d])
        updates = {}
        for node in nodes:
            u = rng.standard_normal(d, dtype=np.float32)
            updates[node] = u / np.float32(np.linalg.norm(u))
        model = rng.standard_normal(d, dtype=np.float32)
        plan = ClientPlan(ROUND, np.asarray(nodes), CLIP, noise=noise, encoding=encoding)
        assert settings.secagg is not None
        return cls(n, d, bits, settings.secagg, nodes, updates, model, noise, plan)

    @property
    def k(self) -> int:
        return self.secagg.degree(self.n)

    @property
    def t(self) -> int:
        return self.secagg.shares_needed(self.n)


@dataclass
class Outcome:
    """One protocol's round: wall and server CPU seconds, client CPU seconds per client, bytes per surviving client
    (received + sent), and ``failed``: why there is no result (None: there is one, and it was checked)."""

    wall: float = float("nan")
    cpu: float = float("nan")
    server_cpu: float = float("nan")
    client_cpu: float = float("nan")
    bytes: float = float("nan")
    failed: str | None = None
    samples: dict[str, tuple[Message, Message]] = field(default_factory=dict)


def timed(grid: WireGrid, setup: Setup, dropped: set[int], body: Callable[[], Any]) -> tuple[Outcome, Any]:
    """Run ``body`` (the server's side of one round over ``grid``) and measure it."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = body()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    survivors = [node for node in setup.nodes if node not in dropped]
    sizes = [grid.down[node] + grid.up[node] for node in survivors]
    outcome = Outcome(
        wall=wall,
        cpu=cpu,
        server_cpu=cpu - grid.client_cpu,
        client_cpu=grid.client_cpu / setup.n,
        bytes=float(np.mean(sizes)),
        samples=grid.samples,
    )
    return outcome, result


# ---------------------------------------------------------------------------------------------------- fedsim
def fedsim_client_app(setup: Setup, encodings: dict[int, np.ndarray]) -> ClientApp:
    """A ClientApp that does what fedsim's does with an encoded update, without the training and the node policy's
    checks: the train message's encoding of the client's update (masked when the message has a SecAgg+ session),
    and the ``fedsim_secagg`` stages. ``encodings`` records each client's encoding for the check (a reference)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        config = next(iter(msg.content.config_records.values()))
        encoding = wire.encoding_of(config)
        assert encoding is not None
        client, server_round = int(context.node_id), int(config[wire.CFG_ROUND])
        secure = secagg.SESSION in config
        if (
            secure
        ):  # as fedsim's ClientApp: a message it would not mask is refused before the update is touched
            secagg.check_train(config, context, server_round)
        encoded, _ = setup.noise.encode(
            server_round,
            client,
            setup.updates[client].astype(np.float64),
            float(config[wire.CFG_CLIP]),
            encoding,
        )
        encodings[client] = encoded
        if secure:
            masked = secagg.mask_input(config, context, client, encoded, int(encoding["bits"]), server_round)
            return Message(RecordDict({"arrays": secagg.masked_reply(masked)}), reply_to=msg)
        return Message(RecordDict({"arrays": wire.encoded_reply(encoded)}), reply_to=msg)

    @app.query(secagg.QUERY)
    def stage(msg: Message, context: Context) -> Message:
        config = next(iter(msg.content.config_records.values()))
        return Message(
            RecordDict({"secagg": secagg.handle_query(config, context, int(context.node_id))}), reply_to=msg
        )

    return app


def model_arrays(setup: Setup) -> ArrayRecord:
    return ArrayRecord(array_dict={"model": Array(setup.model)})


def plain_sum(setup: Setup, encodings: dict[int, np.ndarray], dropped: set[int]) -> np.ndarray:
    """The survivors' encodings summed modulo ``2^bits``: what a secure sum must give."""
    total = np.zeros(int(setup.plan.encoding["dim"]), dtype=np.uint64)
    for node in setup.nodes:
        if node not in dropped:
            total += encodings[node].astype(np.uint64)
    return total & np.uint64((1 << setup.bits) - 1)


def fedsim_grid(
    setup: Setup, encodings: dict[int, np.ndarray], dropped: set[int], keep_samples: bool, kind: Any
) -> WireGrid:
    """The wire to fedsim's clients (who record their encodings in ``encodings``); the ``dropped`` ones never get
    their train message (the masked input, or the unmasked round's only message)."""
    return WireGrid(
        fedsim_client_app(setup, encodings),
        contexts_for(setup.nodes),
        dropped=dropped,
        drops=lambda m: m.metadata.message_type == MessageType.TRAIN,
        kind=kind,
        keep_samples=keep_samples,
    )


def run_fedsim(
    setup: Setup, dropped: set[int], seed: int, keep_samples: bool = False
) -> tuple[Outcome, np.ndarray | None]:
    encodings: dict[int, np.ndarray] = {}
    grid = fedsim_grid(
        setup,
        encodings,
        dropped,
        keep_samples,
        kind=lambda m: str(m.content.config_records["config"].get(secagg.STAGE, "masked-input")),
    )
    arrays = model_arrays(setup)

    def server() -> Any:
        config = wire.train_config(setup.plan, size=setup.d)  # as GridEngine builds it
        result = secagg.secure_sum(
            grid, setup.plan, arrays, config, setup.secagg, np.random.default_rng(seed)
        )
        partial = PartialSum(setup.d)  # where GridEngine keeps the round's sum
        if result.total is not None:
            partial.add_secure_sum(result.total, len(result.survivors))
        return result

    outcome, result = timed(grid, setup, dropped, server)
    if result.aborted is not None:
        outcome.failed = f"aborted: {result.aborted}"
        return outcome, None
    assert sorted(result.dropped) == sorted(dropped), (result.dropped, dropped)
    assert np.array_equal(result.total, plain_sum(setup, encodings, dropped)), (
        "fedsim's secure sum differs from the plain modular sum of the survivors' encodings"
    )
    return outcome, result.total


def run_plain(setup: Setup, dropped: set[int], keep_samples: bool = False) -> tuple[Outcome, np.ndarray]:
    encodings: dict[int, np.ndarray] = {}
    grid = fedsim_grid(setup, encodings, dropped, keep_samples, kind=lambda _m: "train (unmasked)")
    arrays = model_arrays(setup)
    encoding = setup.plan.encoding

    def server() -> PartialSum:
        partial = PartialSum(setup.d)
        for reply in grid.send_and_receive(wire.train_messages(setup.plan, arrays)):
            encoded = wire.reply_encoded(reply, encoding)
            assert encoded is not None, "an unmasked reply was refused"
            partial.add_encoded(encoded, float("nan"))
        return partial

    outcome, partial = timed(grid, setup, dropped, server)
    total = np.mod(partial.extras["encoded"], 1 << setup.bits).astype(np.uint64)
    assert partial.count == setup.n - len(dropped)
    assert np.array_equal(total, plain_sum(setup, encodings, dropped)), (
        "the unmasked sum is not the plain sum"
    )
    return outcome, total


# ---------------------------------------------------------------------------------------------------- Flower legacy
def legacy_client_app(setup: Setup) -> ClientApp:
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod

    class Fixed(NumPyClient):
        def __init__(self, node: int) -> None:
            self.node = node

        def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
            return [setup.updates[self.node]], 1, {}

    return ClientApp(client_fn=lambda context: Fixed(int(context.node_id)).to_client(), mods=[secaggplus_mod])


def run_legacy(setup: Setup, dropped: set[int], seed: int, keep_samples: bool = False) -> Outcome:
    from flwr.common import ConfigRecord, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.compat.common.recorddict_compat import parameters_to_arrayrecord
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    class TakeSum(FedAvg):
        """FedAvg's sampling; ``aggregate_fit`` keeps the unmasked aggregate the workflow put in every result."""

        aggregate: np.ndarray | None = None

        def aggregate_fit(self, server_round, results, failures):
            if not results:
                return None, {}
            parameters = results[0][1].parameters
            self.aggregate = parameters_to_ndarrays(parameters)[0]
            return parameters, {}

    def stage(m: Message) -> str:
        return str(m.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])

    grid = WireGrid(
        legacy_client_app(setup),
        contexts_for(setup.nodes),
        dropped=dropped,
        drops=lambda m: stage(m) == Stage.COLLECT_MASKED_VECTORS,
        kind=stage,
        keep_samples=keep_samples,
    )
    manager = SimpleClientManager()
    for node in setup.nodes:
        manager.register(GridClientProxy(node_id=node, grid=grid, run_id=1))
    strategy = TakeSum(
        fraction_fit=1.0, min_fit_clients=setup.n, min_available_clients=setup.n, fraction_evaluate=0.0
    )
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(
        base, config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=manager
    )
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: ROUND})
    context.state.array_records[MAIN_PARAMS_RECORD] = parameters_to_arrayrecord(
        ndarrays_to_parameters([setup.model]), keep_input=True
    )
    workflow = SecAggPlusWorkflow(
        num_shares=setup.k + 1,
        reconstruction_threshold=setup.t,
        max_weight=1.0,
        clipping_range=LEGACY_RANGE,
        quantization_range=LEGACY_LEVELS,
        modulus_range=LEGACY_MODULUS,
    )
    random.seed(seed)  # the workflow shuffles the nodes into its ring with Python's generator
    try:
        outcome, _ = timed(grid, setup, dropped, lambda: workflow(grid, context))
    except Exception as exc:  # a size the legacy workflow cannot run: the reason goes in the table's cell
        return Outcome(failed=f"failed: {type(exc).__name__}: {str(exc)[:80]}")
    if strategy.aggregate is None:
        outcome.failed = "halted (too few shares or nodes)"
        return outcome
    survivors = [setup.updates[node] for node in setup.nodes if node not in dropped]
    error = float(np.max(np.abs(strategy.aggregate - np.mean(survivors, axis=0, dtype=np.float64))))
    step = 2 * LEGACY_RANGE / LEGACY_LEVELS
    if (
        not error <= 2 * step
    ):  # stochastic rounding errs by less than a step per client: the mean, by less too
        outcome.failed = f"wrong aggregate (max error {error:.2e}, quantisation step {step:.2e})"
    return outcome


# ==================================================================================================== the table
@dataclass
class Row:
    n: int
    d: int
    dropout: float
    repeats: int
    fedsim: Outcome
    plain: Outcome
    legacy: Outcome


def median(outcomes: list[Outcome]) -> Outcome:
    """Each measure's median over the repeats; failed if any repeat failed (the first reason)."""
    failed = next((o.failed for o in outcomes if o.failed is not None), None)
    if failed is not None:
        return Outcome(failed=failed)
    return Outcome(
        **{
            name: float(np.median([getattr(o, name) for o in outcomes]))
            for name in ("wall", "cpu", "server_cpu", "client_cpu", "bytes")
        }
    )


def dropped_nodes(setup: Setup, dropout: float, seed: int) -> set[int]:
    rng = np.random.default_rng([seed, setup.n, setup.d, 7])
    count = round(dropout * setup.n)
    return {int(x) for x in rng.choice(setup.nodes, size=count, replace=False)}


def measure(setup: Setup, dropout: float, repeats: int, seed: int) -> Row:
    fedsim, plain, legacy = [], [], []
    for rep in range(repeats):
        rep_seed = seed * 1000 + rep
        dropped = dropped_nodes(setup, dropout, rep_seed)
        secure, secure_total = run_fedsim(setup, dropped, rep_seed)
        unmasked, unmasked_total = run_plain(setup, dropped)
        if secure_total is not None:  # the same encodings (the noise source is seeded): the same sum
            assert np.array_equal(secure_total, unmasked_total), "the secure and the unmasked sums differ"
        fedsim.append(secure)
        plain.append(unmasked)
        legacy.append(run_legacy(setup, dropped, rep_seed))
    return Row(setup.n, setup.d, dropout, repeats, median(fedsim), median(plain), median(legacy))


def check(args: argparse.Namespace) -> None:
    """One small round of each protocol with a dropout, untimed: the sums are right, and the wire sizes of one
    message of each kind next to Flower 1.42's deflated objects (its SuperLink/SuperNode transport)."""
    n = 10
    setup = Setup.build(n, 10_000, args.bits, args.neighbours, args.threshold, args.seed)
    dropped = dropped_nodes(setup, 0.1, args.seed)
    fedsim, secure_total = run_fedsim(setup, dropped, args.seed, keep_samples=True)
    plain, unmasked_total = run_plain(setup, dropped, keep_samples=True)
    legacy = run_legacy(setup, dropped, args.seed, keep_samples=True)
    assert secure_total is None or np.array_equal(secure_total, unmasked_total)
    for name, outcome in (("fedsim", fedsim), ("no SecAgg", plain), ("Flower legacy", legacy)):
        if outcome.failed is not None:
            raise SystemExit(
                f"check: {name}'s round of {n} clients x 10,000 with 1 dropout: {outcome.failed}"
            )
    print(
        f"\ncheck ({n} clients x 10,000 parameters, {len(dropped)} dropped after sharing keys, untimed): fedsim's "
        "secure sum equals the plain sum of the survivors' encodings modulo 2^bits and the unmasked round's sum; "
        "Flower's aggregate is the survivors' mean within its quantisation step. Wire bytes of one message and its "
        "reply, as serialised here (one protobuf) and as Flower 1.42 moves them (deflated objects):\n"
    )
    print("| protocol | message | sent: protobuf / deflated | reply: protobuf / deflated |")
    print("|---|---|---|---|")
    for name, outcome in (("fedsim", fedsim), ("no SecAgg", plain), ("Flower legacy", legacy)):
        for kind, (msg, reply) in outcome.samples.items():
            sent, back = (len(message_to_proto(m).SerializeToString()) for m in (msg, reply))
            print(
                f"| {name} | {kind} | {sent:,} / {deflated_bytes(msg):,} | {back:,} / {deflated_bytes(reply):,} |"
            )


#: a wall time above this multiple of the round's process time: the process waited for a core
CROWDED = 1.2


def fmt_s(outcome: Outcome, value: float) -> str:
    return outcome.failed if outcome.failed is not None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def fmt_wall(outcome: Outcome) -> str:
    """The wall time, starred where the process had the CPU for less than ``1 / CROWDED`` of it: every protocol
    here runs on one thread (Flower's Shamir pool aside, which can only make the wall time shorter), so a wall time
    well above the process time means another process held the cores: the CPU columns are still the round's own."""
    crowded = outcome.failed is None and outcome.wall > CROWDED * outcome.cpu
    return fmt_s(outcome, outcome.wall) + ("*" if crowded else "")


def fmt_ratio(a: Outcome, b: Outcome) -> str:
    return "-" if a.failed is not None or b.failed is not None else f"{a.wall / b.wall:.2f}"


def fmt_kb(outcome: Outcome) -> str:
    return "-" if outcome.failed is not None else f"{outcome.bytes / 1e3:,.0f}"


def fmt_ms(outcome: Outcome) -> str:
    return "-" if outcome.failed is not None else f"{1e3 * outcome.client_cpu:,.0f}"


def print_table(rows: list[Row]) -> None:
    print(
        "\n| clients | params | dropout | fedsim SecAgg+ wall s | no-SecAgg wall s | ratio | Flower legacy wall s | "
        "fedsim/legacy | kB/client fedsim | kB/client no-SecAgg | kB/client legacy | server CPU s fedsim | "
        "server CPU s legacy | client CPU ms/client fedsim / no-SecAgg / legacy | repeats |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, p, g = r.fedsim, r.plain, r.legacy
        print(
            f"| {r.n} | {r.d:,} | {r.dropout:.0%} | {fmt_wall(f)} | {fmt_wall(p)} | {fmt_ratio(f, p)} | "
            f"{fmt_wall(g)} | {fmt_ratio(f, g)} | {fmt_kb(f)} | {fmt_kb(p)} | {fmt_kb(g)} | "
            f"{fmt_s(f, f.server_cpu)} | {fmt_s(g, g.server_cpu)} | {fmt_ms(f)} / {fmt_ms(p)} / {fmt_ms(g)} | "
            f"{r.repeats} |",
            flush=True,
        )
    if any(fmt_wall(o).endswith("*") for r in rows for o in (r.fedsim, r.plain, r.legacy)):
        print(
            f"\n* wall time above {CROWDED} x the round's process time: another process held the cores during that "
            "round (its ratios are off too); the CPU columns are the round's own",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100], help="clients a round")
    p.add_argument("--params", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="model sizes")
    p.add_argument(
        "--dropouts", type=float, nargs="+", default=[0.0, 0.1], help="fractions that drop after sharing keys"
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds a configuration, the median reported (3)")
    p.add_argument(
        "--big", type=float, default=5e7, help="clients x params from which --big-repeats applies (5e7)"
    )
    p.add_argument("--big-repeats", type=int, default=1, help="repeats of the big configurations (1)")
    p.add_argument(
        "--neighbours",
        type=int,
        default=20,
        help="k, each client's neighbours (even; at least clients - 1: every other client). Default 20: with 10%% "
        "dropouts and threshold 0.6 a round of 100 practically never aborts (8: about 1 in 5 would)",
    )
    p.add_argument("--threshold", type=float, default=0.6, help="t as a fraction of the k + 1 share holders")
    p.add_argument("--bits", type=int, default=16, help="fedsim's modulus 2^bits (ddgauss; default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="10 clients x 10k parameters only (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.params = [10], [10_000]
    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        setattr(
            TaskIdentity, attr, value
        )  # the Message API's process identity, as a ServerApp process has it
    logging.getLogger("flwr").setLevel(logging.WARNING)  # the legacy workflow logs every stage at INFO
    started = time.perf_counter()
    print(
        f"SecAgg+ round cost: {os.cpu_count()} CPUs, load average {load():.2f} at start; transport: in-process "
        "loopback Grid, every message serialised to Flower's protobuf and back (no network, no SuperLink, no "
        "separate processes)",
        flush=True,
    )
    with blas_threads(1):
        check(args)
        rows = []
        for n in args.clients:
            for d in args.params:
                setup = Setup.build(n, d, args.bits, args.neighbours, args.threshold, args.seed)
                repeats = args.big_repeats if n * d >= args.big else args.repeats
                print(
                    f"\n{n} clients x {d:,} parameters: k = {setup.k}, t = {setup.t}, fedsim dim "
                    f"{setup.plan.encoding['dim']:,} at {setup.bits} bits; {repeats} repeat(s); load {load():.2f}",
                    flush=True,
                )
                for dropout in args.dropouts:
                    start = time.perf_counter()
                    rows.append(measure(setup, dropout, repeats, args.seed))
                    print(f"  dropout {dropout:.0%}: {time.perf_counter() - start:.0f} s", flush=True)
                del setup
    print_table(rows)
    print(
        f"\nwall: the server's call with every client run inside it, one after another (clients in parallel would "
        "take about server + slowest client per stage); server CPU: that call's process time less the clients'; "
        f"kB/client: received + sent by a client that did not drop. Total {time.perf_counter() - started:.0f} s; "
        f"load average at the end: {load():.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
