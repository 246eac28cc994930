"""Matrix-factorization building blocks: strategy matrices and their sensitivity under a participation schedule.

DP-FTRL and its successors (tree aggregation, Kairouz et al. 2021; banded matrix factorization, Choquette-Choo et al.
2023; buffered-linear-Toeplitz noise, Dvijotham et al. 2024) release the prefix sums ``A x`` of the rounds' clipped
updates ``x`` as ``B (C x + z)`` with ``A = B C``: round ``t``'s noise is ``(C^{-1} z)_t``, correlated across rounds,
with ``z`` i.i.d. Gaussian. Its privacy depends on ``C`` and on how often one client can take part: the
**sensitivity** is the largest ``||C u||_2`` over the participation vectors ``u`` (one client's rounds, each clipped
to norm 1) that the schedule allows.

Conventions, as in jax_privacy's ``matrix_factorization`` (the test vectors come from there):

* ``C`` is lower triangular ``n x n`` (one row and one column per round);
* ``min_sep`` is the gap ``j - i`` between two rounds one client takes part in (``1``: any rounds; a ``cyclic``
  schedule of ``b`` groups is ``min_sep = b``); ``max_participations`` (``k``) caps how many, and defaults to the
  most the gap allows, ``ceil(n / min_sep)``.

Exact for the cases the mechanisms use: a ``C`` whose columns ``min_sep`` or more apart are orthogonal (a banded
``C`` with at most ``min_sep`` bands; then the worst client takes the ``k`` largest feasible squared column norms);
a lower-triangular Toeplitz ``C`` with non-negative, non-increasing coefficients (the worst client takes part at
rounds ``0, b, 2b, ...``; Theorem 2 of arXiv:2405.13763). Otherwise an upper bound (over-reporting epsilon, never
under), which :class:`Sensitivity` says. :func:`brute_force_sensitivity` enumerates every allowed pattern, for
tests on small ``n``.

The noise itself is generated a round at a time: :class:`ToeplitzNoise` for a banded Toeplitz strategy (the last
``b - 1`` outputs kept) and :class:`BLTNoise` for a buffered-linear-Toeplitz one (its buffers kept), each turning
the round's fresh Gaussian draw into ``(C^{-1} z)_t``. These are the building blocks of the ``tree``,
``banded-mf`` and ``blt`` mechanisms; the mechanisms themselves (a ``NoiseSource`` each, the ``cyclic`` schedule
and their ledger entries) are not wired into the strategies yet.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sensitivity:
    """The L2 sensitivity of a strategy matrix under a schedule, and whether it is exact or an upper bound."""

    value: float
    exact: bool


def max_participations(n: int, min_sep: int, k: int | None = None) -> int:
    """The most rounds of ``n`` one client can take part in with gaps of at least ``min_sep``, capped at ``k``."""
    _check_schedule(n, min_sep, k)
    most = -(-n // min_sep)
    return most if k is None else min(k, most)


def max_participation_sum(x: np.ndarray, min_sep: int = 1, k: int | None = None) -> float:
    """``max sum_{i in u} x_i`` over index sets ``u`` with gaps of at least ``min_sep`` and at most ``k`` elements
    (Algorithm 3, VecSens, of Choquette-Choo et al. 2023): dynamic programming in ``O(n k)``. Negative entries are
    never worth taking, so the value is at least 0."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if n == 0:
        return 0.0
    k = max_participations(n, min_sep, k)
    # best[i]: the most a pattern within rounds i.. can collect, with the participations used so far
    best = np.zeros(n + min_sep)
    for _ in range(k):
        take = np.concatenate([x + best[min_sep:], np.zeros(min_sep)])
        best = np.maximum.accumulate(np.maximum(take, 0.0)[::-1])[::-1]
    return float(best[0])


def sensitivity(c: np.ndarray, min_sep: int = 1, k: int | None = None) -> Sensitivity:
    """The L2 sensitivity of strategy ``c`` when one client takes part at most ``k`` times, ``min_sep`` rounds
    apart. Exact when columns ``min_sep`` or more apart are orthogonal; otherwise the bound of jax_privacy's
    ``get_min_sep_sensitivity_upper_bound`` (the pattern sum applied to each row of ``|C^T C|``, then to the
    rows' results), which holds for any ``c``."""
    c = _square(c)
    n = c.shape[0]
    k = max_participations(n, min_sep, k)
    gram = c.T @ c
    far = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) >= min_sep
    if not np.any(gram[far]):
        return Sensitivity(math.sqrt(max_participation_sum(np.diag(gram), min_sep, k)), True)
    rows = np.array([max_participation_sum(np.abs(row), min_sep, k) for row in gram])
    return Sensitivity(math.sqrt(max_participation_sum(rows, min_sep, k)), False)


def brute_force_sensitivity(c: np.ndarray, min_sep: int = 1, k: int | None = None) -> float:
    """``max ||C u||_2`` over every participation pattern the schedule allows, for a ``C`` whose Gram matrix
    ``C^T C`` is non-negative (then the worst case has every participating round's update the same unit vector).
    Exponential in ``n``: for tests."""
    c = _square(c)
    if np.any(c.T @ c < 0):
        raise ValueError("brute_force_sensitivity needs a non-negative Gram matrix C^T C")
    n = c.shape[0]
    k = max_participations(n, min_sep, k)
    best = 0.0
    for size in range(1, k + 1):
        for rounds in itertools.combinations(range(n), size):
            if all(b - a >= min_sep for a, b in itertools.pairwise(rounds)):
                best = max(best, float(np.linalg.norm(c[:, list(rounds)].sum(axis=1))))
    return best


# --------------------------------------------------------------------------- Toeplitz strategies
def prefix_sum_sqrt_coefficients(n: int) -> np.ndarray:
    """The first ``n`` coefficients of ``(1 - x)^(-1/2)``: ``c_0 = 1``, ``c_j = c_{j-1} (2j - 1) / (2j)``. The
    lower-triangular Toeplitz matrix they define is the square root of the prefix-sum workload (``C @ C`` is all
    ones on and below the diagonal): the optimal Toeplitz strategy of Fichtenberger, Henzinger and Upadhyay (2023),
    and, truncated to ``b`` of them, the banded strategy fedsim uses without an optimiser."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"invalid n={n!r}: allowed an integer >= 0")
    j = np.arange(1, n, dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])[:n]


def toeplitz(coefficients: np.ndarray, n: int) -> np.ndarray:
    """The ``n x n`` lower-triangular Toeplitz matrix with first column ``coefficients`` (zero-padded or cut)."""
    coef = np.zeros(n)
    given = np.asarray(coefficients, dtype=np.float64)[:n]
    coef[: given.size] = given
    lags = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lags >= 0, coef[np.clip(lags, 0, None)], 0.0)


def toeplitz_sensitivity(
    coefficients: np.ndarray, n: int, min_sep: int = 1, k: int | None = None
) -> Sensitivity:
    """The sensitivity of ``toeplitz(coefficients, n)`` in ``O(n)``: ``sens^2 = sum_t (sum_{m < k} c_{t - m b})^2``,
    the client taking part at rounds ``0, b, ..., (k - 1) b``. Exact for non-negative, non-increasing
    coefficients; others are first raised to their smallest non-increasing majorant (``max_{j' >= j} |c_j'|``),
    which makes the value an upper bound."""
    _check_schedule(n, min_sep, k)
    raw = np.abs(np.asarray(coefficients, dtype=np.float64))[:n]
    coef = np.maximum.accumulate(raw[::-1])[::-1]  # the non-increasing majorant
    exact = bool(np.array_equal(coef, np.asarray(coefficients, dtype=np.float64)[:n]))
    k = max_participations(n, min_sep, k)
    padded = np.zeros(n)
    padded[: coef.size] = coef
    total = np.zeros(n)
    for m in range(k):  # the client's m-th participation, at round m * min_sep
        total[m * min_sep :] += padded[: n - m * min_sep]
    return Sensitivity(float(np.sqrt(total @ total)), exact)


def toeplitz_prefix_sensitivity_squared(
    coefficients: np.ndarray, n: int, min_sep: int = 1, k: int | None = None
) -> tuple[np.ndarray, bool]:
    """The squared sensitivity of the first ``t`` rounds' releases, for every ``t = 1..n``, of the Toeplitz strategy
    ``coefficients``: ``out[t-1] = sum_{r < t} (sum_{m < k} c_{r - m b})^2`` (rows ``r < t`` involve rounds ``< t``
    only, and the worst client, at rounds ``0, b, 2b, ...``, is the same for every prefix). Exact for non-negative,
    non-increasing coefficients, an upper bound (their majorant) otherwise, as :func:`toeplitz_sensitivity`; its
    last value equals that function's square. ``O(n k)``."""
    _check_schedule(n, min_sep, k)
    given = np.asarray(coefficients, dtype=np.float64)[:n]
    coef = np.maximum.accumulate(np.abs(given)[::-1])[::-1]
    exact = bool(np.array_equal(coef, given))
    padded = np.zeros(n)
    padded[: coef.size] = coef
    total = np.zeros(n)
    for m in range(max_participations(n, min_sep, k)):
        total[m * min_sep :] += padded[: n - m * min_sep]
    return np.cumsum(total * total), exact


# --------------------------------------------------------------------------- streaming noise
class ToeplitzNoise:
    """Round after round, the noise ``(C^{-1} z)_t`` of a lower-triangular Toeplitz strategy with ``b``
    coefficients ``c`` (``c_0 > 0``), from each round's fresh draw ``z_t``: ``x_t = (z_t - sum_{j=1}^{b-1} c_j
    x_{t-j}) / c_0`` (forward substitution, as jax_privacy's ``toeplitz.inverse_as_streaming_matrix``). It keeps the
    last ``b - 1`` outputs: ``O(b x size)`` memory and time a round, however many rounds run. One coefficient is
    independent noise scaled by ``1 / c_0``."""

    def __init__(self, coefficients: np.ndarray, size: int) -> None:
        coef = np.asarray(coefficients, dtype=np.float64)
        if coef.ndim != 1 or coef.size == 0 or not np.all(np.isfinite(coef)) or coef[0] <= 0:
            raise ValueError(
                f"invalid strategy coefficients {coef.tolist()[:8]}: allowed finite numbers, the first one > 0"
            )
        self.coefficients = coef
        # a ring of the last b - 1 outputs: x_{t-1} at row _head, x_{t-2} at the row before it, ... (written in
        # place: no copy of the whole buffer each round)
        self.size = int(size)
        self._ring = np.zeros((coef.size - 1, self.size))
        self._head = -1

    @property
    def past(self) -> np.ndarray:
        """The last ``b - 1`` outputs, most recent first (``past[0] = x_{t-1}``): a copy, for checkpoints."""
        lags = self._ring.shape[0]
        return self._ring[(self._head - np.arange(lags)) % lags] if lags else self._ring.copy()

    @past.setter
    def past(self, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.float64)
        if value.shape != self._ring.shape:
            raise ValueError(f"invalid past outputs of shape {value.shape}: allowed {self._ring.shape}")
        self._ring = value.copy()
        self._head = 0

    def state(self) -> dict:
        """The ring of past outputs and its head, as they are (a resumed stream then sums in the same order: its
        noise is bit-identical)."""
        return {"ring": self._ring.copy(), "head": int(self._head)}

    def load_state(self, state: dict) -> None:
        ring = np.asarray(state["ring"], dtype=np.float64)
        if ring.shape != self._ring.shape:
            raise ValueError(f"invalid ring of shape {ring.shape}: allowed {self._ring.shape}")
        self._ring, self._head = ring.copy(), int(state["head"])

    def step(self, z: np.ndarray) -> np.ndarray:
        """This round's noise from this round's draw ``z`` (shape ``[size]``)."""
        lags = self._ring.shape[0]
        if not lags:
            return np.asarray(z, dtype=np.float64) / self.coefficients[0]
        # ring row r holds x_{t-1-((head - r) mod lags)}: its coefficient is c_{1 + (head - r) mod lags}
        order = self.coefficients[1 + (self._head - np.arange(lags)) % lags]
        x = (np.asarray(z, dtype=np.float64) - order @ self._ring) / self.coefficients[0]
        self._head = (self._head + 1) % lags
        self._ring[self._head] = x
        return x


@dataclass(frozen=True)
class BLT:
    """A buffered-linear-Toeplitz strategy (Dvijotham et al. 2024): Toeplitz coefficients ``1`` and, at lag
    ``j >= 1``, ``sum_i output_scales[i] * decays[i]^(j - 1)``; ``len(decays)`` buffers."""

    decays: tuple[float, ...]
    output_scales: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.decays) != len(self.output_scales) or not all(0 <= d < 1 for d in self.decays):
            raise ValueError(
                f"invalid BLT decays={self.decays} output_scales={self.output_scales}: allowed as many scales as "
                "decays, each decay in [0, 1)"
            )

    def toeplitz_coefficients(self, n: int) -> np.ndarray:
        lags = np.arange(max(n - 1, 0), dtype=np.float64)
        tail = np.asarray(self.output_scales) @ np.power.outer(np.asarray(self.decays), lags)
        return np.concatenate([[1.0], np.atleast_1d(tail)])[:n]

    def sensitivity_squared(self, n: int) -> float:
        """One participation in ``n`` rounds, in closed form (Lemma 5.3 of arXiv:2404.16706): the squared norm of
        the first column, ``1 + sum_{i,j} w_i w_j (1 - (d_i d_j)^(n-1)) / (1 - d_i d_j)``."""
        d, w = np.asarray(self.decays), np.asarray(self.output_scales)
        dd = np.multiply.outer(d, d)
        return float(1.0 + np.sum(np.multiply.outer(w, w) * (1.0 - dd ** (n - 1)) / (1.0 - dd)))


class BLTNoise:
    """Round after round, the noise ``(C^{-1} z)_t`` of a :class:`BLT` strategy: ``x_t = z_t - sum_i w_i s_i``,
    then ``s_i <- d_i s_i + x_t`` (Algorithm 3 of arXiv:2408.08868): ``O(buffers x size)`` memory and time a
    round, however many rounds run."""

    def __init__(self, blt: BLT, size: int) -> None:
        self.blt = blt
        self.buffers = np.zeros((len(blt.decays), int(size)))

    def step(self, z: np.ndarray) -> np.ndarray:
        x = np.asarray(z, dtype=np.float64) - np.asarray(self.blt.output_scales) @ self.buffers
        self.buffers = np.asarray(self.blt.decays)[:, None] * self.buffers + x
        return x


# --------------------------------------------------------------------------- checks
def _check_schedule(n: int, min_sep: int, k: int | None) -> None:
    for name, value, low in (("n", n, 1), ("min_sep", min_sep, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"invalid {name}={value!r}: allowed an integer >= {low}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
        raise ValueError(
            f"invalid max_participations={k!r}: allowed an integer >= 0 or None (as many as fit)"
        )


def _square(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] == 0:
        raise ValueError(f"a strategy matrix is square, one row and column per round: got shape {c.shape}")
    return c
