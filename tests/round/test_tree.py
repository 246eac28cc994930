"""DP-FTRL tree aggregation (fedsim/privacy/tree.py): the streaming tree noise and its sensitivity.

Published vectors: TensorFlow Privacy (tensorflow/privacy, tensorflow_privacy/privacy/dp_query/tree_aggregation_test.py
for the Honaker estimator's ``EfficientTreeAggregator``, tensorflow_privacy/privacy/analysis/
tree_aggregation_accountant_test.py for ``_max_tree_sensitivity_square_sum(max_participation, min_separation, steps)``,
whose ``min_separation`` is fedsim's ``min_sep - 1``). Besides them the sensitivity is checked against a brute-force
maximum over every pattern, a port of TensorFlow Privacy's own recursion, the per-level bound and the cyclic schedule
(an allowed pattern, so never above the maximum); the noise against its covariance derived from the node structure.
"""

from __future__ import annotations

import functools
import io
import json
import math

import numpy as np
import pytest

from fedsim.round.matrix_factorization import Sensitivity
from fedsim.round.tree import (
    TreeNoise,
    brute_force_tree_sensitivity_squared,
    complete_nodes,
    tree_prefix_sensitivity_squared,
    tree_sensitivity,
)


def _ones(size: int = 1, value: float = 1.0):
    return lambda level, index: np.full(size, value)


def _seeded(size: int, seed: int = 0):
    """Node (level, index)'s draw from its own generator: what a caller does so a resumed run draws the same."""
    return lambda level, index: np.random.default_rng([seed, level, index]).standard_normal(size)


def _prefixes(noise: TreeNoise, draw, steps: int) -> np.ndarray:
    """The prefix noise after each of ``steps`` rounds, as the running sum of the rounds' noise."""
    return np.cumsum([noise.step(draw) for _ in range(steps)], axis=0)


# --------------------------------------------------------------------------- the tree
def test_complete_nodes():
    assert complete_nodes(0) == []
    assert complete_nodes(1) == [(0, 0)]
    assert complete_nodes(3) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert complete_nodes(4) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    for t in range(40):
        nodes = complete_nodes(t)
        assert len(nodes) == 2 * t - bin(t).count("1")
        assert all((i + 1) << d <= t for d, i in nodes)


# --------------------------------------------------------------------------- the noise
def test_standard_estimator_sums_the_decomposition():
    """With every node's draw 1, the prefix noise after t rounds is popcount(t), one node per set bit."""
    noise = TreeNoise(1)
    got = _prefixes(noise, _ones(), 19)[:, 0]
    np.testing.assert_array_equal(got[:8], [1, 1, 2, 1, 2, 2, 3, 1])
    assert got[16] == 2 and got[18] == 3
    np.testing.assert_array_equal(got, [bin(t).count("1") for t in range(1, 20)])
    assert noise.prefix_noise()[0] == 3


@pytest.mark.parametrize(
    ("steps", "want", "value"),
    [
        (1, 1.0, 1.0),
        (2, 4 / 3, 1.0),
        (3, 4 / 3 + 1, 1.0),
        (4, 12 / 7, 1.0),
        (5, 12 / 7 + 1, 1.0),
        (6, 12 / 7 + 4 / 3, 1.0),
        (7, 12 / 7 + 4 / 3 + 1, 1.0),
        (8, 32 / 15, 1.0),
        (1024, 11 / (2 - 0.5**10), 1.0),
        (1025, 11 / (2 - 0.5**10) + 1, 1.0),
        (1026, 11 / (2 - 0.5**10) + 4 / 3, 1.0),
        (1027, 11 / (2 - 0.5**10) + 4 / 3 + 1, 1.0),
        (1028, (11 / (2 - 0.5**10) + 12 / 7) * 0.5, 0.5),
        (1029, (11 / (2 - 0.5**10) + 12 / 7 + 1) * 2, 2.0),
    ],
)
def test_honaker_estimator_matches_tensorflow_privacy(steps, want, value):
    """EfficientTreeAggregatorTest.test_tree_sum_last_step_expected: every node's value ``value``."""
    noise = TreeNoise(2, "honaker")
    got = _prefixes(noise, _ones(2, value), steps)[-1]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(noise.prefix_noise(), want, rtol=1e-12)


@pytest.mark.parametrize("estimator", ["standard", "honaker"])
def test_each_node_is_drawn_once_when_it_completes_and_the_state_stays_logarithmic(estimator):
    seen: set[tuple[int, int]] = set()
    noise = TreeNoise(3, estimator)

    def draw(level, index):
        assert (level, index) not in seen
        assert (index + 1) << level == noise.steps + 1, "drawn in the round it completes"
        seen.add((level, index))
        return np.zeros(3)

    for t in range(100):
        noise.step(draw)
        assert noise.state()["nodes"].shape == (bin(t + 1).count("1"), 3)
    if estimator == "honaker":
        assert seen == set(complete_nodes(100))
    else:  # one node a round, the decomposition's new one: exactly the left children (even index)
        assert seen == {(d, i) for d, i in complete_nodes(100) if i % 2 == 0} and len(seen) == 100


@pytest.mark.parametrize("estimator", ["standard", "honaker"])
def test_a_resumed_stream_releases_bit_identical_noise(estimator):
    size, total, cut = 5, 45, 23
    draw = _seeded(size, seed=7)
    straight = TreeNoise(size, estimator)
    want = np.stack([straight.step(draw) for _ in range(total)])

    first = TreeNoise(size, estimator)
    head = [first.step(draw) for _ in range(cut)]
    state = first.state()
    saved = json.dumps({key: value for key, value in state.items() if key != "nodes"})
    buffer = io.BytesIO()
    np.save(buffer, state["nodes"])
    buffer.seek(0)
    resumed = TreeNoise(size, estimator)
    resumed.load_state({**json.loads(saved), "nodes": np.load(buffer)})
    assert resumed.steps == cut
    tail = [resumed.step(draw) for _ in range(total - cut)]
    np.testing.assert_array_equal(np.stack(head + tail), want)
    np.testing.assert_array_equal(resumed.prefix_noise(), straight.prefix_noise())


def _prefix_maps(n: int) -> dict[str, np.ndarray]:
    """``P(m) = A[m] @ z`` for ``m = 0..n`` over the draws ``z`` of ``complete_nodes(n)``, from the tree alone:
    the standard estimator sums the dyadic decomposition's draws; Honaker's estimate of a node is the
    inverse-variance combination of its draw (variance 1) and its children's estimates (variance ``2 V_{d-1}``)."""
    nodes = complete_nodes(n)
    column = {node: j for j, node in enumerate(nodes)}
    variance = [1.0]
    estimate: dict[tuple[int, int], np.ndarray] = {}
    for d, i in nodes:  # by level: children first
        own = np.eye(len(nodes))[column[d, i]]
        if d == 0:
            estimate[d, i] = own
            continue
        children = estimate[d - 1, 2 * i] + estimate[d - 1, 2 * i + 1]
        if len(variance) <= d:
            variance.append(1 / (1 + 1 / (2 * variance[d - 1])))
        estimate[d, i] = variance[d] * (own + children / (2 * variance[d - 1]))
    maps = {"standard": np.zeros((n + 1, len(nodes))), "honaker": np.zeros((n + 1, len(nodes)))}
    for m in range(1, n + 1):
        for d in range(m.bit_length()):
            if m >> d & 1:
                node = (d, (m >> d) - 1)
                maps["standard"][m, column[node]] += 1
                maps["honaker"][m] += estimate[node]
    return maps


def test_the_analytic_prefix_variances():
    maps = _prefix_maps(8)
    np.testing.assert_allclose(np.sum(maps["standard"] ** 2, axis=1), [bin(m).count("1") for m in range(9)])
    honaker = np.sum(maps["honaker"] ** 2, axis=1)
    assert honaker[8] == pytest.approx(8 / 15) and honaker[4] == pytest.approx(4 / 7)
    assert honaker[2] == pytest.approx(2 / 3) and honaker[1] == pytest.approx(1.0)


@pytest.mark.parametrize("estimator", ["standard", "honaker"])
def test_the_rounds_noise_has_the_trees_covariance(estimator):
    """50,000 coordinates of one stream are 50,000 independent size-1 streams (each node's draw is i.i.d. per
    coordinate). The empirical covariance of the 8 rounds' noise matches ``D A A^T D^T`` (``A`` the prefix map,
    ``D`` the differencing) within 5 standard errors per entry, ``sqrt((S_ii S_jj + S_ij^2) / N)``."""
    n, size = 8, 50_000
    rng = np.random.default_rng(3)
    noise = TreeNoise(size, estimator)
    rounds = np.stack([noise.step(lambda level, index: rng.standard_normal(size)) for _ in range(n)])
    residual = np.diff(_prefix_maps(n)[estimator], axis=0)
    want = residual @ residual.T
    got = rounds @ rounds.T / size
    error = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / size)
    assert np.all(np.abs(got - want) <= 5 * error), np.max(np.abs(got - want) / error)


# --------------------------------------------------------------------------- the sensitivity
def _tfp(max_participation: int, min_separation: int, steps: int) -> float:
    """TensorFlow Privacy's ``_max_tree_sensitivity_square_sum``, in its convention."""
    return tree_prefix_sensitivity_squared(steps, min_separation + 1, max_participation)[0][-1]


@pytest.mark.parametrize(
    ("max_participation", "min_separation", "steps", "want"),
    [(1, 7, 8, 4), (3, 3, 9, 11), (3, 2, 7, 9), (8, 2, 24, 88)],  # the last: the worst case beats greedy
)
def test_tensorflow_privacy_toy_vectors(max_participation, min_separation, steps, want):
    assert _tfp(max_participation, min_separation, steps) == want
    assert _tfp_max(max_participation, min_separation, steps) == want  # the port below, on its own vectors


@pytest.mark.parametrize("steps", [3, 8, 11, 19])
def test_tensorflow_privacy_every_step_vectors(steps):
    """Every round: a full tree per set bit of ``steps`` (levels d), each adding 2^d (2^(d+1) - 1); twice: the two
    rounds side by side in the deepest full subtree, 2 + 4 floor(log2 steps)."""
    want = sum(2**d * (2 ** (d + 1) - 1) for d in range(steps.bit_length()) if steps >> d & 1)
    assert _tfp(steps, 0, steps) == want
    assert _tfp(2, 0, steps) == 2 + 4 * (steps.bit_length() - 1)


@pytest.mark.parametrize("max_participation", [11, 19, 200])
def test_tensorflow_privacy_more_participations_than_steps(max_participation):
    assert _tfp(max_participation, 0, 8) == 120


# TensorFlow Privacy's recursion (tree_aggregation_accountant.py, Apache-2.0), ported as it is: one prefix at a time.
@functools.cache
def _tfp_tree_sum(num: int, min_separation: int, start: int, end: int, size: int) -> float:
    if start + (min_separation + 1) * num > size + end:
        return -math.inf
    if num == 0:
        return 0.0
    if num == 1 and size == 1:
        return 1.0
    power = math.floor(math.log2(size))
    total = 0.0
    if 2**power == size:
        total, power = num**2, power - 1
    best = -math.inf
    for i in range(num + 1):
        for j in range(min_separation + 1):
            left = _tfp_tree_sum(num - i, min_separation, start, j, 2**power)
            if left > -math.inf:
                best = max(best, left + _tfp_tree_sum(i, min_separation, j, end, size - 2**power))
    return total + best


def _tfp_max(max_participation: int, min_separation: int, steps: int) -> float:
    num = max_participation
    while (min_separation + 1) * num > steps + min_separation:
        num -= 1
    return max(_tfp_tree_sum(p, min_separation, 0, min_separation, steps) for p in range(num + 1))


def test_every_prefix_equals_tensorflow_privacys_recursion():
    for min_sep, k in [(1, 3), (1, 6), (2, None), (2, 4), (3, None), (3, 2), (4, 5), (7, None), (7, 2)]:
        got, exact = tree_prefix_sensitivity_squared(40, min_sep, k)
        assert exact
        want = [_tfp_max(40 if k is None else k, min_sep - 1, t) for t in range(1, 41)]
        np.testing.assert_array_equal(got, want, err_msg=f"min_sep={min_sep} k={k}")


def test_exact_equals_the_brute_force_and_the_bound_and_the_cyclic_schedule_bracket_it():
    for n in range(1, 13):
        for min_sep in range(1, n + 2):
            for k in (None, 1, 2, 3, 5):
                want = brute_force_tree_sensitivity_squared(n, min_sep, k)
                got, exact = tree_prefix_sensitivity_squared(n, min_sep, k)
                assert exact
                np.testing.assert_array_equal(got, want, err_msg=f"n={n} min_sep={min_sep} k={k}")
                bound, _ = tree_prefix_sensitivity_squared(n, min_sep, k, method="bound")
                assert np.all(bound >= want)
                cyclic, exact = tree_prefix_sensitivity_squared(n, min_sep, k, pattern="cyclic")
                assert exact and np.all(cyclic <= want)


def test_a_fixed_pattern_is_its_own_sum_of_squares():
    """For one group the value is computed from the nodes directly; several groups give the largest; a group takes
    part in its first k rounds; a callable is called with n."""
    n = 13

    def direct(rounds, t):
        return sum(sum((i << d) <= r < (i + 1) << d for r in rounds) ** 2 for d, i in complete_nodes(t))

    for rounds in ([0, 2, 4, 6], [1, 5, 6, 12], [3], []):
        want = [direct(rounds, t) for t in range(1, n + 1)]
        got, exact = tree_prefix_sensitivity_squared(n, pattern=[rounds])
        assert exact
        np.testing.assert_array_equal(got, want)
    groups = [[0, 2, 4, 6], [1, 5, 6, 12]]
    both = tree_prefix_sensitivity_squared(n, pattern=groups)[0]
    single = [tree_prefix_sensitivity_squared(n, pattern=[g])[0] for g in groups]
    np.testing.assert_array_equal(both, np.maximum(*single))
    np.testing.assert_array_equal(tree_prefix_sensitivity_squared(n, pattern=lambda m: groups)[0], both)
    np.testing.assert_array_equal(
        tree_prefix_sensitivity_squared(n, k=2, pattern=groups)[0],
        tree_prefix_sensitivity_squared(n, pattern=[[0, 2], [1, 5]])[0],
    )
    cyclic = tree_prefix_sensitivity_squared(n, 3, pattern="cyclic")[0]
    np.testing.assert_array_equal(
        cyclic, tree_prefix_sensitivity_squared(n, 3, pattern=[range(g, n, 3) for g in range(3)])[0]
    )


@pytest.mark.parametrize(("min_sep", "want"), [(1, 2_791_984), (2, 698_496), (10, 28_689), (100, 425)])
def test_two_thousand_rounds_are_exact_and_fast(min_sep, want):
    """The sizes fedsim runs: exact in well under a second each. The values are this code's (a regression
    check), bracketed by the cyclic schedule and the per-level bound; min_sep = 1 is the all-rounds closed form."""
    got, exact = tree_prefix_sensitivity_squared(2000, min_sep)
    assert exact and got[-1] == want
    assert np.all(np.diff(got) >= 0)
    cyclic = tree_prefix_sensitivity_squared(2000, min_sep, pattern="cyclic")[0]
    bound = tree_prefix_sensitivity_squared(2000, min_sep, method="bound")[0]
    assert np.all(cyclic <= got) and np.all(got <= bound)
    assert tree_sensitivity(2000, min_sep) == Sensitivity(math.sqrt(want), True)


def test_the_worst_case_is_not_always_cyclic_and_a_costly_schedule_is_bounded():
    got, exact = tree_prefix_sensitivity_squared(2000, 100, 5)
    assert exact and got[-1] == 107
    assert tree_prefix_sensitivity_squared(2000, 100, 5, pattern="cyclic")[0][-1] == 105
    bounded, exact = tree_prefix_sensitivity_squared(2000, 1000)  # the exact programme would take seconds
    assert not exact
    assert np.all(bounded >= tree_prefix_sensitivity_squared(2000, 1000, pattern="cyclic")[0])
    assert tree_sensitivity(2000, 1000) == Sensitivity(math.sqrt(bounded[-1]), False)


def test_exact_is_never_above_the_bound_on_random_schedules():
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(13, 300))
        min_sep = int(rng.integers(1, 40))
        k = None if rng.random() < 0.4 else int(rng.integers(0, 30))
        got, exact = tree_prefix_sensitivity_squared(n, min_sep, k)
        bound, _ = tree_prefix_sensitivity_squared(n, min_sep, k, method="bound")
        cyclic, _ = tree_prefix_sensitivity_squared(n, min_sep, k, pattern="cyclic")
        assert exact and np.all(cyclic <= got) and np.all(got <= bound) and np.all(np.diff(got) >= 0)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tree_prefix_sensitivity_squared(0), "invalid n=0"),
        (lambda: tree_prefix_sensitivity_squared(8, 0), "invalid min_sep=0"),
        (lambda: tree_prefix_sensitivity_squared(8, 1, -1), "invalid max_participations=-1"),
        (lambda: tree_prefix_sensitivity_squared(8, method="fast"), "invalid method='fast'"),
        (lambda: tree_prefix_sensitivity_squared(8, pattern="random"), "invalid pattern='random'"),
        (lambda: tree_prefix_sensitivity_squared(8, pattern=[[0, 8]]), r"group 0: rounds \[8\] outside"),
        (
            lambda: tree_prefix_sensitivity_squared(8, pattern=[[0.5]]),
            r"group 0: rounds \[0.5\], allowed integers",
        ),
        (
            lambda: tree_prefix_sensitivity_squared(8, 2, pattern=[[0, 4], [1, 2]]),
            "group 1: rounds 1 and 2 are 1",
        ),
        (lambda: tree_prefix_sensitivity_squared(8, pattern=[]), "no groups"),
        (
            lambda: tree_prefix_sensitivity_squared(8, pattern="cyclic", method="bound"),
            "always computed exactly",
        ),
        (lambda: brute_force_tree_sensitivity_squared(21), "invalid n=21"),
        (lambda: complete_nodes(-1), "invalid t=-1"),
        (lambda: TreeNoise(0), "invalid size=0"),
        (lambda: TreeNoise(2, "naive"), "invalid estimator='naive'"),
        (lambda: TreeNoise(2).step(_ones(3)), r"node \(level=0, index=0\): shape \(3,\), allowed \(2,\)"),
        (
            lambda: TreeNoise(2).load_state(TreeNoise(2, "honaker").state()),
            "this stream is estimator='standard'",
        ),
        (lambda: TreeNoise(2).load_state({"steps": 3}), r"missing \['estimator', 'nodes', 'size'\]"),
        (
            lambda: TreeNoise(2).load_state(
                {"estimator": "standard", "size": 2, "steps": 3, "nodes": np.zeros((1, 2))}
            ),
            r"nodes of shape \(1, 2\), allowed \(2, 2\)",
        ),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
