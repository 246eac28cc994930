"""DPAgnosticFedAvg: lambda-weighted private aggregation and projected ascent on the domain weights."""

import math
from typing import ClassVar

import numpy as np
import pytest

from fedsim.round import PartialSum
from fedsim.strategies import DPAgnosticFedAvg, DPFedAvg, project_to_simplex

DOMAINS = {c: (0 if c < 14 else 1 if c < 18 else 2) for c in range(20)}  # 14 / 4 / 2 clients


def _afl(**kw):
    args = dict(
        client_domains=DOMAINS,
        num_domains=3,
        sampling="poisson",
        sampling_rate=0.5,
        clip=1.0,
        noise_multiplier=1.0,
        seed=3,
        accountant="rdp",
        lambda_lr=0.5,
        loss_noise_multiplier=1.0,
    )
    args.update(kw)
    return DPAgnosticFedAvg(**args)


def test_projection_onto_the_simplex():
    rng = np.random.default_rng(0)
    for _ in range(100):
        v = rng.normal(size=5) * 3
        p = project_to_simplex(v)
        assert p.min() >= 0 and p.sum() == pytest.approx(1.0)
        # optimality: no other simplex point of a random sample is closer
        for _ in range(20):
            o = rng.dirichlet(np.ones(5))
            assert np.linalg.norm(v - p) <= np.linalg.norm(v - o) + 1e-12
    assert np.allclose(project_to_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])


def test_proportional_lambda_gives_exactly_dp_fedavg():
    afl = _afl()
    avg = DPFedAvg(
        sampling="poisson", sampling_rate=0.5, clip=1.0, noise_multiplier=1.0, seed=3, accountant="rdp"
    )
    ids = np.arange(20)
    pa, pf = afl.begin_round(1, ids), avg.begin_round(1, ids)
    assert np.array_equal(pa.cohort, pf.cohort)
    # lambda starts proportional to the domain sizes, so every weight is 1 / (q * N)
    assert np.allclose(list(pa.client_weights.values()), 1 / (0.5 * 20))
    rng = np.random.default_rng(0)
    sa, sf = PartialSum(6), PartialSum(6)
    for c in pa.cohort:
        u = rng.normal(size=6)
        sa.add(u, 1.0, weight=pa.client_weights[int(c)])
        sf.add(u, 1.0)
    wa, _ma = afl.finish_round(pa, np.zeros(6), sa)
    wf, _mf = avg.finish_round(pf, np.zeros(6), sf)
    np.testing.assert_allclose(wa, wf, atol=1e-12)
    assert len(afl.ledger) == 2 and len(avg.ledger) == 1  # model + domain losses


def test_lambda_moves_to_the_worst_domain_and_weights_follow():
    afl = _afl(loss_noise_multiplier=0.5)
    ids = np.arange(20)
    for t in range(1, 30):
        plan = afl.begin_round(t, ids)
        p = PartialSum(2)
        for c in plan.cohort:
            d = DOMAINS[int(c)]
            p.add_extra("domain_loss", d, [0.2, 0.3, 0.9][d], 3)  # domain 2 is the worst
            p.add(np.ones(2), 1.0, weight=plan.client_weights[int(c)])
        afl.finish_round(plan, np.zeros(2), p)
    assert afl.lam.argmax() == 2 and afl.lam[2] > 0.5
    plan = afl.begin_round(30, ids)
    w2 = [plan.client_weights[c] for c in map(int, plan.cohort) if DOMAINS[c] == 2]
    w0 = [plan.client_weights[c] for c in map(int, plan.cohort) if DOMAINS[c] == 0]
    if w2 and w0:
        assert min(w2) > max(w0)


def test_noise_is_calibrated_to_the_largest_weight():
    afl = _afl(initial_lambda=[0.0, 0.0, 1.0], sampling="all", sampling_rate=None)
    plan = afl.begin_round(1, np.arange(20))
    # domain 2 has 2 clients, all sampled: weight 1/2; noise std on the weighted sum = z * clip * 1/2
    w, m = afl.finish_round(plan, np.zeros(200_000), PartialSum(200_000))
    assert m["weight_scale"] == pytest.approx(0.5)
    assert np.std(w) == pytest.approx(0.5, rel=0.02)


def test_equal_epsilon_to_dp_fedavg_at_the_composed_noise():
    # The two Gaussian releases on one cohort compose to one Gaussian with z_eff = (z1^-2 + z2^-2)^-1/2.
    z, sl = 1.0, 3.0
    zm = 1 / math.sqrt(z**-2 - sl**-2)
    afl = _afl(noise_multiplier=zm, loss_noise_multiplier=sl, accountant="pld")
    avg = DPFedAvg(sampling="poisson", sampling_rate=0.5, clip=1.0, noise_multiplier=z, seed=3)
    ids = np.arange(20)
    for t in (1, 2, 3):
        for s in (afl, avg):
            s.finish_round(s.begin_round(t, ids), np.zeros(2), PartialSum(2))
    assert afl.epsilon() == pytest.approx(avg.epsilon(), rel=1e-6)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="central"):
        _afl(noise_placement="distributed")
    with pytest.raises(ValueError, match="initial_lambda"):
        _afl(initial_lambda=[0.5, 0.5])
    afl = _afl(client_domains={c: 0 for c in range(20)})
    with pytest.raises(ValueError, match="no training client"):
        afl.begin_round(1, np.arange(20))


def test_message_api_weights_replies_by_client_and_collects_domain_losses(monkeypatch):
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)

    class Grid:  # what ClientIdGrid shows: client ids, and the node -> client map for the replies
        node_to_client: ClassVar[dict[int, int]] = {1000 + c: c for c in range(20)}

        def get_node_ids(self):
            return list(range(20))

    afl = _afl(sampling="all", sampling_rate=None, noise_multiplier=1.0, loss_noise_multiplier=1.0)
    arrays = ArrayRecord(array_dict={"w": Array(np.zeros(2, np.float32))})
    msgs = list(afl.configure_train(1, arrays, ConfigRecord(), Grid()))
    assert len(msgs) == 20 and float(msgs[0].content["config"]["fedsim.loss-bound"]) == pytest.approx(
        math.log(10)
    )
    replies = []
    for m in msgs:
        c = int(m.metadata.dst_node_id)
        m.metadata.__dict__["_dst_node_id"] = 1000 + c  # as delivered to the real node
        content = RecordDict(
            {
                "arrays": ArrayRecord(array_dict={"w": Array(np.ones(2, np.float32) * 0.1)}),
                "metrics": MetricRecord({"num-examples": 3, "fedsim.loss": [0.1, 0.2, 0.9][DOMAINS[c]]}),
            }
        )
        reply = Message(content, reply_to=m)
        reply.metadata.__dict__["_src_node_id"] = 1000 + c
        replies.append(reply)
    _new, metrics = afl.aggregate_train(1, replies)
    diag = afl.history[-1]["non_private"]
    assert diag["received"] == 20 and diag["rejected"] == 0
    # what Flower logs and keeps: private quantities only (no exact counts) unless diagnostics=True
    assert not any(k in metrics for k in ("received", "rejected", "cohort", "non_private.received"))
    # lambda moved toward domain 2 (the highest reported loss)
    assert afl.lam[2] > 0.1 and len(afl.ledger) == 2
