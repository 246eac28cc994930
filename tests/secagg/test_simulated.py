"""SecAgg+ without the cryptography (fedsim.secagg.graph, fedsim.secagg.simulated): the neighbour graph, the rule that
decides whether a round can be unmasked, and simulated dropouts, checked against brute force, against the protocol
itself and through a simulated run.

Everything here is seeded (or enumerated), so it is deterministic.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from secagg_loopback import run_secure_sum

from fedsim.privacy.settings import SecureAggregation
from fedsim.round.randomness import OsEntropyGenerator
from fedsim.secagg import crypto
from fedsim.secagg.crypto import SecAggError
from fedsim.secagg.graph import harary, holders, unrecoverable
from fedsim.secagg.simulated import simulate_round


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower stamps messages with the run's identity, which a SuperLink process sets; set it as one would."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


class Scripted:
    """A generator that draws what it is told: the ring order of the graph, then each client's dropout uniform."""

    def __init__(self, order: list[int], uniforms: list[float] | None = None) -> None:
        self.order, self.uniforms = order, uniforms

    def permutation(self, n: int) -> np.ndarray:
        assert n == len(self.order)
        return np.asarray(self.order)

    def random(self, n: int) -> np.ndarray:
        assert self.uniforms is not None and n == len(self.uniforms)
        return np.asarray(self.uniforms, dtype=np.float64)


def _connected(graph: dict[int, tuple[int, ...]]) -> bool:
    start = next(iter(graph))
    seen, todo = {start}, [start]
    while todo:
        for v in graph[todo.pop()]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return len(seen) == len(graph)


# --------------------------------------------------------------------------------------------------- the graph


def test_harary_gives_every_client_exactly_k_neighbours_symmetrically():
    rng = np.random.default_rng(0)
    for n in range(2, 14):
        ids = sorted(int(c) for c in rng.choice(10_000, n, replace=False))
        for k in [0, *range(2, n - 1, 2), n - 1, n, n + 3]:
            graph = harary(ids, k, rng)
            degree = n - 1 if k == 0 or k >= n - 1 else k
            assert sorted(graph) == ids, (n, k)
            for c, neighbours in graph.items():
                assert list(neighbours) == sorted(neighbours) and c not in neighbours
                assert len(set(neighbours)) == len(neighbours) == degree, (n, k, c)
                assert all(c in graph[v] for v in neighbours), (n, k, c)  # symmetric
                assert holders(graph, c) == tuple(sorted({c, *neighbours}))
            assert _connected(graph)
            if degree == n - 1:
                assert all(set(graph[c]) == set(ids) - {c} for c in ids)


def test_harary_refuses_an_odd_k_below_the_complete_graph_and_draws_the_ring_at_random():
    ids = list(range(10, 20))
    with pytest.raises(ValueError, match="needs an even k"):
        harary(ids, 3, np.random.default_rng(0))
    assert len(harary(ids, 9, np.random.default_rng(0))[10]) == 9  # odd, but complete: allowed
    graphs = {tuple(sorted(harary(ids, 4, np.random.default_rng(s)).items())) for s in range(20)}
    assert len(graphs) > 10  # the ring order is drawn, not fixed by the ids
    # deployed: the operating system's generator (no permutation method) draws a valid graph too
    graph = harary(ids, 4, OsEntropyGenerator())
    assert all(len(v) == 4 and all(c in graph[u] for u in v) for c, v in graph.items())


# ---------------------------------------------------------------------------------------------- simulated rounds


def test_without_dropout_nobody_drops_and_no_round_aborts():
    rng = np.random.default_rng(1)
    for n in range(2, 21):
        for neighbours, threshold in itertools.product((0, 2, 4, 6), (0.51, 0.6, 1.0)):
            secagg = SecureAggregation(neighbours=neighbours, threshold=threshold)
            cohort = rng.choice(1000, n, replace=False)
            got = simulate_round(cohort, secagg, rng)
            assert got.dropped.size == 0 and got.aborted() is None, (n, neighbours, threshold)
    for cohort in ([], [7]):  # no secure sum of fewer than 2 clients
        assert simulate_round(np.asarray(cohort), SecureAggregation(), rng).aborted() is not None


def test_the_dropped_fraction_is_the_dropout():
    secagg = SecureAggregation(neighbours=4, dropout=0.3)
    rng = np.random.default_rng(7)
    rounds, n = 2000, 10
    cohort = np.arange(100, 100 + n)
    dropped = [simulate_round(cohort, secagg, rng).dropped for _ in range(rounds)]
    assert all(np.isin(d, cohort).all() and np.unique(d).size == d.size for d in dropped)
    total = rounds * n
    fraction = sum(d.size for d in dropped) / total
    assert abs(fraction - 0.3) < 4 * math.sqrt(0.3 * 0.7 / total), fraction
    # every position of the cohort drops at that rate (not, say, the first clients only)
    per_client = np.array([sum(c in d for d in dropped) for c in cohort]) / rounds
    assert np.all(np.abs(per_client - 0.3) < 4 * math.sqrt(0.3 * 0.7 / rounds)), per_client


def test_a_dropout_near_one_aborts_every_round():
    rng = np.random.default_rng(3)
    for neighbours in (0, 4):
        secagg = SecureAggregation(neighbours=neighbours, dropout=0.99)
        assert all(simulate_round(np.arange(10), secagg, rng).aborted() is not None for _ in range(50))


def _server_learns_only_the_sum(graph, survivors, dropped, answered, t, seeds, keys) -> bool:
    """Brute force: whether unmasking gives the server the survivors' sum and nothing finer.

    It holds the Shamir shares the answering clients hold (share ``i`` of a client's secrets at its ``i``-th holder):
    it must rebuild every survivor's seed and every dropped client's key. And once those masks are removed, what is
    left of each input is its pairwise masks with other survivors: any proper subset of the survivors with no such
    mask across its boundary has its own sum revealed, as does a lone survivor."""

    def rebuilt(owner: int, shares: list[bytes], secret: bytes) -> bool:
        given = [s for h, s in zip(holders(graph, owner), shares, strict=True) if h in answered]
        try:
            return crypto.combine(given, t) == secret
        except SecAggError:
            return False

    if len(survivors) < 2:
        return False
    if not all(rebuilt(u, seeds[u][1], seeds[u][0]) for u in survivors):
        return False
    if not all(rebuilt(v, keys[v][1], keys[v][0]) for v in dropped):
        return False
    alive = set(survivors)
    for size in range(1, len(survivors)):
        for part in itertools.combinations(survivors, size):
            if not any(v in alive and v not in part for u in part for v in graph[u]):
                return False  # no pairwise mask left between `part` and the other survivors
    return True


@pytest.mark.parametrize(("n", "k"), [(3, 2), (4, 2), (4, 3), (5, 2), (5, 4), (6, 2), (6, 4)])
@pytest.mark.parametrize("threshold", [0.6, 1.0])
def test_the_abort_rule_agrees_with_reconstructing_the_secrets(n, k, threshold):
    """Every client is dropped (shared, then silent), a survivor that answers the unmasking, or one that does not:
    :func:`unrecoverable` refuses to unmask exactly when some needed secret cannot be rebuilt or the unmasked inputs
    would show more than the survivors' sum; and :func:`simulate_round` (whose survivors all answer) decides each
    dropout pattern, or failed training, the same way."""
    ids = [3, 8, 21, 40, 77, 90][:n]
    secagg = SecureAggregation(neighbours=k if k < n - 1 else 0, threshold=threshold, dropout=0.5)
    t = secagg.shares_needed(n)
    order = list(np.random.default_rng(n * 10 + k).permutation(n))
    graph = harary(ids, secagg.degree(n), Scripted(order))
    seeds, keys = {}, {}
    for c in ids:
        m = len(holders(graph, c))
        seed, key = crypto.random_seed(), crypto.random_seed()
        seeds[c], keys[c] = (seed, crypto.split(seed, t, m)), (key, crypto.split(key, t, m))
    outcomes = set()
    for states in itertools.product(("dropped", "answers", "silent"), repeat=n):
        dropped = [c for c, s in zip(ids, states, strict=True) if s == "dropped"]
        survivors = [c for c, s in zip(ids, states, strict=True) if s != "dropped"]
        answered = {c for c, s in zip(ids, states, strict=True) if s == "answers"}
        brute = _server_learns_only_the_sum(graph, survivors, dropped, answered, t, seeds, keys)
        assert (unrecoverable(graph, survivors, dropped, answered, t) is None) == brute, states
        outcomes.add(brute)
        if "silent" not in states:  # what a simulated round draws: survivors answer, the dropped do not
            uniforms = [0.0 if s == "dropped" else 0.9 for s in states]
            sim = simulate_round(np.asarray(ids), secagg, Scripted(order, uniforms))
            assert sim.dropped.tolist() == dropped and (sim.aborted() is None) == brute, states
            # clients whose training failed send no masked input either: the same as dropping
            secagg_no_dropout = SecureAggregation(neighbours=secagg.neighbours, threshold=threshold)
            sim = simulate_round(np.asarray(ids), secagg_no_dropout, Scripted(order))
            assert sim.dropped.size == 0 and (sim.aborted(failed=dropped) is None) == brute, states
    assert outcomes == {True, False}


@pytest.mark.parametrize(("n", "neighbours"), [(5, 2), (6, 2), (6, 4), (4, 0)])
def test_a_simulated_round_aborts_exactly_when_the_protocol_does(n, neighbours):
    """The same graph and the same clients dropping after their keys are shared: the real protocol
    (:func:`fedsim.secagg.protocol.secure_sum`) aborts exactly in the patterns the simulation aborts, and otherwise
    sums exactly the survivors' encodings."""
    ids = [4, 9, 15, 16, 23, 42][:n]
    secagg = SecureAggregation(neighbours=neighbours, threshold=0.6, dropout=0.5)
    order = list(np.random.default_rng(n + neighbours).permutation(n))
    rng = np.random.default_rng(5)
    encodings = {c: rng.integers(0, 1 << 16, 16) for c in ids}
    aborted = []
    for pattern in itertools.product((False, True), repeat=n):
        dropped = [c for c, d in zip(ids, pattern, strict=True) if d]
        sim = simulate_round(np.asarray(ids), secagg, Scripted(order, [0.0 if d else 0.9 for d in pattern]))
        real, _ = run_secure_sum(
            encodings,
            16,
            neighbours=neighbours,
            threshold=0.6,
            silent=dict.fromkeys(dropped, "masked-input"),
            rng=Scripted(order),
        )
        assert (real.aborted is None) == (sim.aborted() is None), (pattern, real.aborted, sim.aborted())
        aborted.append(real.aborted is not None)
        if real.aborted is None:
            assert real.dropped == sorted(dropped) == sorted(sim.dropped.tolist())
            expected = sum(encodings[c] for c in real.survivors) % (1 << 16)
            np.testing.assert_array_equal(real.total, expected)
    assert any(aborted) and not all(aborted)


# ----------------------------------------------------------------------------------------------- simulated runs

SIMULATED = (
    "seed=0 rounds=3 data.num_clients=12 data.heldout_fraction=0.15 client.local_epochs=1 client.batch_size=64 "
    "privacy.sampling=all privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 "
    "engine.name=local privacy.noise_placement=distributed privacy.mechanism.name=ddgauss privacy.accountant=rdp "
    "privacy.secagg.enabled=true privacy.secagg.neighbours=4"
)


def _run(dropout: float, out=None):
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    scenario = load_scenario("quickstart", [*SIMULATED.split(), f"privacy.secagg.dropout={dropout}"])
    if out is None:
        return run_scenario(scenario, write=False)
    return run_scenario(scenario, out)


def test_simulated_dropouts_are_counted_and_accounted_at_the_floor():
    """Dropped clients are counted as ``dropped`` (non-private) and their encodings are not in the sum; the epsilon
    of a released round does not depend on how many dropped (it is accounted at the mechanism's floor)."""
    full, dropping = _run(0.0), _run(0.3)
    assert full.stopped_by is None and len(full.rows) == 3
    assert all(not r["non_private"].get("failed") for r in full.rows)
    assert dropping.rows, dropping.stopped_reason
    dropped = [r["non_private"]["failed"].get("dropped", 0) for r in dropping.rows]
    assert sum(dropped) > 0
    for row, n in zip(dropping.rows, dropped, strict=True):
        assert row["non_private"]["received"] + n == row["non_private"]["cohort"]
    assert [r["epsilon"] for r in dropping.rows] == [r["epsilon"] for r in full.rows[: len(dropping.rows)]]
    released = len(dropping.rows)
    assert (
        dropping.strategy.ledger.to_dict()["releases"]
        == full.strategy.ledger.to_dict()["releases"][:released]
    )
    assert not np.array_equal(
        dropping.weights, full.weights
    )  # the dropped clients' updates are not in the sum


def test_a_simulated_run_stops_when_secure_aggregation_aborts(tmp_path):
    import json

    from fedsim.report.rows import summary_stop

    result = _run(0.9, tmp_path / "run")
    assert result.stopped_by == "secagg_aborted" and len(result.rows) < 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary_stop(summary)["stopped_by"] == "secagg_aborted"
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert len(ledger["releases"]) == len(result.rows)  # an aborted round is not released, so not accounted
