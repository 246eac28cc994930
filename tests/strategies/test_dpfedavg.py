"""DPFedAvg: the Flower strategy and the engine-facing round API."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from fedsim.round import STREAM_NOISE, PartialSum, make_rng
from fedsim.strategies import AdaptiveClipping, BudgetExhausted, DPFedAvg


class FakeGrid:
    """Just enough of a Grid for configure_train: the connected node ids."""

    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return list(self.nodes)


def _arrays(vecs):
    return ArrayRecord(
        array_dict={"w": Array(np.asarray(vecs[0], np.float32)), "b": Array(np.asarray(vecs[1], np.float32))}
    )


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Messages are stamped with the run/node of the running task; outside Flower, pretend to be one."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_task_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_run_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)


def _reply(to: Message, content: RecordDict | None = None, error: Error | None = None) -> Message:
    return Message(error, reply_to=to) if error is not None else Message(content, reply_to=to)


def test_is_a_flower_strategy():
    assert issubclass(DPFedAvg, Strategy)


def test_errors_name_the_field_with_one_message_everywhere():
    from fedsim.privacy import Mechanism, PrivacyInputError

    cases = [("sampling", "uniform"), ("clip", 0.0), ("noise_multiplier", -1.0), ("noise_placement", "local")]
    for field, bad in cases:
        with pytest.raises(PrivacyInputError) as strategy_error:
            DPFedAvg(sampling_rate=0.5, **{field: bad})
        with pytest.raises(PrivacyInputError) as mechanism_error:
            Mechanism(population=10, sampling_rate=0.5, **{field: bad})
        assert str(strategy_error.value) == str(mechanism_error.value)
        assert str(strategy_error.value).startswith(f"{field}={bad!r} is invalid: ")
    with pytest.raises(PrivacyInputError, match="sampling_rate/clients_per_round"):
        DPFedAvg(sampling="poisson")  # neither a rate nor a cohort size


def test_message_api_round_counts_bad_replies_and_they_never_reach_the_model():
    strat = DPFedAvg(sampling="all", clip=1.0, noise_multiplier=1.0, seed=0)
    global_arrays = _arrays([np.zeros(3), np.zeros(2)])
    msgs = list(strat.configure_train(1, global_arrays, ConfigRecord(), FakeGrid(range(1, 6))))
    assert [int(m.metadata.dst_node_id) for m in msgs] == [1, 2, 3, 4, 5]
    assert float(msgs[0].content["config"]["fedsim.clip"]) == 1.0
    good = RecordDict(
        {"arrays": _arrays([[3.0, 4.0, 0.0], [0.0, 0.0]]), "metrics": MetricRecord({"num-examples": 5})}
    )
    nonfinite = RecordDict(
        {"arrays": _arrays([[np.nan, 0, 0], [0, 0]]), "metrics": MetricRecord({"num-examples": 5})}
    )
    wrong_shape = RecordDict(
        {
            "arrays": ArrayRecord(
                array_dict={"w": Array(np.zeros(4, np.float32)), "b": Array(np.zeros(2, np.float32))}
            )
        }
    )
    wrong_dtype = RecordDict(
        {
            "arrays": ArrayRecord(
                array_dict={"w": Array(np.zeros(3, np.float64)), "b": Array(np.zeros(2, np.float32))}
            )
        }
    )
    replies = [
        _reply(msgs[0], good),
        _reply(msgs[1], nonfinite),
        _reply(msgs[2], wrong_shape),
        _reply(msgs[3], wrong_dtype),
        _reply(msgs[4], error=Error(code=1, reason="client crashed")),
    ]
    arrays, metrics = strat.aggregate_train(1, replies)
    assert (
        "rejected" not in metrics and "non_private.rejected" not in metrics
    )  # Flower logs only private values
    diag = strat.history[-1]["non_private"]
    assert diag["received"] == 1 and diag["rejected"] == 4 and diag["cohort"] == 5
    w = np.concatenate([arrays["w"].numpy(), arrays["b"].numpy()])
    # only the good reply, clipped to norm 1 ([0.6, 0.8, 0]), plus the round's noise, over the expected cohort
    noise = make_rng(0, 1, STREAM_NOISE).normal(0.0, 1.0, size=5)
    assert np.allclose(w, (np.array([0.6, 0.8, 0.0, 0.0, 0.0]) + noise) / 5, atol=1e-6)
    assert np.all(np.isfinite(w))
    assert len(strat.ledger) == 1


def test_missing_replies_are_counted():
    strat = DPFedAvg(sampling="all", noise_multiplier=1.0, seed=0, diagnostics=True)
    global_arrays = _arrays([np.zeros(3), np.zeros(2)])
    list(strat.configure_train(1, global_arrays, ConfigRecord(), FakeGrid(range(1, 4))))
    arrays, metrics = strat.aggregate_train(1, [])
    # diagnostics=True: the counts reach Flower too, under their non-private name
    assert metrics["non_private.rejected"] == 3 and metrics["non_private.received"] == 0
    assert arrays is not None


def test_empty_poisson_cohort_still_releases_noise_and_is_accounted():
    strat = DPFedAvg(sampling="poisson", sampling_rate=0.01, clip=1.0, noise_multiplier=1.0, seed=0)
    ids = np.arange(5)
    for t in range(1, 200):
        plan = strat.begin_round(t, ids)
        if plan.cohort.size == 0:
            break
    assert plan.cohort.size == 0
    before = len(strat.ledger)
    w, m = strat.finish_round(plan, np.zeros(1000), PartialSum(1000))
    assert len(strat.ledger) == before + 1
    assert (
        m["non_private"]["cohort"] == 0 and m["update_norm"] > 0
    )  # pure noise: std z*clip / (q*N) = 20 per coordinate
    assert np.std(w) == pytest.approx(1.0 / (0.01 * 5), rel=0.1)


def test_noise_divided_by_expected_cohort():
    strat = DPFedAvg(
        sampling="fixed", clients_per_round=4, clip=0.5, noise_multiplier=2.0, seed=1, population=20
    )
    plan = strat.begin_round(1, np.arange(20))
    assert plan.cohort.size == 4
    w, m = strat.finish_round(plan, np.zeros(200_000), PartialSum(200_000))
    assert np.std(w) == pytest.approx(2.0 * 0.5 / 4, rel=0.01)
    assert m["noise_std_sum"] == pytest.approx(1.0)


def _run_adaptive(norm_sampler, rounds, start_clip, quantile, seed=0, n=100, lr=0.2):
    strat = DPFedAvg(
        sampling="all",
        clip=start_clip,
        noise_multiplier=1.0,
        seed=seed,
        accountant="rdp",
        adaptive_clipping=AdaptiveClipping(
            target_quantile=quantile, learning_rate=lr, count_noise_multiplier=1.0
        ),
    )
    rng = np.random.default_rng(seed)
    clips = []
    for t in range(1, rounds + 1):
        plan = strat.begin_round(t, np.arange(n))
        partial = PartialSum(4)
        for norm in norm_sampler(rng, n):
            v = rng.normal(size=4)
            partial.add(v / np.linalg.norm(v) * norm, plan.clip)
        strat.finish_round(plan, np.zeros(4), partial)
        clips.append(strat.clip)
    return np.array(clips), strat


def test_adaptive_clip_grows_toward_unit_norms_regression():
    # Every update has norm 1.0; the clip starts at 0.1 and targets the median: it must grow toward 1.0
    # (Flower 1.41's DifferentialPrivacyServerSideAdaptiveClipping shrinks it in this case).
    clips, strat = _run_adaptive(lambda rng, n: np.ones(n), 40, start_clip=0.1, quantile=0.5)
    assert np.all(np.diff(clips[:10]) > 0)
    assert 0.7 < clips[-1] < 1.4
    # two releases per round: the model sum and the noised count
    assert len(strat.ledger) == 80 and strat.ledger.rounds == 40


@pytest.mark.parametrize("quantile", [0.3, 0.7])
def test_adaptive_clip_converges_to_the_quantile(quantile):
    def sampler(rng, n):
        return rng.lognormal(mean=0.0, sigma=0.5, size=n)

    clips, _ = _run_adaptive(sampler, 150, start_clip=5.0, quantile=quantile, lr=0.2)
    from scipy import stats

    true_q = stats.lognorm(s=0.5).ppf(quantile)
    assert abs(np.mean(clips[-50:]) / true_q - 1) < 0.15


def test_max_epsilon_stops_before_exceeding():
    strat = DPFedAvg(sampling="poisson", sampling_rate=0.2, noise_multiplier=1.0, seed=0, max_epsilon=3.5)
    ids = np.arange(10)
    t = 0
    with pytest.raises(BudgetExhausted, match=r"max_epsilon=3\.5"):
        for t in range(1, 1000):
            plan = strat.begin_round(t, ids)
            strat.finish_round(plan, np.zeros(2), PartialSum(2))
    assert strat.epsilon() <= 3.5
    assert t == 4 and strat.ledger.rounds == 3  # epsilon 2.45, 2.92, 3.29, then 3.60 > 3.5


def test_message_api_stops_cleanly_on_budget():
    strat = DPFedAvg(sampling="all", noise_multiplier=0.5, seed=0, max_epsilon=1.0)
    arrays = _arrays([np.zeros(3), np.zeros(2)])
    msgs = list(strat.configure_train(1, arrays, ConfigRecord(), FakeGrid(range(1, 4))))
    assert msgs == [] and "max_epsilon" in strat.stopped_reason
    assert strat.aggregate_train(1, []) == (None, None)
    assert len(strat.ledger) == 0
