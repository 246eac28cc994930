"""SecAgg+ on the Message API (fedsim.secagg.protocol): the server learns exactly the survivors' sum modulo ``2^bits``,
nothing of any one client's encoding, aborts (and releases nothing) when the sum cannot be unmasked, and clients
refuse what the protocol does not allow.

The crypto-level properties run on a :class:`~secagg_loopback.DirectGrid` (bare clients masking random encodings);
the integration ones run the shipped ServerApp and ClientApp on a loopback Grid. Keys, seeds and the graph of a
deployed round come from the operating system's entropy, so the statistical checks draw fresh masks on every run;
their thresholds (p > 1e-4, 5 standard errors) make a false alarm rarer than one run in a thousand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from scipy import stats
from secagg_loopback import STAGES, SecAggLoopbackGrid, run_secure_sum, stage_of

from fedsim.apps import client_app as client_module
from fedsim.apps import server_app as server_module
from fedsim.apps.run_config import load_for_run, model_record
from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.flower import protocol as wire
from fedsim.labels import NON_PRIVATE
from fedsim.privacy.settings import SecureAggregation
from fedsim.report.rows import summary_stop
from fedsim.scenarios import load_scenario
from fedsim.secagg import crypto
from fedsim.secagg.crypto import SecAggError
from fedsim.secagg.protocol import (
    ACTIVE,
    CIPHERTEXTS,
    DROPPED,
    DST,
    KEY_OF,
    KEY_SHARES,
    MASKED,
    MESSAGE_TYPE,
    NODES,
    PK1,
    PK2,
    SEED_OF,
    SEED_SHARES,
    SESSION,
    SETUP,
    SHARE_KEYS,
    SRC,
    STAGE,
    THRESHOLD,
    UNMASK,
    handle_query,
    mask_input,
    masked_dtype,
)
from fedsim.training.trainer import initial_weights


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower stamps messages with the run's identity, which a SuperLink process sets; set it as one would."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


#: client ids that are neither contiguous nor in cohort order, so that an id/index mix-up shows
IDS = [5, 17, 42, 99, 123, 512, 1000]
COHORT = [512, 5, 1000, 42, 17, 123, 99]
DROPPER = 42


def _encodings(bits: int, dim: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 1 << bits, dim, dtype=np.int64) for c in IDS}


def _sum(encodings: dict[int, np.ndarray], clients: list[int], bits: int) -> np.ndarray:
    """The survivors' encodings summed modulo ``2^bits`` (uint32, as :class:`SecureSum` holds it)."""
    return (sum(encodings[c].astype(np.uint64) for c in clients) & np.uint64((1 << bits) - 1)).astype(
        np.uint32
    )


# ------------------------------------------------------------------------------------------- the sum, with dropouts

#: the stage the dropper stops answering at -> (the failures it counts as, whether its encoding is in the sum).
#: Dropping at the masked input, it is ``dropped``: its pairwise masks are removed with its neighbours' shares of its
#: key. Dropping at the unmasking, its masked input is in: its self mask is rebuilt from its neighbours' shares.
DROPOUTS = {
    None: ({}, True),
    "setup": ({"no_reply": 1}, False),
    "share-keys": ({"no_reply": 1}, False),
    "masked-input": ({}, False),
    "unmask": ({}, True),
}


@pytest.mark.parametrize(
    ("bits", "neighbours", "stage"),
    [(16, k, stage) for k in (4, 0) for stage in DROPOUTS]
    + [(32, 4, "masked-input"), (12, 4, "masked-input"), (32, 0, "unmask"), (12, 0, None)],
)
def test_secure_sum_is_exactly_the_survivors_sum(bits, neighbours, stage):
    encodings = _encodings(bits, 257, seed=bits + neighbours)
    silent = {DROPPER: stage} if stage else None
    result, grid = run_secure_sum(encodings, bits, neighbours=neighbours, silent=silent, cohort=COHORT)
    failures, included = DROPOUTS[stage]
    survivors = [c for c in IDS if included or c != DROPPER]
    assert result.aborted is None
    assert result.survivors == survivors
    assert result.dropped == ([DROPPER] if stage == "masked-input" else [])
    assert result.failures == failures
    assert result.total is not None and result.total.dtype == np.uint32
    np.testing.assert_array_equal(result.total, _sum(encodings, survivors, bits))
    # the sum was not there before unmasking: the masked inputs alone add up to something else
    masked = [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN]
    raw = sum(next(iter(r.content.array_records.values()))[MASKED].numpy().astype(np.uint64) for r in masked)
    assert np.mean((raw & np.uint64((1 << bits) - 1)) == result.total) < 0.05
    # SecAgg+ with k = 4 among 7: each client talks to its 4 neighbours only; k = 0: to every other client
    share_keys = [m for m in grid.sent if stage_of(m) == "share-keys"]
    degree = 4 if neighbours == 4 else len(share_keys) - 1
    assert all(len(m.content["config"][NODES]) == degree for m in share_keys)


@pytest.mark.parametrize(
    ("silent", "why", "last_stage_sent"),
    [
        ({c: "setup" for c in IDS[1:]}, "fewer than 2 clients answered the key setup", "setup"),
        ({c: "share-keys" for c in IDS[2:]}, "too few clients shared their keys", "share-keys"),
        ({c: "masked-input" for c in IDS[2:]}, "too few masked inputs arrived", "masked-input"),
        ({c: "unmask" for c in IDS[2:]}, "too few clients returned their shares", "unmask"),
    ],
    ids=["setup", "share-keys", "masked-input", "unmask"],
)
def test_too_many_dropouts_abort_the_round_with_no_sum(silent, why, last_stage_sent):
    """k = 4, t = 3 of 5 holders: with 2 (or 1) clients left, no secret has the shares it needs. The round stops at
    the first stage that shows it: in particular, no survivor is asked for its shares when the masked inputs
    that arrived cannot be unmasked."""
    result, grid = run_secure_sum(_encodings(16, 33), 16, neighbours=4, silent=silent, cohort=COHORT)
    assert result.total is None
    assert result.aborted is not None and result.aborted.startswith(why)
    sent = {stage_of(m) for m in grid.sent}
    assert max(STAGES.index(s) for s in sent) == STAGES.index(last_stage_sent)


@pytest.mark.parametrize("threshold", [math.nextafter(0.5, 1.0), 0.5 + 1e-10, 0.51, 0.6, 2 / 3, 1.0])
def test_every_allowed_threshold_gives_a_majority_the_clients_accept(threshold):
    """Any ``privacy.secagg.threshold`` the settings accept (a fraction in (0.5, 1]) must give the server a ``t``
    that is a strict majority of a client's ``k + 1`` share holders: otherwise every client refuses the share-keys
    stage and every deployed round aborts, while a simulation (which never asks the clients) completes them."""
    # 4 clients: the complete graph, 4 share holders each
    encodings = {c: np.arange(8, dtype=np.int64) * c for c in IDS[:4]}
    result, _ = run_secure_sum(encodings, 16, neighbours=0, threshold=threshold)
    assert result.aborted is None
    np.testing.assert_array_equal(result.total, _sum(encodings, IDS[:4], 16))
    for n in range(2, 12):
        for neighbours in (0, 2, 4):
            secagg = SecureAggregation(neighbours=neighbours, threshold=threshold)
            k, t = secagg.degree(n), secagg.shares_needed(n)
            assert 2 <= t <= k + 1 and 2 * t > k + 1, (n, neighbours, k, t)


# ----------------------------------------------------------------------------------- what the server receives


@pytest.mark.parametrize("bits", [16, 32])
def test_the_server_receives_uniform_masked_inputs_and_no_secret(bits):
    """Each masked input is uniform modulo ``2^bits`` and uncorrelated with the client's encoding, whatever the
    encoding (here concentrated near 0, as a noised update's is); the other stages carry only keys, ciphertexts
    and shares, never a client's private keys or seed, and no client's seed and key are both revealed."""
    dim = 1 << 14
    rng = np.random.default_rng(bits)
    encodings = {
        c: np.rint(rng.normal(0.0, 2.0 ** (bits - 5), dim)).astype(np.int64) % (1 << bits) for c in IDS
    }
    result, grid = run_secure_sum(
        encodings, bits, neighbours=4, silent={DROPPER: "masked-input"}, cohort=COHORT
    )
    assert result.aborted is None and result.dropped == [DROPPER]

    def top_bins(x: np.ndarray) -> np.ndarray:
        return np.bincount(
            (np.asarray(x, dtype=np.uint64) >> np.uint64(bits - 6)).astype(np.int64), minlength=64
        )

    # the check has power: the encodings themselves are far from uniform
    assert all(stats.chisquare(top_bins(e)).pvalue < 1e-12 for e in encodings.values())
    by_id = {m.metadata.message_id: m for m in grid.sent}
    stages_seen = set()
    for reply in grid.replies:
        client = int(reply.metadata.src_node_id)
        stage = stage_of(by_id[reply.metadata.reply_to_message_id])
        stages_seen.add(stage)
        assert not reply.has_error() and not reply.content.metric_records
        if stage == "masked-input":
            assert not reply.content.config_records
            (record,) = reply.content.array_records.values()
            assert list(record.keys()) == [MASKED]
            y = record[MASKED].numpy()
            assert y.dtype == masked_dtype(bits) and y.shape == (dim,)
            assert stats.chisquare(top_bins(y)).pvalue > 1e-4
            x = encodings[client].astype(np.float64)
            assert abs(stats.pearsonr(y.astype(np.float64), x).statistic) < 5 / np.sqrt(dim)
            assert np.mean(y.astype(np.int64) == encodings[client]) < 0.01
            continue
        assert not reply.content.array_records  # no stage but the masked input carries an array
        (config,) = reply.content.config_records.values()
        expected = {"setup": {PK1, PK2}, "share-keys": {DST, CIPHERTEXTS}}.get(
            stage, {SEED_OF, SEED_SHARES, KEY_OF, KEY_SHARES}
        )
        assert set(config.keys()) == expected, stage
        blobs = [v for value in config.values() for v in (value if isinstance(value, list) else [value])]
        assert all(isinstance(b, bytes | int) for b in blobs)
        for owner_secrets in grid.secrets.values():
            for secret in owner_secrets.values():
                assert not any(isinstance(b, bytes) and secret in b for b in blobs)
    assert stages_seen == set(STAGES)
    # unmasking: the seeds of survivors, the keys of the dropped client, never both for one client
    unmask = [
        r.content.config_records["secagg"]
        for r in grid.replies
        if stage_of(by_id[r.metadata.reply_to_message_id]) == "unmask"
    ]
    seeds_of = {int(v) for cfg in unmask for v in cfg[SEED_OF]}
    keys_of = {int(v) for cfg in unmask for v in cfg[KEY_OF]}
    assert keys_of == {DROPPER} and seeds_of == set(result.survivors)


# ------------------------------------------------------------------------------------------- client refusals


def _context() -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


def _setup(
    ids: list[int], contexts: dict[int, Context] | None = None
) -> tuple[bytes, dict[int, Context], dict[int, ConfigRecord]]:
    """A new session's key setup of ``ids`` (in ``contexts``: the clients' own, kept between sessions)."""
    session = secrets.token_bytes(16)
    contexts = contexts or {c: _context() for c in ids}
    keys = {c: handle_query(ConfigRecord({STAGE: SETUP, SESSION: session}), contexts[c], c) for c in ids}
    return session, contexts, keys


def _share_keys_config(
    session: bytes, keys: dict[int, ConfigRecord], nodes: list[int], t: int
) -> ConfigRecord:
    return ConfigRecord(
        {
            STAGE: SHARE_KEYS,
            SESSION: session,
            THRESHOLD: t,
            NODES: nodes,
            PK1: [keys[v][PK1] for v in nodes],
            PK2: [keys[v][PK2] for v in nodes],
        }
    )


def _shared(
    ids: list[int], t: int, contexts: dict[int, Context] | None = None
) -> tuple[bytes, dict[int, Context], dict[tuple[int, int], bytes]]:
    """A session of ``ids`` (the complete graph) through share-keys: the ciphertexts by (sender, recipient)."""
    session, contexts, keys = _setup(ids, contexts)
    cts = {}
    for u in ids:
        others = [v for v in ids if v != u]
        reply = handle_query(_share_keys_config(session, keys, others, t), contexts[u], u)
        cts.update({(u, int(d)): ct for d, ct in zip(reply[DST], reply[CIPHERTEXTS], strict=True)})
    return session, contexts, cts


def _train_config(session: bytes, cts: dict[tuple[int, int], bytes], ids: list[int], u: int) -> ConfigRecord:
    src = [v for v in ids if v != u]
    return ConfigRecord({SESSION: session, SRC: src, CIPHERTEXTS: [cts[(v, u)] for v in src]})


def test_a_client_refuses_a_threshold_that_is_not_a_majority_of_its_holders():
    """With ``k`` neighbours a client has ``k + 1`` share holders; a threshold of half of them (or fewer, or more
    than all) would let a colluding minority unmask it, or no one."""
    for nodes, refused, accepted in (([2, 3, 4, 5], (0, 1, 2, 6), 3), ([2, 3, 4], (1, 2, 5), 3)):
        session, contexts, keys = _setup([1, *nodes])
        for t in refused:
            with pytest.raises(
                SecAggError, match=f"threshold {t} for {len(nodes) + 1} share holders is refused"
            ):
                handle_query(_share_keys_config(session, keys, nodes, t), contexts[1], 1)
        # a refusal changes nothing: the same session then shares its keys with a majority threshold
        reply = handle_query(_share_keys_config(session, keys, nodes, accepted), contexts[1], 1)
        assert list(reply[DST]) == nodes and len(reply[CIPHERTEXTS]) == len(nodes)


def test_a_client_refuses_itself_or_repeated_clients_or_keys_among_its_neighbours():
    session, contexts, keys = _setup([1, 2, 3, 4, 5])
    for nodes in ([1, 2, 3, 4], [2, 2, 3, 4], []):
        with pytest.raises(SecAggError, match="empty, repeats a client or names this client"):
            handle_query(_share_keys_config(session, keys, nodes, 3), contexts[1], 1)
    # a server replaying keys: neighbour 3 offered with neighbour 2's key, neighbours 4 and 5 with this client's own
    for key, at, replayed in ((PK1, 1, keys[2][PK1]), (PK2, 2, keys[1][PK2]), (PK1, 3, keys[1][PK1])):
        config = _share_keys_config(session, keys, [2, 3, 4, 5], 3)
        config[key] = [replayed if i == at else pk for i, pk in enumerate(config[key])]
        with pytest.raises(SecAggError, match="repeated public keys"):
            handle_query(config, contexts[1], 1)
    reply = handle_query(_share_keys_config(session, keys, [2, 3, 4, 5], 3), contexts[1], 1)
    assert list(reply[DST]) == [2, 3, 4, 5]


def test_a_client_sends_one_masked_input_per_session_and_per_round_and_unmasks_once():
    ids = [1, 2, 3]
    session, contexts, cts = _shared(ids, 2)
    x = np.arange(10, dtype=np.int64)
    config = _train_config(session, cts, ids, 1)
    # the shares of fewer holders than the threshold (here only its own): its seed could not be rebuilt
    short = ConfigRecord({SESSION: session, SRC: [], CIPHERTEXTS: []})
    with pytest.raises(SecAggError, match="fewer than the threshold of this client's holders shared"):
        mask_input(short, contexts[1], 1, x, 16, 1)
    first = mask_input(config, contexts[1], 1, x, 16, 1)
    assert first.dtype == np.uint16 and first.shape == (10,)
    # two inputs under the same masks would give away their difference
    with pytest.raises(SecAggError, match="already sent in this session"):
        mask_input(config, contexts[1], 1, x + 1, 16, 1)
    with pytest.raises(SecAggError, match="a second key setup for a session this client already holds"):
        handle_query(ConfigRecord({STAGE: SETUP, SESSION: session}), contexts[1], 1)
    # an unmasking request naming a client both alive and dropped asks for its self mask and its pairwise masks
    for active, dropped in (([1, 2, 3], [2]), ([1, 3], [3])):
        with pytest.raises(SecAggError, match="both alive and dropped"):
            handle_query(
                ConfigRecord({STAGE: UNMASK, SESSION: session, ACTIVE: active, DROPPED: dropped}),
                contexts[1],
                1,
            )
    ok = ConfigRecord({STAGE: UNMASK, SESSION: session, ACTIVE: [1, 2, 3], DROPPED: []})
    shares = handle_query(ok, contexts[1], 1)
    assert list(shares[SEED_OF]) == [1, 2, 3] and list(shares[KEY_OF]) == []
    with pytest.raises(SecAggError, match="has not set up"):  # the secrets are gone after one unmasking
        handle_query(ok, contexts[1], 1)
    # a fresh session, but for the round it already masked (or an earlier one): two inputs with independent noise
    # in one round would let the server average the noise away. The next round is answered.
    session, contexts, cts = _shared(ids, 2, contexts)
    config = _train_config(session, cts, ids, 1)
    for server_round in (1, 0):
        with pytest.raises(SecAggError, match="one masked input per round"):
            mask_input(config, contexts[1], 1, x, 16, server_round)
    assert mask_input(config, contexts[1], 1, x, 16, 2).shape == (10,)
    # a masked input before the keys are shared is refused too
    session, contexts, _ = _setup(ids)
    with pytest.raises(SecAggError, match="keys not shared"):
        mask_input(ConfigRecord({SESSION: session, SRC: [], CIPHERTEXTS: []}), contexts[1], 1, x, 16, 1)


def test_a_client_refuses_a_stage_of_a_session_it_has_not_set_up():
    ids = [1, 2, 3]
    session, contexts, cts = _shared(ids, 2)
    other = secrets.token_bytes(16)
    fresh = _context()
    for ctx in (contexts[1], fresh):
        for stage, extra in (
            (SHARE_KEYS, {NODES: [2, 3], THRESHOLD: 2}),
            (UNMASK, {ACTIVE: [1], DROPPED: []}),
        ):
            with pytest.raises(SecAggError, match="for a session this client has not set up"):
                handle_query(ConfigRecord({STAGE: stage, SESSION: other, **extra}), ctx, 1)
        config = _train_config(session, cts, ids, 1)
        config[SESSION] = other
        with pytest.raises(SecAggError, match="for a session this client has not set up"):
            mask_input(config, ctx, 1, np.zeros(4, dtype=np.int64), 16, 1)
    with pytest.raises(SecAggError, match="no 16-byte session id"):
        handle_query(ConfigRecord({STAGE: SETUP, SESSION: b"short"}), fresh, 1)
    with pytest.raises(SecAggError, match="unknown stage 'reveal'"):
        handle_query(ConfigRecord({STAGE: "reveal", SESSION: session}), contexts[1], 1)
    # the session is intact after all that: client 1 still masks its input
    masked = mask_input(_train_config(session, cts, ids, 1), contexts[1], 1, np.zeros(4, np.int64), 16, 1)
    assert masked.shape == (4,)


# ------------------------------------------------------------------------------ the shipped apps, on a loopback

NODES_APP = 4
SECURE = (
    "seed=0 rounds=2 data.num_clients=5 data.heldout_fraction=0.2 client.local_epochs=1 client.batch_size=64 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 "
    "engine.name=local privacy.noise_placement=distributed privacy.mechanism.name=ddgauss privacy.accountant=rdp "
    "privacy.secagg.enabled=true"
)


def _query(node: int, config: dict) -> Message:
    return Message(
        content=RecordDict({"config": ConfigRecord(config)}), message_type=MESSAGE_TYPE, dst_node_id=node
    )


def _plain_train_message(grid: SecAggLoopbackGrid, node: int) -> Message:
    """The server's encoded train message of a ddgauss round addressed to ``node``, without a secure-aggregation
    session (what a server that skips SecAgg+ would send)."""
    exp = build_experiment(load_scenario("quickstart", SECURE.split()))
    plan = dataclasses.replace(exp.strategy.begin_round(1, exp.train_ids), cohort=np.array([node]))
    _, data, trainer = load_for_run(grid.contexts[node].run_config)
    w0 = initial_weights(trainer.settings, data.input_dim, data.num_classes)
    return wire.train_messages(plan, model_record(trainer, w0))[0]


def _answer(grid: SecAggLoopbackGrid, msg: Message) -> Message:
    before = len(grid.replies)
    grid.push_messages([msg])
    assert len(grid.replies) == before + 1
    return grid.replies[-1]


def _refused(reply: Message, error: str, match: str) -> bool:
    """An error reply naming ``error`` and ``match``, and nothing else: no content left the node."""
    return (
        reply.has_error()
        and not reply.has_content()
        and error in reply.error.reason
        and match in reply.error.reason
    )


def test_the_client_app_answers_a_refused_stage_with_an_error_only():
    grid = SecAggLoopbackGrid(client_module.app, NODES_APP, {"scenario": "quickstart", "overrides": SECURE})
    node = grid.node_ids[0]
    session = secrets.token_bytes(16)
    keys = _answer(grid, _query(node, {STAGE: SETUP, SESSION: session})).content.config_records["secagg"]
    assert set(keys.keys()) == {PK1, PK2}
    peers = [crypto.key_pair()[1] for _ in range(8)]
    nodes = [10**9 + i for i in range(4)]  # no training client has such an id
    share = {STAGE: SHARE_KEYS, SESSION: session, NODES: nodes, PK1: peers[:4], PK2: peers[4:]}
    refused = _answer(grid, _query(node, {**share, THRESHOLD: 2}))
    assert _refused(refused, "SecAggError", "threshold 2 for 5 share holders is refused")
    unknown = _answer(grid, _query(node, {**share, THRESHOLD: 3, SESSION: secrets.token_bytes(16)}))
    assert _refused(unknown, "SecAggError", "a session this client has not set up")
    accepted = _answer(grid, _query(node, {**share, THRESHOLD: 3}))  # the session survived both refusals
    assert not accepted.has_error() and list(accepted.content.config_records["secagg"][DST]) == nodes
    # its node policy requires secure aggregation: an encoded train message without a session gets nothing
    plain = _plain_train_message(grid, node)
    assert _refused(_answer(grid, plain), "NoiseRefused", "the message has no secure-aggregation session")
    # a masked-input stage of a session the node never set up: refused too, before it trains
    stranger = _plain_train_message(grid, node)
    config = stranger.content.config_records["config"]
    config[SESSION], config[SRC], config[CIPHERTEXTS] = secrets.token_bytes(16), [], []
    assert _refused(_answer(grid, stranger), "SecAggError", "a session this client has not set up")
    # the check can fail: a node configured without that requirement answers the same message with its encoding
    other = grid.node_ids[1]
    grid.contexts[other].node_config[client_module.NODE_SECAGG] = "false"
    reply = _answer(grid, _plain_train_message(grid, other))
    (record,) = reply.content.array_records.values()
    assert not reply.has_error() and list(record.keys()) == [wire.ENCODED]


#: try1's scenario: 6 training clients on 6 nodes, SecAgg+ with 4 neighbours (t = 3 of 5 holders)
DEPLOYED = (
    "seed=0 rounds=2 data.num_clients=7 data.heldout_fraction=0.15 client.local_epochs=1 client.batch_size=64 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 "
    "engine.name=local privacy.noise_placement=distributed privacy.mechanism.name=ddgauss privacy.accountant=rdp "
    "privacy.secagg.enabled=true privacy.secagg.neighbours=4"
)
NODES_DEPLOYED = 6


@pytest.fixture
def no_plots(monkeypatch):
    """The run directory without its plots (matplotlib would take most of these tests' time)."""
    from fedsim.report.rundir import RunWriter

    monkeypatch.setattr(RunWriter, "write_plots", lambda self: [])


def _deploy(tmp_path, name: str, stops=None, overrides: str = DEPLOYED, **run_config) -> SecAggLoopbackGrid:
    cfg = {
        "scenario": "quickstart",
        "overrides": overrides,
        "min-nodes": NODES_DEPLOYED,
        "run-dir": str(tmp_path / name),
        **run_config,
    }
    grid = SecAggLoopbackGrid(client_module.app, NODES_DEPLOYED, cfg, stops=stops)
    server_module.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return grid


def _stage_counts(grid: SecAggLoopbackGrid) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in grid.sent:
        if m.metadata.message_type in (MESSAGE_TYPE, MessageType.TRAIN):
            out[stage_of(m)] = out.get(stage_of(m), 0) + 1
    return out


def test_a_deployment_refuses_a_simulated_dropout_rate(tmp_path):
    with pytest.raises(ValueError, match=r"privacy.secagg.dropout=0.3 simulates clients that drop out"):
        _deploy(tmp_path, "refused", overrides=f"{DEPLOYED} privacy.secagg.dropout=0.3")
    assert not (tmp_path / "refused").exists()  # refused before anything ran or was written


def test_an_aborted_deployed_round_stops_the_run_and_releases_nothing(tmp_path, no_plots):
    """4 of 6 nodes stop answering after sharing their keys in round 2: 2 masked inputs cannot be unmasked with
    t = 3, so round 2 is not released (no row, no ledger entry) and no survivor is asked for its shares."""

    def stops(context: Context, msg: Message) -> bool:
        return (
            context.node_config["partition-id"] < 4
            and msg.metadata.message_type == MessageType.TRAIN
            and int(msg.content["config"][wire.CFG_ROUND]) == 2
        )

    ledger_path = tmp_path / "ledger-copy.json"
    grid = _deploy(tmp_path, "aborted", stops=stops, **{"ledger-path": str(ledger_path)})
    quiet = {node for node, ctx in grid.contexts.items() if ctx.node_config["partition-id"] < 4}
    assert grid.stopped == quiet and not any(r.has_error() for r in grid.replies)
    # round 1 ran in full; round 2 reached the masked input (2 arrived) and stopped there
    assert _stage_counts(grid) == {"setup": 12, "share-keys": 12, "masked-input": 12, "unmask": 6}
    assert sum(r.metadata.message_type == MessageType.TRAIN for r in grid.replies) == 6 + 2
    run = tmp_path / "aborted"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["round"] for r in rows] == [1]
    summary = json.loads((run / "summary.json").read_text())
    stop = summary_stop(summary)
    assert stop["stopped_by"] == "secagg_aborted" and stop["rounds_completed"] == 1
    assert stop[NON_PRIVATE] and "stopped_by" not in summary  # an exact fact about clients: under non_private
    for ledger in (ledger_path, run / "ledger.json"):
        assert len(json.loads(ledger.read_text())["releases"]) == 1


def test_a_deployed_secure_run_has_the_ledger_and_epsilons_of_the_simulated_run(tmp_path, no_plots):
    """The same scenario deployed (SecAgg+ among 6 nodes, OS entropy) and simulated as if under SecAgg+ (seeded):
    the same releases are accounted, so the ledgers and the certified epsilons are equal. The deployed sum is the
    real one: its model moves as far as the simulated model does, not by the garbage of unremoved masks."""
    grid = _deploy(tmp_path, "deployed")
    simulated = run_scenario(load_scenario("quickstart", DEPLOYED.split()), write=False)
    assert not any(r.has_error() for r in grid.replies)
    assert _stage_counts(grid) == {s: 2 * NODES_DEPLOYED for s in STAGES}
    train_replies = [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN]
    assert len(train_replies) == 2 * NODES_DEPLOYED
    assert all(list(next(iter(r.content.array_records.values())).keys()) == [MASKED] for r in train_replies)
    deployed_ledger = json.loads((tmp_path / "deployed" / "ledger.json").read_text())
    assert deployed_ledger == json.loads(json.dumps(simulated.strategy.ledger.to_dict()))
    assert len(deployed_ledger["releases"]) == 2
    rows = [json.loads(x) for x in (tmp_path / "deployed" / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["epsilon"] for r in rows] == [r["epsilon"] for r in simulated.rows]
    assert [r["randomness"] for r in rows] == ["os-entropy"] * 2
    w0 = wire.flat_arrays(
        next(m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN).content["arrays"]
    )
    moved = [np.linalg.norm(np.load(tmp_path / "deployed" / "model.npz")["weights"] - w0)]
    moved.append(np.linalg.norm(simulated.weights - w0))
    assert 0.5 < moved[0] / moved[1] < 2.0, moved
