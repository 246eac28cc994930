"""DP-FTRL tree aggregation: the streaming tree noise and its sensitivity under a participation schedule.

Tree aggregation (Kairouz et al. 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling",
arXiv:2103.00039) puts a binary tree over the rounds: node ``(level d, index i)`` covers rounds
``[i 2^d, (i + 1) 2^d)`` and holds the sum of those rounds' clipped updates plus an independent Gaussian draw,
released once the node is **complete** (its last round, ``(i + 1) 2^d - 1``, has happened). The prefix sum after
``t`` rounds is estimated from the complete nodes:

* ``"standard"``: the sum of the ``popcount(t)`` nodes of the dyadic decomposition of ``[0, t)`` (one node per set
  bit of ``t``);
* ``"honaker"``: each complete node's variance-reduced estimate from its own subtree (Honaker 2015, "Efficient
  use of differentially private binary trees", online form as in TensorFlow Privacy's ``EfficientTreeAggregator``):
  ``B = draw + (B_left + B_right) / 2`` bottom-up, scaled by ``1 / (2 - 2^-d)``, the minimum-variance unbiased
  combination of the node's draw and its children's estimates when every node has the same standard deviation
  (variance ``sigma^2 / (2 - 2^-d)`` at level ``d``), summed over the same decomposition. Online: a node's
  estimate uses its subtree only, as its ancestors are not complete yet.

Both are post-processing of the same node releases, so :func:`tree_prefix_sensitivity_squared` serves both.

Conventions, as in :mod:`fedsim.round.matrix_factorization`:

* rounds are 0-based, ``0 .. n - 1``; "prefix ``t``" is the first ``t`` rounds, ``[0, t)``;
* ``min_sep`` is the gap ``j - i`` between two rounds one client takes part in (``1``: any rounds), jax_privacy's
  convention; TensorFlow Privacy's ``min_separation`` is ``min_sep - 1``;
* ``k`` caps how many rounds one client takes part in; ``None`` is as many as fit, ``ceil(n / min_sep)``.

:class:`TreeNoise` releases, round after round, the noise fedsim adds to that round's update: the *residual*
``P(t + 1) - P(t)``, where ``P(m)`` is the prefix-sum noise after ``m`` rounds (``P(0) = 0``), so the rounds'
noises add up to the prefix noise. It keeps only the nodes of the current decomposition (``O(log t)`` vectors), and
its :meth:`TreeNoise.state` / :meth:`TreeNoise.load_state` let a checkpoint continue the stream bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .matrix_factorization import Sensitivity, _check_schedule

ESTIMATORS = ("standard", "honaker")
# who takes part together: "cyclic", one round set per group, or a function of n giving them
Pattern = str | Sequence[Iterable[int]] | Callable[[int], Sequence[Iterable[int]]]

# method="auto" runs the exact min-separation dynamic programme when its estimated time (_exact_cost, seconds on
# one core) is at most this, else the per-level bound, flagged inexact.
_EXACT_BUDGET = 1.5
_CHUNK = 1 << 21  # elements per temporary in the max-plus products (16 MiB of float64)


def complete_nodes(t: int) -> list[tuple[int, int]]:
    """The nodes ``(level, index)`` complete after ``t`` rounds, i.e. ``(index + 1) 2^level <= t``, by level then
    index. These are the nodes released by then; ``2 t - popcount(t)`` of them."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"invalid t={t!r}: allowed an integer >= 0 (rounds done)")
    return [(d, i) for d in range(int(t).bit_length()) for i in range(int(t) >> d)]


# --------------------------------------------------------------------------- streaming noise
class TreeNoise:
    """Round after round, the noise of DP-FTRL tree aggregation for a vector of ``size`` numbers.

    ``step(draw)`` is round ``t``'s noise (``t`` counts calls from 0): ``P(t + 1) - P(t)``, the change of the
    prefix noise. ``draw(level, index)`` returns node ``(level, index)``'s Gaussian draw, ``N(0, std^2)`` of shape
    ``[size]``; the caller seeds it (for instance from the node's coordinates), so the stream is a deterministic
    function of the draws. A node is drawn at most once, in the round it completes; the standard estimator draws
    only the one node its prefix sums use each round (the completed node at level ``ctz(t + 1)``: right children
    below it are never part of a decomposition), the Honaker estimator every node that completes, bottom-up.

    Memory: one vector per set bit of the rounds done. :meth:`state` is JSON-able ints and one NumPy array, and
    :meth:`load_state` continues from it exactly: a resumed stream releases bit-identical noise.
    """

    def __init__(self, size: int, estimator: str = "standard") -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"invalid size={size!r}: allowed an integer >= 1 (numbers in the noised vector)")
        if estimator not in ESTIMATORS:
            raise ValueError(f"invalid estimator={estimator!r}: allowed one of {list(ESTIMATORS)}")
        self.size = int(size)
        self.estimator = estimator
        self._steps = 0
        self._nodes = np.zeros((0, self.size))  # one row per set bit of _steps, lowest level first

    def widen(self, size: int) -> None:
        """Grow the vectors to ``size`` numbers, the new ones zero in every node kept (a stream whose draws gain
        coordinates over time, such as a probe fed one unit vector per node)."""
        if size < self.size:
            raise ValueError(f"invalid size={size!r}: a stream widens only (it has {self.size})")
        self._nodes = np.pad(self._nodes, ((0, 0), (0, int(size) - self.size)))
        self.size = int(size)

    @property
    def steps(self) -> int:
        """Rounds done (calls to :meth:`step`)."""
        return self._steps

    def step(self, draw: Callable[[int, int], np.ndarray]) -> np.ndarray:
        """Round ``t``'s noise (``t = self.steps``), drawing the nodes that complete in it."""
        t = self._steps
        # nodes at levels 0..top complete now, and the decomposition's levels 0..top-1 merge into level top
        top = _ctz(t + 1)
        if self.estimator == "standard":
            value = self._draw(draw, top, ((t + 1) >> top) - 1)
            new = value
            old = self._nodes[:top].sum(axis=0)
        else:
            value = self._draw(draw, 0, t)
            for level in range(1, top + 1):  # B = (B_left + B_right) / 2 + the node's draw
                fresh = self._draw(draw, level, ((t + 1) >> level) - 1)
                value = 0.5 * (self._nodes[level - 1] + value) + fresh
            weights = _honaker_weights(top + 1)
            new = weights[top] * value
            old = weights[:top] @ self._nodes[:top]
        self._nodes = np.concatenate([value[None, :], self._nodes[top:]])
        self._steps = t + 1
        return new - old

    def prefix_noise(self) -> np.ndarray:
        """``P(t)``, the noise of the prefix sum after the ``t = self.steps`` rounds done."""
        if self.estimator == "standard":
            return self._nodes.sum(axis=0)
        levels = _set_bits(self._steps)
        return _honaker_weights(max(levels, default=0) + 1)[levels] @ self._nodes

    def state(self) -> dict:
        """What :meth:`load_state` needs to continue the stream: ``estimator``, ``size``, ``steps`` and
        ``nodes``, the decomposition's node values (raw draws for ``"standard"``, Honaker's unweighted ``B`` for
        ``"honaker"``), one row per set bit of ``steps``, lowest level first. A copy."""
        return {
            "estimator": self.estimator,
            "size": self.size,
            "steps": self._steps,
            "nodes": self._nodes.copy(),
        }

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`'s output (same estimator and size)."""
        missing = {"estimator", "size", "steps", "nodes"} - set(state)
        if missing:
            raise ValueError(f"invalid tree noise state: missing {sorted(missing)}")
        if state["estimator"] != self.estimator or state["size"] != self.size:
            raise ValueError(
                f"invalid tree noise state for estimator={state['estimator']!r} size={state['size']!r}: this "
                f"stream is estimator={self.estimator!r} size={self.size}"
            )
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"invalid tree noise state steps={steps!r}: allowed an integer >= 0")
        nodes = np.array(state["nodes"], dtype=np.float64)
        want = (len(_set_bits(int(steps))), self.size)
        if nodes.shape != want:
            raise ValueError(
                f"invalid tree noise state: nodes of shape {nodes.shape}, allowed {want} (one row per set bit of "
                f"steps={steps})"
            )
        self._steps = int(steps)
        self._nodes = nodes

    def _draw(self, draw: Callable[[int, int], np.ndarray], level: int, index: int) -> np.ndarray:
        value = np.asarray(draw(level, index), dtype=np.float64)
        if value.shape != (self.size,):
            raise ValueError(
                f"invalid draw for node (level={level}, index={index}): shape {value.shape}, allowed "
                f"({self.size},)"
            )
        return value


def _honaker_weights(levels: int) -> np.ndarray:
    """``1 / (2 - 2^-d)`` for ``d = 0 .. levels - 1``: the variance, in units of ``std^2``, of Honaker's estimate
    of a level-``d`` node, and the weight that makes ``B_d`` that estimate."""
    return 1.0 / (2.0 - 0.5 ** np.arange(levels))


# --------------------------------------------------------------------------- sensitivity
def tree_prefix_sensitivity_squared(
    n: int,
    min_sep: int = 1,
    k: int | None = None,
    pattern: Pattern | None = None,
    *,
    method: str = "auto",
) -> tuple[np.ndarray, bool]:
    """The squared L2 sensitivity of the tree's releases after each prefix of ``n`` rounds, and whether exact.

    Element ``t - 1`` is ``sens_t^2 = max_u sum_v |u ∩ v|^2`` over the nodes ``v`` complete after ``t`` rounds
    and one client's participation pattern ``u``, each round's update clipped to norm 1 (the node sums are
    non-negative combinations, so the worst case aligns the updates). It is non-decreasing in ``t``; the last
    element is TensorFlow Privacy's ``_max_tree_sensitivity_square_sum(k, min_sep - 1, n)``, which also counts the
    complete nodes of a tree with ``n`` leaves (for ``n`` not a power of two: a full tree per set bit of ``n``).
    For the standard estimator, which only ever uses left children, this is conservative; it is what Kairouz et
    al. (Appendix D) and TensorFlow Privacy account.

    ``pattern=None``: ``u`` is any set of at most ``k`` rounds with pairwise gaps of at least ``min_sep``.
    ``method="auto"`` runs an exact dynamic programme (Appendix D.2 of Kairouz et al., re-derived to give every
    prefix in one pass) when it is estimated to take at most ~1.5 s, else a per-level upper bound; ``"exact"``
    and ``"bound"`` force one. The programme costs about ``min(k, 2^m / min_sep)^2 min_sep^3`` for each level
    ``2^m <= n``, plus ``n k min_sep`` for each level above ``min_sep``: with ``k=None``, ``n = 2000`` is exact
    for ``min_sep < 988`` (under 0.2 s up to ``min_sep = 300``), ``n = 4000`` for ``min_sep < 402``, and
    ``n = 10000`` only with a small ``k``. The bound: at level ``d`` each complete node holds at most
    ``c_d = min(k, ceil(2^d / min_sep))`` participations and all of them together at most
    ``K_d = min(k, ceil(covered / min_sep))``, so the level adds at most
    ``floor(K_d / c_d) c_d^2 + (K_d mod c_d)^2``. Both are exact (every round, every node full) when
    ``min_sep = 1`` and ``k >= n``.

    ``pattern`` fixes the clients' patterns instead: ``"cyclic"`` (``min_sep`` groups, group ``g`` taking rounds
    ``g, g + min_sep, ...``), a sequence of round sets (one per group of clients that take part together), or a
    function of ``n`` returning one. Each group takes part in its first ``k`` rounds (all with ``k=None``); its
    rounds must be in ``[0, n)`` and ``min_sep`` or more apart. Always exact, ``O(groups x n)``.
    """
    _check_schedule(n, min_sep, k)
    if method not in ("auto", "exact", "bound"):
        raise ValueError(f"invalid method={method!r}: allowed 'auto', 'exact' or 'bound'")
    kk = -(-n // min_sep) if k is None else min(int(k), -(-n // min_sep))
    if pattern is not None:
        if method == "bound":
            raise ValueError(
                "invalid method='bound' with a pattern: a fixed pattern is always computed exactly"
            )
        return _pattern_prefix(n, _pattern_groups(n, min_sep, kk, pattern)), True
    if kk == 0:
        return np.zeros(n), True
    if min_sep == 1 and kk >= n:  # every round: every complete node full, the bound is the value
        return _level_bound(n, 1, n), True
    if method == "bound" or (method == "auto" and _exact_cost(n, min_sep, kk) > _EXACT_BUDGET):
        return _level_bound(n, min_sep, kk), False
    return _exact_prefix(n, min_sep, kk), True


def tree_sensitivity(
    n: int,
    min_sep: int = 1,
    k: int | None = None,
    pattern: Pattern | None = None,
) -> Sensitivity:
    """The L2 sensitivity of a whole run of ``n`` rounds of tree aggregation (every node complete by then):
    the square root of :func:`tree_prefix_sensitivity_squared`'s last element, with its exactness."""
    squared, exact = tree_prefix_sensitivity_squared(n, min_sep, k, pattern)
    return Sensitivity(math.sqrt(squared[-1]), exact)


def brute_force_tree_sensitivity_squared(n: int, min_sep: int = 1, k: int | None = None) -> np.ndarray:
    """:func:`tree_prefix_sensitivity_squared` by enumerating every allowed pattern (gaps ``>= min_sep``, at most
    ``k`` rounds) and every complete node. Exponential in ``n``: for tests, ``n <= 20``."""
    _check_schedule(n, min_sep, k)
    if n > 20:
        raise ValueError(f"invalid n={n}: the brute force enumerates every pattern, allowed n <= 20")
    kk = -(-n // min_sep) if k is None else min(int(k), -(-n // min_sep))
    patterns = [()]
    frontier = [()]
    for _ in range(kk):  # grow each pattern by one round at least min_sep after its last
        frontier = [(*p, r) for p in frontier for r in range(p[-1] + min_sep if p else 0, n)]
        patterns += frontier
    u = np.zeros((len(patterns), n))
    for row, rounds in enumerate(patterns):
        u[row, list(rounds)] = 1.0
    nodes = complete_nodes(n)
    member = np.zeros((n, len(nodes)))  # round r is in node v
    released = np.zeros((len(nodes), n))  # node v is complete after prefix t (column t - 1)
    for col, (d, i) in enumerate(nodes):
        member[i << d : (i + 1) << d, col] = 1.0
        released[col, ((i + 1) << d) - 1 :] = 1.0
    return ((u @ member) ** 2 @ released).max(axis=0)


# --------------------------------------------------------------------------- fixed patterns
def _pattern_groups(n: int, min_sep: int, k: int, pattern: Pattern) -> list[np.ndarray]:
    if isinstance(pattern, str):
        if pattern != "cyclic":
            raise ValueError(
                f"invalid pattern={pattern!r}: allowed 'cyclic', a sequence of round sets or a function"
            )
        return [np.arange(g, n, min_sep)[:k] for g in range(min(min_sep, n))]
    groups = pattern(n) if callable(pattern) else pattern
    out = []
    for g, rounds in enumerate(groups):
        rounds = list(rounds)
        odd = [x for x in rounds if isinstance(x, bool) or not isinstance(x, (int, np.integer))]
        if odd:
            raise ValueError(f"invalid pattern group {g}: rounds {odd[:5]!r}, allowed integers")
        r = np.array(sorted(rounds), dtype=np.int64)
        bad = [int(x) for x in r if not 0 <= x < n]
        if bad:
            raise ValueError(f"invalid pattern group {g}: rounds {bad[:5]} outside [0, {n})")
        close = np.flatnonzero(np.diff(r) < min_sep)
        if close.size:
            a, b = int(r[close[0]]), int(r[close[0] + 1])
            raise ValueError(
                f"invalid pattern group {g}: rounds {a} and {b} are {b - a} apart, allowed distinct rounds at "
                f"least min_sep={min_sep} apart"
            )
        out.append(r[:k])
    if not out:
        raise ValueError("invalid pattern: no groups; allowed at least one (possibly empty) round set")
    return out


def _pattern_prefix(n: int, groups: list[np.ndarray]) -> np.ndarray:
    """``max_g sum_{complete v} |u_g ∩ v|^2`` for every prefix: node counts from each group's running count, each
    node's square added in the round it completes; ``O(groups x n)``."""
    best = np.zeros(n)
    for start in range(0, len(groups), 256):  # chunks of groups bound the memory
        chunk = groups[start : start + 256]
        taken = np.zeros((len(chunk), n + 1), dtype=np.int64)
        for row, rounds in enumerate(chunk):
            taken[row, rounds + 1] = 1
        taken = np.cumsum(taken, axis=1)  # taken[:, x]: the group's rounds before x
        added = np.zeros((len(chunk), n))
        for d in range(n.bit_length()):
            ends = np.arange(1, (n >> d) + 1) << d  # node (d, i) ends before round (i + 1) 2^d
            counts = taken[:, ends] - taken[:, ends - (1 << d)]
            added[:, ends - 1] += counts.astype(np.float64) ** 2
        best = np.maximum(best, np.cumsum(added, axis=1).max(axis=0))
    return best


# --------------------------------------------------------------------------- min-separation patterns
def _level_bound(n: int, min_sep: int, k: int) -> np.ndarray:
    """Per level ``d``: at most ``c_d`` participations a node, ``K_d`` on the level's complete nodes together; the
    sum of squares is largest with as many nodes as possible full."""
    t = np.arange(1, n + 1)
    total = np.zeros(n)
    for d in range(n.bit_length()):
        cap = min(k, -(-(1 << d) // min_sep))
        covered = (t >> d) << d
        most = np.minimum(k, -(-covered // min_sep))
        full, rest = np.divmod(most, cap)
        total += full * cap * cap + rest * rest
    return total.astype(np.float64)


def _exact_cost(n: int, s: int, k: int) -> float:
    """Estimated seconds of :func:`_exact_prefix` on one core: its element operations (the block tables' max-plus
    products, then each prefix's extension by a block holding two or more participations) at ~1.5 ns (more for a
    small ``s``: short inner axes), plus ~5 us for each NumPy call in its slack loops and ~10 us for each prefix.
    Calibrated on a 2-core x86 machine; it errs high."""
    ops = calls = 0.0
    for m in range(1, n.bit_length()):
        kp = min(k, -(-(1 << (m - 1)) // s))
        km = min(k, -(-(1 << m) // s))
        if km >= 2:  # both halves non-empty: kp x kp pairs, s^3 each, a call per slack per chunk
            ops += kp * kp * s**3
            calls += s * (1 + kp * kp * s * s // _CHUNK)
        if (1 << m) > s:  # prefixes ending in a level-m block
            prefixes = (n + (1 << m)) >> (m + 1)
            ops += prefixes * km * (k + 1) * s * s
            calls += prefixes * s * (1 + km * (k + 1) * s // _CHUNK)
    return 1.5e-9 * (1 + 8 / s) * ops + 5e-6 * calls + 1e-5 * n


def _exact_prefix(n: int, s: int, k: int) -> np.ndarray:
    """Every prefix's exact value by dynamic programming over the dyadic blocks.

    A full block of ``L = 2^m`` rounds has table ``F_m[c, a, b]``: the largest sum of squared counts over the
    block's nodes for exactly ``c`` participations, the first at offset ``>= a`` and the last at offset
    ``<= L - 1 - b`` (slacks ``a, b`` in ``[0, s - 1]``; more never matters), ``-inf`` if none fits. A block is
    its root (``c^2``) and two half blocks; two non-empty halves need ``b_left + a_right >= s - 1``, and as the
    tables only fall as a slack grows, ``b_left + a_right = s - 1`` is enough (a max-plus product over ``s``
    slacks).

    The complete nodes after ``t`` rounds are the full blocks of ``t``'s dyadic decomposition, so prefix ``t``'s
    table ``G_t[c, b]`` (exactly ``c`` participations, the last at ``<= t - 1 - b``) is ``G_{t - lowbit(t)}``
    extended by one block of ``lowbit(t)`` rounds; a stack keeps the ``O(log n)`` tables still to be extended.
    This is TensorFlow Privacy's ``_tree_sensitivity_square_sum`` recursion (its ``start``/``end`` are the
    slacks) arranged to share the work across prefixes.
    """
    tables = _block_tables(n.bit_length() - 1, s, k)
    out = np.empty(n)
    start = np.full((k + 1, s), -np.inf)
    start[0] = 0.0
    stack = [(0, start)]
    for t in range(1, n + 1):
        low = t & -t
        while stack[-1][0] != t - low:
            stack.pop()
        g = _extend(stack[-1][1], tables[low.bit_length() - 1], low, s, k)
        out[t - 1] = g[:, 0].max()
        stack.append((t, g))
    return out


def _block_tables(top: int, s: int, k: int) -> list[np.ndarray]:
    """``F_m`` for ``m = 0 .. top``, each of shape ``(min(k, ceil(2^m / s)) + 1, s, s)``; ``F_m[0] = 0``."""
    leaf = np.full((min(k, 1) + 1, s, s), -np.inf)
    leaf[0] = 0.0
    leaf[1:, 0, 0] = 1.0
    tables = [leaf]
    for m in range(1, top + 1):
        prev = tables[-1]
        kp = prev.shape[0] - 1
        km = min(k, -(-(1 << m) // s))
        shifted = np.maximum(np.arange(s) - (1 << (m - 1)), 0)  # a slack of the block, seen by its far half
        table = np.full((km + 1, s, s), -np.inf)
        table[0] = 0.0
        one = min(km, kp)  # one half empty: the other holds them all
        table[1 : one + 1] = np.maximum(prev[1 : one + 1][:, shifted, :], prev[1 : one + 1][:, :, shifted])
        if km >= 2:  # both halves: left c1 with end slack j, right c2 with start slack s - 1 - j
            right = prev[1:, ::-1, :]
            rows = max(1, _CHUNK // (kp * s * s))
            for r in range(0, kp, rows):
                left = prev[1 + r : 1 + min(r + rows, kp)]
                both = np.full((left.shape[0], kp, s, s), -np.inf)
                for j in range(s):
                    np.maximum(both, left[:, None, :, j, None] + right[None, :, j, None, :], out=both)
                counts = _antidiagonal_max(both)[: max(0, km - 1 - r)]  # row i: c = i + r + 2
                table[r + 2 : r + 2 + counts.shape[0]] = np.maximum(
                    table[r + 2 : r + 2 + counts.shape[0]], counts
                )
        table[1:] += (np.arange(1, km + 1) ** 2)[:, None, None]
        tables.append(table)
    return tables


def _extend(g: np.ndarray, table: np.ndarray, length: int, s: int, k: int) -> np.ndarray:
    """Prefix table ``g`` extended by one full block of ``length`` rounds with block table ``table``."""
    slack = np.arange(s)
    if length <= s:  # the block holds at most one participation, anywhere in it: it adds its depth + 1
        out = g[:, np.maximum(slack - length, 0)]  # block empty
        fits = slack <= length - 1  # one participation at offset <= length - 1 - b and >= s - 1 - j
        out[1:, fits] = np.maximum(
            out[1:, fits], g[:-1, s - length + slack[fits]] + float(length.bit_length())
        )
        return out
    out = np.repeat(g[:, :1], s, axis=1)  # block empty: the last participation is >= length > b rounds back
    km = min(table.shape[0] - 1, k)
    rows = max(1, _CHUNK // ((k + 1) * s))
    for r in range(0, km, rows):  # c2 = r + 1 .. in the block, after c1 before it, first at offset >= a
        block = table[1 + r : 1 + min(r + rows, km)]
        cand = np.full((block.shape[0], k + 1, s), -np.inf)
        for a in range(s):
            np.maximum(cand, g[None, :, s - 1 - a, None] + block[:, None, a, :], out=cand)
        counts = _antidiagonal_max(cand)[: k - r]  # row i: c = i + r + 1
        out[r + 1 : r + 1 + counts.shape[0]] = np.maximum(out[r + 1 : r + 1 + counts.shape[0]], counts)
    return out


def _antidiagonal_max(x: np.ndarray) -> np.ndarray:
    """``y[c] = max_{p + q = c} x[p, q]`` (further axes carried along), by shearing: each row padded by
    ``-inf`` to width ``q + p`` and the flat array re-read with rows one shorter puts ``x[p, q]`` at column
    ``p + q``."""
    p, q = x.shape[:2]
    rest = x.shape[2:]
    padded = np.full((p, q + p, *rest), -np.inf)
    padded[:, :q] = x
    sheared = padded.reshape(p * (q + p), *rest)[: p * (q + p - 1)].reshape(p, q + p - 1, *rest)
    return sheared.max(axis=0)


# --------------------------------------------------------------------------- helpers
def _ctz(x: int) -> int:
    return (x & -x).bit_length() - 1


def _set_bits(x: int) -> list[int]:
    return [d for d in range(x.bit_length()) if x >> d & 1]


__all__ = [
    "TreeNoise",
    "brute_force_tree_sensitivity_squared",
    "complete_nodes",
    "tree_prefix_sensitivity_squared",
    "tree_sensitivity",
]
