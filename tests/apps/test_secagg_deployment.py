"""SecAgg+ with discrete distributed noise on a real SuperLink (TLS, SuperNode authentication), with real dropouts.

``scripts/deploy_smoke.sh --secure`` starts a SuperLink and 5 SuperNodes on loopback and deploys the app of
``tests/apps/secagg_harness.py``: the shipped ServerApp on a Grid that records every message, and the fedsim ClientApp
with seeded noise shares. Its kill plan SIGKILLs SuperNodes (their process groups, by PID) in the pause the harness
makes after a round's share-keys stage: one in round 1, so it dies holding its neighbours' shares and owing its
masked input; three of the remaining four in round 2, which leaves fewer than the threshold. Each client shares its
secrets with 2 neighbours (SecAgg+'s sparse graph, not every other client), 2 of its 3 share holders needed. Then:

* round 1 is released, and its modular sum is, to the integer, the sum modulo ``2^bits`` of the four survivors'
  encodings recomputed here from the train messages the server sent (rotation seed and cohort: the server's OS
  entropy, read from those messages; noise: the harness's seed; masks: each node's OS entropy, and they cancel);
* each masked input that reached the server is uniform modulo ``2^bits`` and uncorrelated with the client's encoding,
  and no other reply carries an array;
* round 2 is aborted: the run stops with ``secagg_aborted`` and the ledger holds round 1's release only.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from scipy.stats import chisquare
from secagg_harness import client_app, load_capture  # tests/apps/secagg_harness.py, beside this file
from smoke import run_smoke  # tests/apps/smoke.py

from fedsim.flower.grid import IDENTITY_MESSAGE_TYPE, KEY_CLIENT_ID, KEY_PARTITION_ID
from fedsim.flower.protocol import ENCODED, encoding_of
from fedsim.privacy.settings import SecureAggregation
from fedsim.report.rows import summary_stop
from fedsim.secagg import protocol as secagg

NODES = 5
NEIGHBOURS = 2
OVERRIDES = (
    f"seed=0 rounds=2 data.num_clients={NODES + 1} data.heldout_fraction=0.15 client.local_epochs=1 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 engine.name=local "
    "privacy.noise_placement=distributed privacy.mechanism.name=ddgauss privacy.accountant=rdp "
    f"privacy.secagg.enabled=true privacy.secagg.neighbours={NEIGHBOURS}"
)
#: partition ids killed after each round's share-keys stage
KILL_R1, KILL_R2 = (4,), (0, 1, 2)
#: the server's exchanges with the nodes: who each node is, round 1's four stages, round 2's first three
EXCHANGES = (
    "identity",
    *("setup", "share-keys", "masked-input", "unmask"),
    *("setup", "share-keys", "masked-input"),
)
#: the replies' one ConfigRecord, stage by stage (name, keys): who the node is, public keys, ciphertexts, shares
REPLY_CONFIG = {
    "identity": ("identity", {KEY_CLIENT_ID, KEY_PARTITION_ID}),
    secagg.SETUP: ("secagg", {secagg.PK1, secagg.PK2}),
    secagg.SHARE_KEYS: ("secagg", {secagg.DST, secagg.CIPHERTEXTS}),
    secagg.UNMASK: ("secagg", {secagg.SEED_OF, secagg.SEED_SHARES, secagg.KEY_OF, secagg.KEY_SHARES}),
}


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """The ClientApp called in-process (as a SuperNode's ClientApp process would be) needs a task identity."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


def _stage(exchange: dict) -> str:
    """What an exchange was: the identity query, a SecAgg+ stage, or the masked input (the train message)."""
    sent = exchange["sent"]
    types = {m["type"] for m in sent}
    assert len(types) == 1, types
    kind = types.pop()
    if kind == IDENTITY_MESSAGE_TYPE:
        return "identity"
    if kind == MessageType.TRAIN:
        return "masked-input"
    assert kind == secagg.MESSAGE_TYPE, kind
    stages = {m["configs"]["config"][secagg.STAGE] for m in sent}
    assert len(stages) == 1, stages
    return stages.pop()


def _encoding(train: dict, partition: int) -> np.ndarray:
    """A client's encoding recomputed in-process: the train message the server sent it, without the secure-
    aggregation session, to the harness's seeded ClientApp on a node that accepts sending it unmasked."""
    config = {
        k: v
        for k, v in train["configs"]["config"].items()
        if k not in (secagg.SESSION, secagg.SRC, secagg.CIPHERTEXTS)
    }
    arrays = ArrayRecord(array_dict={k: Array(v) for k, v in train["arrays"]["arrays"].items()})
    msg = Message(
        RecordDict({"arrays": arrays, "config": ConfigRecord(config)}),
        dst_node_id=train["dst"],
        message_type=MessageType.TRAIN,
    )
    context = Context(
        run_id=1,
        node_id=train["dst"],
        node_config={"partition-id": partition, "num-partitions": NODES, "secure-aggregation": "false"},
        state=RecordDict(),
        run_config={"scenario": "quickstart", "overrides": OVERRIDES},
    )
    reply = client_app(msg, context)
    assert not reply.has_error(), reply.error
    return reply.content.array_records["arrays"][ENCODED].numpy()


@pytest.mark.skipif(sys.platform != "linux", reason="the script uses setsid, ps and /dev/tcp")
def test_secagg_on_a_real_superlink_survives_a_dropout_then_aborts_below_the_threshold(tmp_path):
    # the plan is meaningful: the rounds use a sparse graph (k=2 < 4), losing 1 of 5 leaves every secret at least t
    # of its k + 1 share holders, and losing 3 of 4 leaves fewer than t clients in all
    sa = SecureAggregation(neighbours=NEIGHBOURS)
    assert sa.degree(NODES) == NEIGHBOURS < NODES - 1
    assert NEIGHBOURS + 1 - len(KILL_R1) >= sa.shares_needed(NODES)
    assert sa.degree(NODES - len(KILL_R1)) == NEIGHBOURS
    assert NODES - len(KILL_R1) - len(KILL_R2) < sa.shares_needed(NODES - len(KILL_R1))

    capture, run_dir, ledger = tmp_path / "capture", tmp_path / "server-run", tmp_path / "ledger.json"
    env = {
        "FEDSIM_SMOKE_RUN_DIR": str(run_dir),
        "FEDSIM_SMOKE_PORT": "19391",
        "FEDSIM_SMOKE_NODE_PORTS": " ".join(str(19401 + i) for i in range(NODES)),
        "FEDSIM_SMOKE_REFUSED_PORT": "19410",
        "FEDSIM_SMOKE_OVERRIDES": OVERRIDES,
        "FEDSIM_SMOKE_SERVERAPP": "tests.apps.secagg_harness:server_app",
        "FEDSIM_SMOKE_CLIENTAPP": "tests.apps.secagg_harness:client_app",
        # round 1 starts with every node (wait-nodes); min-nodes lets round 2 start with those left
        "FEDSIM_SMOKE_RUN_CONFIG": f"capture-dir='{capture}' ledger-path='{ledger}' wait-nodes={NODES}",
        "FEDSIM_SMOKE_MIN_NODES": str(NODES - len(KILL_R1)),
        "FEDSIM_SMOKE_KILL": f"1:{','.join(map(str, KILL_R1))} 2:{','.join(map(str, KILL_R2))}",
        "FEDSIM_SMOKE_TIMEOUT": "450",  # the run: about 280 s on 2 idle cores
        "FEDSIM_SMOKE_REFUSALS": "0",  # tests/apps/test_secure_deployment.py checks them
    }
    out = run_smoke(env, 540, "--secure")
    assert f"registered {NODES} SuperNode public keys" in out
    for r, ids in ((1, KILL_R1), (2, KILL_R2)):
        for i in ids:
            assert re.search(
                rf"killed SuperNode partition-id={i} after round {r}'s share-keys: SIGKILL to process group \d+",
                out,
            ), out[-6000:]
    assert "kill plan carried out" in out

    exchanges, sums = load_capture(capture)
    assert tuple(_stage(x) for x in exchanges) == EXCHANGES
    for x in exchanges:  # each message sent got exactly one reply (the capture holds every reply received)
        answered = sorted(r["reply_to"] for r in x["replies"])
        assert answered == sorted(m["message_id"] for m in x["sent"]), x["seq"]
    identity = exchanges[0]
    partition_of = {r["src"]: r["configs"]["identity"][KEY_PARTITION_ID] for r in identity["replies"]}
    client_of = {r["src"]: r["configs"]["identity"][KEY_CLIENT_ID] for r in identity["replies"]}
    assert sorted(partition_of.values()) == list(range(NODES))
    node_of = {p: n for n, p in partition_of.items()}
    killed_r1 = {node_of[p] for p in KILL_R1}
    killed_r2 = {node_of[p] for p in KILL_R2}

    # who was asked what: round 1 every node at every stage but the unmasking (those that sent a masked input);
    # round 2 the nodes left (the one killed in round 1 is no longer listed by the SuperLink)
    everyone = set(node_of.values())
    asked = [{m["dst"] for m in x["sent"]} for x in exchanges[1:]]
    r1_alive, r2_alive = everyone - killed_r1, everyone - killed_r1 - killed_r2
    assert asked == [everyone, everyone, everyone, r1_alive, r1_alive, r1_alive, r1_alive]

    # the replies: a killed node's masked input is an error (the SuperLink's: its node stopped heartbeating); every
    # other reply comes from the node asked and is no error; only a masked input carries an array, and nothing else
    dead_at = [set(), set(), set(), killed_r1, set(), set(), set(), killed_r2]
    for x, dead in zip(exchanges, dead_at, strict=True):
        dst_of = {m["message_id"]: m["dst"] for m in x["sent"]}
        stage = _stage(x)
        for r in x["replies"]:
            node = dst_of[r["reply_to"]]
            if node in dead:
                assert r["error"] is not None and not r["arrays"] and not r["configs"], (stage, r)
                continue
            assert r["error"] is None and r["src"] == node, (stage, r["error"])
            assert not r["metrics"]
            if stage == "masked-input":
                assert not r["configs"] and list(r["arrays"]) == ["arrays"]
                assert list(r["arrays"]["arrays"]) == [secagg.MASKED]
            else:
                name, keys = REPLY_CONFIG[stage]
                assert not r["arrays"], (stage, r["arrays"])
                assert list(r["configs"]) == [name] and set(r["configs"][name]) == keys, (stage, r["configs"])

    # (a) round 1 released the survivors' modular sum: the same integers as their encodings recomputed here
    r1 = sums[1]
    assert r1["aborted"] is None
    assert r1["survivors"] == sorted(client_of[n] for n in r1_alive)
    assert r1["dropped"] == sorted(client_of[n] for n in killed_r1)
    trains = {1: exchanges[3], 2: exchanges[7]}
    config = trains[1]["sent"][0]["configs"]["config"]
    encoding = encoding_of(config)
    bits, dim = int(encoding["bits"]), int(encoding["dim"])
    encoded = {
        (rnd, m["dst"]): _encoding(m, partition_of[m["dst"]])
        for rnd, x in trains.items()
        for m in x["sent"]
        if m["dst"] in (r1_alive if rnd == 1 else r2_alive)
    }
    modulus = 1 << bits
    expected = sum(encoded[(1, n)] for n in r1_alive) % modulus
    assert r1["total"].dtype == np.uint32 and r1["total"].shape == (dim,)
    np.testing.assert_array_equal(r1["total"].astype(np.int64), expected)

    # (b) each masked input that arrived is uniform modulo 2^bits (its top 4 bits: 16 equally likely values) and
    # uncorrelated with the client's encoding (centred: the signed quantised update)
    masked_inputs = 0
    for rnd, x in trains.items():
        dst_of = {m["message_id"]: m["dst"] for m in x["sent"]}
        for r in x["replies"]:
            if r["error"] is not None:
                continue
            y = r["arrays"]["arrays"][secagg.MASKED]
            assert y.dtype == secagg.masked_dtype(bits) and y.shape == (dim,)
            top = y.astype(np.int64) >> (bits - 4)
            assert chisquare(np.bincount(top, minlength=16)).pvalue > 1e-6, (
                rnd,
                np.bincount(top, minlength=16),
            )
            x_enc = encoded[(rnd, dst_of[r["reply_to"]])]
            signed = (x_enc + modulus // 2) % modulus - modulus // 2
            assert np.std(signed) > 0
            corr = np.corrcoef(y.astype(np.float64), signed.astype(np.float64))[0, 1]
            assert abs(corr) < 5 / np.sqrt(dim), (rnd, corr)
            # the encoding itself is far from uniform: the test above would see it
            assert chisquare(np.bincount(x_enc >> (bits - 4), minlength=16)).pvalue < 1e-6
            masked_inputs += 1
    assert masked_inputs == len(r1_alive) + len(r2_alive)

    # (c) round 2 lost 3 of its 4 clients after they shared their keys: aborted, nothing released, the run stopped
    r2 = sums[2]
    assert r2["total"] is None and r2["aborted"].startswith("too few masked inputs arrived"), r2["aborted"]
    assert r2["stages"] == {
        "setup": len(r1_alive),
        "share-keys": len(r1_alive),
        "masked-input": len(r2_alive),
    }
    assert r2["dropped"] == sorted(client_of[n] for n in killed_r2)
    stop = summary_stop(json.loads((run_dir / "summary.json").read_text()))
    assert stop["stopped_by"] == "secagg_aborted" and stop["rounds_completed"] == 1, stop
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["round"] for r in rows] == [1] and rows[0]["epsilon"] > 0
    assert rows[0]["non_private"]["received"] == len(r1_alive)
    assert rows[0]["non_private"]["failed"] == {"dropped": len(KILL_R1)}
    releases = json.loads(ledger.read_text())["releases"]
    assert len(releases) == 1 and releases[0]["round"] == 1, releases
    assert json.loads((run_dir / "ledger.json").read_text())["releases"] == releases
