"""SecAgg+ on Flower's Message API: the server's four stages over a Grid, and the client's side of each.

One round of :func:`secure_sum` (Bell, Bengtson, Ito, Raykova and Wichs, CCS 2020, semi-honest variant; Bonawitz et
al. 2017 with the complete graph), with the cohort ``U0`` the strategy sampled:

1. **setup** (``query.fedsim_secagg``, stage ``setup``): each client makes two X25519 key pairs, one to encrypt the
   shares it sends (``pk1``) and one to agree pairwise masks (``pk2``), and returns the public keys. ``U1``: those
   that answered.
2. **share-keys** (stage ``share-keys``): the server draws the round's neighbour graph on ``U1``
   (:func:`fedsim.secagg.graph.harary`) and sends each client its neighbours' public keys and ``t``. The client draws
   its self-mask seed ``b``, Shamir-splits ``b`` and its mask key ``sk2`` ``t``-of-``k+1`` among its share holders
   (its neighbours and itself), and returns one AES-GCM ciphertext per neighbour, under a key agreed from ``pk1``.
   ``U2``: those that answered with a ciphertext for every neighbour.
3. **masked input** (the round's ``train`` message, carrying the ciphertexts addressed to the client): the client
   trains, encodes its noised update (the ``ddgauss``/``skellam`` encoding, integers modulo ``2^bits``), and returns
   ``y = x + PRG(b) + sum_v s(u,v) PRG(s_uv) mod 2^bits`` (``s(u,v) = +1`` when ``u < v``, else ``-1``), the sum over
   the neighbours ``v`` that sent it shares: ``fedsim.masked``, uniform modulo ``2^bits`` whatever ``x`` is.
   ``U3``: those whose masked input arrived; ``U2 - U3`` dropped after sharing.
4. **unmask** (stage ``unmask``): each survivor returns its shares of its surviving holders' seeds ``b`` and of its
   dropped neighbours' keys ``sk2``, never both for one client. The server reconstructs each survivor's ``b`` and
   removes ``PRG(b)``, reconstructs each dropped client's ``sk2`` (checked against its ``pk2``) and removes the
   pairwise masks it left in its neighbours' inputs; the survivors' pairwise masks cancel in the sum.

Fewer than ``t`` shares for any secret the sum needs aborts the round (:func:`fedsim.secagg.graph.unrecoverable`):
nothing is released. Masks come from 256-bit seeds through ChaCha20 (:func:`fedsim.secagg.crypto.mask`); every key,
seed and share polynomial comes from the operating system's entropy; only the graph uses the server's generator
(the operating system's in deployment, seeded in a simulation).

The client keeps its secrets for the round in ``context.state`` (the SuperNode holds a run's context between
messages) and refuses, with a :class:`~fedsim.secagg.crypto.SecAggError`: a stage out of order or of another
session, a threshold that is not a majority of its share holders, repeated public keys, a second masked input for
one session (two inputs under the same masks would give away their difference), and an unmasking request naming
one client both alive and dropped.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from . import crypto
from .crypto import SecAggError
from .graph import harary, holders, unrecoverable

#: the message type of the stages other than the masked input (the ClientApp's ``@app.query("fedsim_secagg")``)
QUERY = "fedsim_secagg"
MESSAGE_TYPE = f"{MessageType.QUERY}.{QUERY}"
STAGE = "fedsim.secagg.stage"
SESSION = "fedsim.secagg.session"
THRESHOLD = "fedsim.secagg.threshold"
NODES = "fedsim.secagg.nodes"
PK1 = "fedsim.secagg.pk1"
PK2 = "fedsim.secagg.pk2"
DST = "fedsim.secagg.dst"
SRC = "fedsim.secagg.src"
CIPHERTEXTS = "fedsim.secagg.ciphertexts"
ACTIVE = "fedsim.secagg.active"
DROPPED = "fedsim.secagg.dropped"
SEED_OF = "fedsim.secagg.seed-of"
SEED_SHARES = "fedsim.secagg.seed-shares"
KEY_OF = "fedsim.secagg.key-of"
KEY_SHARES = "fedsim.secagg.key-shares"
#: the reply array of the masked-input stage
MASKED = "fedsim.masked"
SETUP, SHARE_KEYS, UNMASK = "setup", "share-keys", "unmask"
#: where a client keeps the round's secrets between messages, and the last round it sent a masked input for
STATE = "fedsim.secagg"
LAST_ROUND = "fedsim.secagg.last-round"

_SHARE_INFO = b"fedsim secagg share key"
_MASK_INFO = b"fedsim secagg pairwise mask"
_ID = struct.Struct(">q")


def _info(base: bytes, session: bytes) -> bytes:
    return base + b"|" + session


def _ad(session: bytes, src: int, dst: int) -> bytes:
    return session + _ID.pack(src) + _ID.pack(dst)


def masked_dtype(bits: int) -> np.dtype:
    """The unsigned type a masked input travels in: the smallest holding ``2^bits - 1``."""
    return np.dtype(np.uint16) if bits <= 16 else np.dtype(np.uint32)


# ==================================================================================================== server side
@dataclass
class SecureSum:
    """What a SecAgg+ round gives the server: ``total``, the survivors' encodings summed modulo ``2^bits`` (None when
    ``aborted``), ``survivors`` (``U3``), ``dropped`` (shared keys, sent no masked input), ``failures`` (sampled
    clients left out before their masked input, by reason) and ``stages`` (how many answered each stage)."""

    total: np.ndarray | None
    survivors: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    aborted: str | None = None
    stages: dict[str, int] = field(default_factory=dict)


def _fail(failures: dict[str, int], reason: str, n: int = 1) -> None:
    if n > 0:
        failures[reason] = failures.get(reason, 0) + n


def _config(msg: Message) -> Any | None:
    if msg.has_error():
        return None
    records = list(msg.content.config_records.values())
    return records[0] if len(records) == 1 else None


def _exchange(
    grid: Any, messages: list[Message], node_to_client: Mapping[int, int], timeout: float | None
) -> dict[int, Message]:
    """client id -> its reply (one per client; a second reply from the same client is ignored)."""
    out: dict[int, Message] = {}
    mapping = dict(getattr(grid, "node_to_client", {}) or node_to_client)
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = int(reply.metadata.src_node_id)
        if mapping and node not in mapping:
            # not one of the round's nodes: the SuperLink's own error for a node it lost (src node 1, NODE_UNAVAILABLE),
            # which names no client; counted as no reply, never as the reply of the client whose id is 1
            continue
        out.setdefault(mapping.get(node, node), reply)
    return out


def _query(stage: str, session: bytes, dst: int, extra: dict[str, Any]) -> Message:
    config = ConfigRecord({STAGE: stage, SESSION: session, **extra})
    return Message(content=RecordDict({"config": config}), message_type=MESSAGE_TYPE, dst_node_id=int(dst))


def secure_sum(
    grid: Any,
    plan: Any,
    arrays: ArrayRecord,
    train_config: ConfigRecord,
    secagg: Any,
    rng: Any,
    *,
    timeout: float | None = None,
) -> SecureSum:
    """Run one SecAgg+ round with ``plan``'s cohort over ``grid`` (addressing nodes by client id: a
    :class:`fedsim.flower.grid.ClientIdGrid`); ``arrays`` and ``train_config``: the global model and the round's
    train config (:func:`fedsim.flower.protocol.train_config`, with the public encoding) the masked-input stage
    carries; ``secagg``: the :class:`fedsim.privacy.settings.SecureAggregation`; ``rng``: the server's generator for
    the graph."""
    size = sum(int(a.numpy().size) for a in arrays.values())
    encoding = plan.encoding_for(size)
    bits, dim = int(encoding["bits"]), int(encoding["dim"])
    session = secrets.token_bytes(16)
    node_to_client = dict(getattr(grid, "node_to_client", {}) or {})
    failures: dict[str, int] = {}
    stages: dict[str, int] = {}
    cohort = [int(c) for c in plan.cohort]

    def result(aborted: str | None, total: np.ndarray | None = None, **kw: Any) -> SecureSum:
        return SecureSum(total, failures=failures, aborted=aborted, stages=stages, **kw)

    # 1. setup: two public keys from each sampled client
    replies = _exchange(grid, [_query(SETUP, session, c, {}) for c in cohort], node_to_client, timeout)
    pk1: dict[int, bytes] = {}
    pk2: dict[int, bytes] = {}
    for c in cohort:
        cfg = _config(replies[c]) if c in replies else None
        a, b = (cfg.get(PK1), cfg.get(PK2)) if cfg is not None else (None, None)
        if isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b) == 32:
            pk1[c], pk2[c] = a, b
        else:
            _fail(
                failures,
                "no_reply" if c not in replies else "error" if replies[c].has_error() else "wrong_shape",
            )
    u1 = sorted(pk1)
    stages[SETUP] = len(u1)
    if len(u1) < 2:
        return result("fewer than 2 clients answered the key setup")
    graph = harary(u1, secagg.degree(len(u1)), rng)
    t = secagg.shares_needed(len(u1))

    # 2. share-keys: neighbours' public keys out, one ciphertext per neighbour back
    messages = [
        _query(
            SHARE_KEYS,
            session,
            u,
            {
                THRESHOLD: t,
                NODES: list(graph[u]),
                PK1: [pk1[v] for v in graph[u]],
                PK2: [pk2[v] for v in graph[u]],
            },
        )
        for u in u1
    ]
    replies = _exchange(grid, messages, node_to_client, timeout)
    cts: dict[tuple[int, int], bytes] = {}
    u2: list[int] = []
    for u in u1:
        cfg = _config(replies[u]) if u in replies else None
        dst = cfg.get(DST) if cfg is not None else None
        ct = cfg.get(CIPHERTEXTS) if cfg is not None else None
        if (
            isinstance(dst, list)
            and isinstance(ct, list)
            and sorted(int(d) for d in dst) == list(graph[u])
            and (len(ct) == len(dst) and all(isinstance(x, bytes) for x in ct))
        ):
            u2.append(u)
            cts.update({(u, int(d)): x for d, x in zip(dst, ct, strict=True)})
        else:
            _fail(
                failures,
                "no_reply" if u not in replies else "error" if replies[u].has_error() else "wrong_shape",
            )
    stages[SHARE_KEYS] = len(u2)
    if (why := unrecoverable(graph, u2, [], u2, t)) is not None:
        return result(f"too few clients shared their keys: {why}")

    # 3. masked input: the train message, with the ciphertexts addressed to each client
    in_u2 = set(u2)
    messages = []
    for u in u2:
        src = [v for v in graph[u] if v in in_u2]
        config = ConfigRecord(dict(train_config))
        config[SESSION] = session
        config[SRC] = src
        config[CIPHERTEXTS] = [cts[(v, u)] for v in src]
        record = RecordDict({"arrays": arrays, "config": config})
        messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=u))
    replies = _exchange(grid, messages, node_to_client, timeout)
    modulus = 1 << bits
    total = np.zeros(dim, dtype=np.uint32)  # arithmetic modulo 2^32, which 2^bits divides (bits <= 32)
    u3: list[int] = []
    for u in u2:
        masked = reply_masked(replies[u], dim, bits) if u in replies else None
        if masked is None:
            continue
        total += masked
        u3.append(u)
    dropped = sorted(in_u2.difference(u3))
    stages["masked-input"] = len(u3)
    if (why := unrecoverable(graph, u3, dropped, u3, t)) is not None:
        return result(f"too few masked inputs arrived: {why}", dropped=dropped)

    # 4. unmask: seed shares of surviving holders, key shares of dropped neighbours
    in_u3, in_dropped = set(u3), set(dropped)
    messages = [
        _query(
            UNMASK,
            session,
            u,
            {
                ACTIVE: [v for v in holders(graph, u) if v in in_u3],
                DROPPED: [v for v in graph[u] if v in in_dropped],
            },
        )
        for u in u3
    ]
    replies = _exchange(grid, messages, node_to_client, timeout)
    seed_shares: dict[int, list[bytes]] = {}
    key_shares: dict[int, list[bytes]] = {}
    answered: list[int] = []
    for u in u3:
        got = _unmask_reply(replies.get(u), set(holders(graph, u)) & in_u3, set(graph[u]) & in_dropped)
        if got is None:
            continue
        answered.append(u)
        for v, share in got[0].items():
            seed_shares.setdefault(v, []).append(share)
        for v, share in got[1].items():
            key_shares.setdefault(v, []).append(share)
    stages[UNMASK] = len(answered)
    if (why := unrecoverable(graph, u3, dropped, answered, t)) is not None:
        return result(f"too few clients returned their shares: {why}", dropped=dropped)
    try:
        for u in u3:  # the survivors' self masks
            total -= crypto.mask(crypto.combine(seed_shares[u], t), dim, bits)
        for v in dropped:  # the dropped clients' pairwise masks, left in their surviving neighbours' inputs
            sk2 = crypto.combine(key_shares[v], t)
            if crypto.public_of(sk2) != pk2[v]:
                return result(
                    "a dropped client's reconstructed key does not match its public key", dropped=dropped
                )
            for u in graph[v]:
                if u in in_u3:
                    pair = crypto.mask(crypto.agree(sk2, pk2[u], _info(_MASK_INFO, session)), dim, bits)
                    if u < v:  # u added +PRG(s_uv)
                        total -= pair
                    else:
                        total += pair
    except SecAggError as exc:
        return result(f"unmasking failed: {exc}", dropped=dropped)
    total &= np.uint32(modulus - 1)
    return SecureSum(total, survivors=u3, dropped=dropped, failures=failures, stages=stages)


def reply_masked(msg: Message, dim: int, bits: int) -> np.ndarray | None:
    """The masked input in a reply, or None if the reply is an error or not ``dim`` unsigned integers below
    ``2^bits`` in the type :func:`masked_dtype` names."""
    if msg.has_error():
        return None
    records = list(msg.content.array_records.values())
    if len(records) != 1 or list(records[0].keys()) != [MASKED]:
        return None
    try:
        got = records[0][MASKED].numpy()
    except Exception:
        return None
    if got.dtype != masked_dtype(bits) or got.shape != (dim,):
        return None
    if got.size and int(got.max()) >= (1 << bits):
        return None
    return got


def _unmask_reply(
    msg: Message | None, seeds_of: set[int], keys_of: set[int]
) -> tuple[dict[int, bytes], dict[int, bytes]] | None:
    cfg = _config(msg) if msg is not None else None
    if cfg is None:
        return None
    try:
        seeds = dict(zip((int(v) for v in cfg[SEED_OF]), cfg[SEED_SHARES], strict=True))
        keys = dict(zip((int(v) for v in cfg[KEY_OF]), cfg[KEY_SHARES], strict=True))
    except (KeyError, TypeError, ValueError):
        return None
    if set(seeds) != seeds_of or set(keys) != keys_of:
        return None
    if not all(isinstance(s, bytes) for s in (*seeds.values(), *keys.values())):
        return None
    return seeds, keys


# ==================================================================================================== client side
def _load(context: Any, session: bytes, stage: str) -> ConfigRecord:
    state = context.state.get(STATE) if STATE in context.state else None
    if state is None or state.get("session") != session:
        raise SecAggError(f"secure aggregation: a {stage} message for a session this client has not set up")
    return state


def _ints(config: Any, key: str) -> list[int]:
    value = config.get(key)
    if not isinstance(value, list):
        raise SecAggError(f"secure aggregation: the message's {key} is not a list")
    return [int(v) for v in value]


def handle_query(config: Any, context: Any, client: int) -> ConfigRecord:
    """The client's reply to a setup, share-keys or unmask message (``config``: its ConfigRecord; ``client``: this
    client's id). Raises :class:`SecAggError` for a message the protocol does not allow."""
    stage, session = config.get(STAGE), config.get(SESSION)
    if not isinstance(session, bytes) or len(session) != 16:
        raise SecAggError("secure aggregation: the message has no 16-byte session id")
    if stage == SETUP:
        held = context.state.get(STATE) if STATE in context.state else None
        if held is not None and held.get("session") == session:
            raise SecAggError(
                "secure aggregation: a second key setup for a session this client already holds"
            )
        sk1, pk1 = crypto.key_pair()
        sk2, pk2 = crypto.key_pair()
        context.state[STATE] = ConfigRecord(
            {"session": session, "stage": SETUP, "sk1": sk1, "sk2": sk2, "pk1": pk1, "pk2": pk2}
        )
        return ConfigRecord({PK1: pk1, PK2: pk2})
    if stage == SHARE_KEYS:
        return _share_keys(config, context, client, session)
    if stage == UNMASK:
        return _unmask(config, context, client, session)
    raise SecAggError(
        f"secure aggregation: unknown stage {stage!r} (allowed: {SETUP}, {SHARE_KEYS}, {UNMASK})"
    )


def _share_keys(config: Any, context: Any, client: int, session: bytes) -> ConfigRecord:
    state = _load(context, session, SHARE_KEYS)
    if state.get("stage") != SETUP:
        raise SecAggError("secure aggregation: share-keys asked twice in one session")
    nodes = _ints(config, NODES)
    pk1s, pk2s = config.get(PK1), config.get(PK2)
    t = int(config.get(THRESHOLD, 0))
    k = len(nodes)
    if not nodes or len(set(nodes)) != k or client in nodes:
        raise SecAggError(
            "secure aggregation: the neighbour list is empty, repeats a client or names this client"
        )
    if not (isinstance(pk1s, list) and isinstance(pk2s, list) and len(pk1s) == len(pk2s) == k):
        raise SecAggError("secure aggregation: the neighbours' public keys do not match the neighbour list")
    keys = [state["pk1"], state["pk2"], *pk1s, *pk2s]
    if len(set(keys)) != len(
        keys
    ):  # Bonawitz et al.: repeated keys abort (a server replaying a client's keys)
        raise SecAggError("secure aggregation: repeated public keys")
    if not (2 <= t <= k + 1 and 2 * t > k + 1):
        raise SecAggError(
            f"secure aggregation: threshold {t} for {k + 1} share holders is refused: it must be a majority of them "
            "(and at least 2), so no minority of colluding holders can unmask this client"
        )
    seed = crypto.random_seed()
    order = holders({client: nodes}, client)
    seed_shares = crypto.split(seed, t, len(order))
    key_shares = crypto.split(state["sk2"], t, len(order))
    peer1 = dict(zip(nodes, pk1s, strict=True))
    dst, cts = [], []
    for i, h in enumerate(order):
        if h == client:
            own = i
            continue
        key = crypto.agree(state["sk1"], peer1[h], _info(_SHARE_INFO, session))
        payload = _ID.pack(client) + _ID.pack(h) + _pack(seed_shares[i]) + _pack(key_shares[i])
        dst.append(h)
        cts.append(crypto.encrypt(key, payload, _ad(session, client, h)))
    state.update(
        {
            "stage": SHARE_KEYS,
            "seed": seed,
            "threshold": t,
            "nodes": nodes,
            "peer-pk1": list(pk1s),
            "peer-pk2": list(pk2s),
            "own-seed-share": seed_shares[own],
        }
    )
    return ConfigRecord({DST: dst, CIPHERTEXTS: cts})


def _pack(share: bytes) -> bytes:
    return struct.pack(">H", len(share)) + share


def _unpack(buf: bytes, at: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">H", buf, at)
    return buf[at + 2 : at + 2 + n], at + 2 + n


def check_train(config: Any, context: Any, server_round: int) -> None:
    """Refuse, before any training, a train message this client must not answer with a masked input: one of a session
    it has not shared keys in, a second one in a session, one for a round not after the last round it masked (two
    inputs in one round would let a server average their noise away), or one carrying the shares of fewer holders
    than the threshold."""
    session = config.get(SESSION)
    state = _load(context, session, "masked-input")
    if state.get("stage") != SHARE_KEYS:
        raise SecAggError(
            "secure aggregation: a masked input was already sent in this session (or keys not shared)"
        )
    last = context.state.get(LAST_ROUND) if LAST_ROUND in context.state else None
    if last is not None and int(server_round) <= int(last["round"]):
        raise SecAggError(
            f"secure aggregation: a masked input for round {server_round}, after this client masked round "
            f"{int(last['round'])}: one masked input per round"
        )
    src, cts = _ints(config, SRC), config.get(CIPHERTEXTS)
    nodes = [int(v) for v in state["nodes"]]
    if (
        not isinstance(cts, list)
        or len(cts) != len(src)
        or len(set(src)) != len(src)
        or not set(src) <= set(nodes)
    ):
        raise SecAggError(
            "secure aggregation: the message's shares do not come from this client's neighbours"
        )
    if len(src) + 1 < int(state["threshold"]):
        raise SecAggError(
            "secure aggregation: fewer than the threshold of this client's holders shared their keys"
        )


def mask_input(
    config: Any, context: Any, client: int, encoded: np.ndarray, bits: int, server_round: int
) -> np.ndarray:
    """The client's masked input for a train message of its session (:func:`check_train` first): ``encoded``
    (integers modulo ``2^bits``) plus its self mask and its pairwise masks with the neighbours whose shares the
    message carries. Stores those shares for the unmasking stage."""
    check_train(config, context, server_round)
    session = config.get(SESSION)
    state = _load(context, session, "masked-input")
    src, cts = _ints(config, SRC), config.get(CIPHERTEXTS)
    nodes = [int(v) for v in state["nodes"]]
    peer1 = dict(zip(nodes, state["peer-pk1"], strict=True))
    peer2 = dict(zip(nodes, state["peer-pk2"], strict=True))
    seeds, keys = [], []
    for v, ct in zip(src, cts, strict=True):
        key = crypto.agree(state["sk1"], peer1[v], _info(_SHARE_INFO, session))
        payload = crypto.decrypt(key, ct, _ad(session, v, client))
        if _ID.unpack_from(payload, 0)[0] != v or _ID.unpack_from(payload, 8)[0] != client:
            raise SecAggError("secure aggregation: a share's sender or recipient is not the one it claims")
        seed_share, at = _unpack(payload, 16)
        key_share, _ = _unpack(payload, at)
        seeds.append(seed_share)
        keys.append(key_share)
    dim = int(np.asarray(encoded).size)
    # modulo 2^32 (uint32 wraps), which 2^bits divides: the residues are exact after the final mask
    y = np.asarray(encoded, dtype=np.int64).astype(np.uint32)
    y += crypto.mask(state["seed"], dim, bits)
    for v in src:
        pair = crypto.mask(crypto.agree(state["sk2"], peer2[v], _info(_MASK_INFO, session)), dim, bits)
        if client < v:
            y += pair
        else:
            y -= pair
    y &= np.uint32((1 << bits) - 1)
    state.update({"stage": "masked-input", "src": src, "recv-seed": seeds, "recv-key": keys})
    context.state[LAST_ROUND] = ConfigRecord({"round": int(server_round)})
    return y.astype(masked_dtype(bits))


def masked_reply(masked: np.ndarray) -> ArrayRecord:
    """The reply of the masked-input stage: one array, ``fedsim.masked``."""
    return ArrayRecord(array_dict={MASKED: Array(np.ascontiguousarray(masked))})


def _unmask(config: Any, context: Any, client: int, session: bytes) -> ConfigRecord:
    state = _load(context, session, UNMASK)
    if state.get("stage") != "masked-input":
        raise SecAggError("secure aggregation: unmasking asked before this client's masked input (or twice)")
    active, dropped = set(_ints(config, ACTIVE)), set(_ints(config, DROPPED))
    if active & dropped:
        raise SecAggError(
            "secure aggregation: the unmasking request names a client both alive and dropped: answering would give "
            "the server both its self mask and its pairwise masks, that is its input"
        )
    src = [int(v) for v in state["src"]]
    if client not in active or not active <= {client, *src} or not dropped <= set(src):
        raise SecAggError(
            "secure aggregation: the unmasking request names clients that shared nothing with this one"
        )
    t = int(state["threshold"])
    if len(active) < t:
        raise SecAggError(
            f"secure aggregation: fewer than the threshold {t} of this client's holders survive"
        )
    seed_of = dict(zip(src, state["recv-seed"], strict=True))
    key_of = dict(zip(src, state["recv-key"], strict=True))
    seed_of[client] = state["own-seed-share"]
    seeds = sorted(active)
    keys = sorted(dropped)
    del context.state[STATE]  # one unmasking per session: the secrets are gone after it
    return ConfigRecord(
        {
            SEED_OF: seeds,
            SEED_SHARES: [seed_of[v] for v in seeds],
            KEY_OF: keys,
            KEY_SHARES: [key_of[v] for v in keys],
        }
    )
