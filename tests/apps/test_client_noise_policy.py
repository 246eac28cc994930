"""Distributed noise is enforced by the client, not taken from the server's word.

A hostile or buggy server writes the train message: the noise-share std, the clip, whether to noise at all. A node
configured for distributed noise (by the run config's scenario, or by its own node config, which only whoever runs
the SuperNode sets) clips and noises with at least its own floor and refuses a message asking for less; it never
sends an un-noised update, nor (unless allowed) its exact evaluation metrics.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Message, MessageType, RecordDict
from loopback import LoopbackGrid  # tests/apps/loopback.py

from fedsim.apps import client_app as client_module
from fedsim.apps.run_config import load_for_run, model_record
from fedsim.flower import protocol
from fedsim.flower.grid import ClientIdGrid
from fedsim.round import flatten
from fedsim.strategies.dpfedavg import DPFedAvg
from fedsim.training.trainer import initial_weights

NODES = 4
BASE = (
    "seed=0 rounds=2 data.num_clients=5 data.heldout_fraction=0.2 client.local_epochs=1 privacy.sampling=all "
    "privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 engine.name=local"
)
DISTRIBUTED = f"{BASE} privacy.noise_placement=distributed"


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


def _node(overrides: str, **node_config) -> tuple[LoopbackGrid, int, np.ndarray]:
    cfg = {"scenario": "quickstart", "overrides": overrides}
    grid = LoopbackGrid(client_module.app, NODES, cfg)
    node = grid.node_ids[0]
    grid.contexts[node].node_config.update(node_config)
    _, data, trainer = load_for_run(cfg)
    w0 = initial_weights(trainer.settings, data.input_dim, data.num_classes)
    return grid, node, w0


def _send(grid: LoopbackGrid, node: int, w0: np.ndarray, *, clip=1.0, share=0.0, count=0.0, kind="train"):
    _, _, trainer = load_for_run(grid.contexts[node].run_config)
    arrays = model_record(trainer, w0)
    if kind == "train":
        plan = SimpleNamespace(
            round=1, clip=clip, noise_share_std=share, count_share_std=count, loss_bound=None, cohort=[node]
        )
        msg = protocol.train_messages(plan, arrays)[0]
    else:
        msg = Message(
            RecordDict({"arrays": arrays, "config": protocol.train_config(SimpleNamespace(
                round=1, clip=clip, noise_share_std=0.0, count_share_std=0.0, loss_bound=None
            ))}),
            dst_node_id=node,
            message_type=MessageType.EVALUATE,
        )  # fmt: skip
    try:
        grid.push_messages([msg])
    except ValueError as exc:  # what the SuperNode's ClientApp runner turns into an error reply
        return exc
    return grid.replies[-1]


def _refused(result, match: str = "this node adds its own noise") -> bool:
    return isinstance(result, ValueError) and match in str(result)


def _update(reply: Message, w0: np.ndarray) -> np.ndarray:
    return flatten(next(iter(reply.content.array_records.values())).to_numpy_ndarrays()) - w0


def test_a_distributed_node_refuses_a_tiny_share_a_huge_clip_and_a_message_without_a_share():
    grid, node, w0 = _node(DISTRIBUTED)
    floor = 1.0 * 1.0 / math.sqrt(4)  # z * clip / sqrt(expected cohort): sampling all over 4 training clients
    # what today's ClientApp returned as its raw update: a share of 1e-12 with clip 1e6, and no share at all
    for kwargs in (
        {"clip": 1e6, "share": 1e-12},
        {"clip": 1.0, "share": 0.0},
        {"clip": 1.0, "share": 0.9 * floor},
    ):
        sent = len(grid.replies)
        assert _refused(_send(grid, node, w0, **kwargs)), kwargs
        assert len(grid.replies) == sent  # no reply: nothing of the update left the node
    # the planned share: accepted, and the update carries noise of that std (the raw update's norm is about 0.1)
    reply = _send(grid, node, w0, clip=1.0, share=floor)
    assert 0.8 * floor < _update(reply, w0).std() < 1.2 * floor
    # more noise, or a smaller clip, than the floor: at least as private, so the message's values are used
    assert not _send(grid, node, w0, clip=0.5, share=floor).has_error()


def test_the_node_config_sets_the_floor_whatever_the_run_config_says():
    # the run config asks for central noise (the raw update): the node's own config says distributed, z >= 2
    grid, node, w0 = _node(BASE, **{"noise-multiplier": 2.0, "noise-shares": 4})
    assert _refused(_send(grid, node, w0, clip=1.0, share=0.0), "from its node config")
    assert _refused(_send(grid, node, w0, clip=1.0, share=0.5))  # z = 1 over 4 shares: below z = 2
    reply = _send(grid, node, w0, clip=1.0, share=1.0)  # z = 2 over 4 shares
    assert 0.8 < _update(reply, w0).std() < 1.2
    # a node without the key keeps the run config's choice (central: the raw update, clipped by the server)
    plain, other, _ = _node(BASE)
    assert _update(_send(plain, other, w0, clip=1.0), w0).std() < 0.05


def test_a_bad_node_config_value_is_a_clear_error():
    grid, node, w0 = _node(DISTRIBUTED, **{"noise-multiplier": "lots"})
    result = _send(grid, node, w0, clip=1.0, share=1.0)
    assert _refused(result, "node config noise-multiplier='lots': must be a positive number")


def test_a_distributed_node_answers_evaluate_only_when_allowed():
    grid, node, w0 = _node(DISTRIBUTED)
    assert _refused(_send(grid, node, w0, kind="evaluate"), "does not answer evaluate messages")
    grid, node, w0 = _node(DISTRIBUTED, **{"allow-evaluate": "true"})
    reply = _send(grid, node, w0, kind="evaluate")
    assert next(iter(reply.content.metric_records.values()))["num-examples"] > 0


def test_dpfedavg_start_refuses_distributed_noise_without_secure_aggregation_unless_opted_in():
    cfg = {"scenario": "quickstart", "overrides": DISTRIBUTED}
    _, data, trainer = load_for_run(cfg)
    initial = model_record(trainer, initial_weights(trainer.settings, data.input_dim, data.num_classes))
    grid = LoopbackGrid(client_module.app, NODES, cfg)
    strategy = DPFedAvg(sampling="all", noise_placement="distributed", seed=None)
    with pytest.raises(ValueError, match="refused with Flower nodes without secure aggregation"):
        strategy.start(grid=ClientIdGrid(grid, min_nodes=NODES), initial_arrays=initial, num_rounds=1)
    assert not grid.sent  # refused before any message
    strategy = DPFedAvg(
        sampling="all", noise_placement="distributed", seed=None, distributed_without_secagg=True
    )
    strategy.start(grid=ClientIdGrid(grid, min_nodes=NODES), initial_arrays=initial, num_rounds=1)
    train = [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN]
    assert len(train) == NODES and not any(r.has_error() for r in train)


def test_the_share_std_reveals_only_public_parameters_under_poisson_sampling():
    """The share is split over the expected cohort, so it is the same in every round whatever the realised cohort
    (a share from the realised cohort told each sampled client how many were sampled); a cohort below the expected
    one gets the missing shares from the server, so the total noise is at least the accounted one."""
    strategy = DPFedAvg(sampling="poisson", sampling_rate=0.1, noise_placement="distributed", seed=0)
    plans = [strategy.begin_round(t, range(200)) for t in range(1, 30)]
    assert len({int(p.cohort.size) for p in plans}) > 3  # the realised cohorts differ
    assert {p.noise_share_std for p in plans} == {1.0 / math.sqrt(200 * 0.1)}
    from fedsim.round import NoiseSource, PartialSum, private_mean

    small = PartialSum(50_000)
    rng = np.random.default_rng(1)
    for _ in range(15):  # 15 shares arrived, 20 expected: the server adds 5 shares' worth
        small.add(rng.normal(0, plans[0].noise_share_std, small.dim), 1.0, already_clipped_and_noised=True)
    mean, server_std = private_mean(small, plans[0].mechanism, NoiseSource(0), 1)
    assert server_std == pytest.approx(math.sqrt(5 / 20))
    assert np.std(mean * 20) == pytest.approx(1.0, rel=0.02)  # z * clip in total


def test_the_count_share_has_a_floor_too():
    overrides = f"{DISTRIBUTED} privacy.adaptive_clip=true privacy.count_noise_multiplier=2.0"
    grid, node, w0 = _node(overrides)
    assert _refused(_send(grid, node, w0, clip=1.0, share=0.5, count=0.5), "unclipped bit")  # floor 2/sqrt(4)
    reply = _send(grid, node, w0, clip=1.0, share=0.5, count=1.0)
    assert not reply.has_error() and "fedsim.unclipped-noised" in next(
        iter(reply.content.metric_records.values())
    )


DDGAUSS = f"{DISTRIBUTED} privacy.mechanism.name=ddgauss privacy.accountant=rdp"


def _ddgauss_message(grid: LoopbackGrid, node: int, w0: np.ndarray, **encoding_changes) -> Message:
    """The server's train message of a ddgauss round (its strategy's plan, addressed to ``node``), with
    ``encoding_changes`` written over its public encoding (a hostile server's)."""
    import dataclasses

    from fedsim.experiment import build_experiment
    from fedsim.scenarios import load_scenario

    exp = build_experiment(load_scenario("quickstart", DDGAUSS.split()))
    plan = dataclasses.replace(exp.strategy.begin_round(1, exp.train_ids), cohort=np.array([node]))
    _, _, trainer = load_for_run(grid.contexts[node].run_config)
    msg = protocol.train_messages(plan, model_record(trainer, w0))[0]
    config = next(iter(msg.content.config_records.values()))
    for key, value in encoding_changes.items():
        if value is None:
            del config[protocol.CFG_ENCODING + key]
        else:
            config[protocol.CFG_ENCODING + key] = value
    return msg


def _push(grid: LoopbackGrid, msg: Message) -> Message | ValueError:
    try:
        grid.push_messages([msg])
    except ValueError as exc:
        return exc
    return grid.replies[-1]


def test_a_ddgauss_node_sends_only_integers_and_refuses_an_encoding_with_less_noise():
    grid, node, w0 = _node(DDGAUSS)
    good = _ddgauss_message(grid, node, w0)
    encoding = protocol.encoding_of(next(iter(good.content.config_records.values())))
    reply = _push(grid, good)
    got = protocol.reply_encoded(reply, encoding)
    # one int64 vector of the padded length, every value inside the modulus: what a secure sum adds, nothing else
    assert got is not None and got.shape == (encoding["dim"],) and got.max() < 2 ** encoding["bits"]
    assert list(next(iter(reply.content.array_records.values())).keys()) == [protocol.ENCODED]
    assert not reply.content.metric_records
    std, scale = encoding["local_std_grid"], encoding["scale"]
    per_client = std / scale  # the noise std per client, in the update's units
    for changes, match in (
        ({"local_std_grid": 0.5 * std}, "below this node's floor"),
        # the same noise per client on a grid as coarse as the noise: the rounded update would go almost un-noised
        ({"scale": 1.0 / per_client, "local_std_grid": 1.0}, "coarser than this node's"),
        ({"beta": 0.9999}, "beta 0.9999) is not this node's"),
        ({"dim": 2 * encoding["dim"]}, "is not this node's (dimension"),
        # a grid beyond float64: refused from public values, before the update is touched (no error text about it)
        ({"scale": 2.0**70, "local_std_grid": per_client * 2.0**70}, "finer than float64 holds"),
        ({"kind": "skellam"}, "asks for encoding 'skellam'"),
        ({"kind": None}, "asks for encoding None"),
        ({"rotation_seed": None}, "is incomplete"),
    ):
        sent = len(grid.replies)
        assert _refused(_push(grid, _ddgauss_message(grid, node, w0, **changes)), match), changes
        assert len(grid.replies) == sent  # nothing left the node
    # a reply outside the modulus, or of floats, is not what a secure sum would add: the server rejects it
    bad = Message(RecordDict({"arrays": protocol.encoded_reply(got + 2 ** encoding["bits"])}), reply_to=good)
    assert protocol.reply_encoded(bad, encoding) is None
