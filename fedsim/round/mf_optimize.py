"""Optimised Toeplitz strategies for matrix-factorization noise: banded and buffered-linear-Toeplitz (BLT).

The mechanisms of :mod:`fedsim.round.matrix_factorization` release the prefix sums ``A x`` of the rounds'
clipped updates with noise ``A C^{-1} z`` (``A``: all ones on and below the diagonal; ``C``: the ``n x n``
lower-triangular Toeplitz strategy; ``z`` i.i.d. Gaussian, scaled by the noise multiplier times the
sensitivity of ``C``). At equal privacy, the expected squared error of the released prefix sums is
proportional to

    loss(C) = sens(C)^2 * err(C),
    err(C) = ||A C^{-1}||_F^2 / n  ("mean")  or  max_t ||(A C^{-1})_t||^2  ("max"),

the objective of Choquette-Choo et al. 2023 (amplified banded matrix factorization, arXiv:2306.08153, Sec. 4)
and of McMahan et al. 2024 (BLT, arXiv:2408.08868; the Toeplitz sensitivity of arXiv:2405.13763, Theorem 2),
here restricted to Toeplitz strategies. It is invariant to rescaling ``C``, so every strategy here has
``c_0 = 1``.

* :func:`prefix_error` and :func:`loss` evaluate it for given Toeplitz coefficients (NumPy,
  ``O(n * len(coef))``: the first column of ``C^{-1}`` is the impulse response of the recursive filter
  ``1 / c(x)``);
* :func:`optimal_banded_toeplitz` minimises it over banded strategies (``bands`` coefficients), starting from
  the truncated square root of Fichtenberger, Henzinger and Upadhyay (fedsim's choice without an optimiser);
* :func:`optimal_blt` minimises it over BLT strategies with a few buffers (Dvijotham et al. 2024; McMahan et
  al. 2024), whose noise :class:`~fedsim.round.matrix_factorization.BLTNoise` generates in ``O(buffers)`` a
  round;
* :func:`relative_loss` compares a strategy with the dense square root ``prefix_sum_sqrt_coefficients(n)``,
  the optimal Toeplitz strategy for ``"max"`` error under single participation and a good one in general
  (under many participations, or for ``"mean"`` error, a BLT or banded strategy can beat it).

Both optimisers keep the coefficients positive and non-increasing, which makes the ``O(n)`` Toeplitz
sensitivity formula exact (arXiv:2405.13763, Theorem 2) and, by the Enestrom-Kakeya argument (``(1 - x) c(x)``
has no zero in the open unit disk), keeps ``C^{-1}`` free of exponentially growing terms. The objective is
minimised in ``log`` form with L-BFGS (torch, float64, strong-Wolfe line search); its gradient with respect to
the Toeplitz coefficients is the adjoint of the triangular solve, computed with two recursive filters and one
FFT correlation, so one evaluation costs ``O(n (bands + log n))`` (banded) or ``O(n (buffers + log n))`` (BLT)
rather than the ``O(n^2)`` of a dense solve. Results are cached per arguments and are deterministic.

torch and scipy are imported inside the functions that need them: importing this module stays cheap.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Literal

import numpy as np

from fedsim.round.matrix_factorization import (
    BLT,
    max_participations,
    prefix_sum_sqrt_coefficients,
    toeplitz_sensitivity,
)

if TYPE_CHECKING:
    import torch

ErrorKind = Literal["mean", "max"]
_KINDS = ("mean", "max")

# L-BFGS budget: iterations of one ``step`` call, and the history it keeps. The objective is smooth and
# low-dimensional (at most a few dozen parameters); these converge every case the tests and the table cover.
_MAX_ITERATIONS = 400
_HISTORY = 20


# --------------------------------------------------------------------------- the objective
def prefix_error(coef: np.ndarray, n: int, kind: ErrorKind = "mean") -> float:
    """The squared error of the ``n`` prefix-sum estimates per unit of noise, for the lower-triangular
    Toeplitz strategy whose first column is ``coef`` (``c_0 > 0``; zero-padded or cut to ``n``).

    With ``d`` the first column of ``C^{-1}`` (``d_0 = 1 / c_0``, ``d_t = -(sum_{j=1}^t c_j d_{t-j}) / c_0``)
    and ``e = cumsum(d)`` the first column of ``A C^{-1}`` (itself lower-triangular Toeplitz), row ``t`` of
    ``A C^{-1}`` has squared norm ``sum_{j <= t} e_j^2``. ``"mean"`` averages it over the rows,
    ``sum_j (n - j) e_j^2 / n``; ``"max"`` takes the last row, ``sum_j e_j^2``.
    """
    _check_n(n)
    _check_kind(kind)
    c = _check_coefficients(coef)[:n]
    e = np.cumsum(_inverse_first_column(np.ones(1), c, n))
    return float(_error_weights(n, kind) @ (e * e))


def loss(
    coef: np.ndarray | BLT,
    n: int,
    min_sep: int = 1,
    k: int | None = None,
    kind: ErrorKind = "mean",
) -> float:
    """``sens^2 * prefix_error``: the total squared error of the released prefix sums at equal privacy, for a
    client taking part at most ``k`` times (``None``: as often as fits), ``min_sep`` or more rounds apart.

    This is the objective of Choquette-Choo et al. 2023 (arXiv:2306.08153) and McMahan et al. 2024
    (arXiv:2408.08868) restricted to Toeplitz strategies; it does not change when ``coef`` is rescaled.
    ``coef`` is a strategy's first column or a :class:`BLT`. The sensitivity is
    :func:`~fedsim.round.matrix_factorization.toeplitz_sensitivity`: exact for non-negative, non-increasing
    coefficients, an upper bound otherwise (then so is the loss).
    """
    c = _coefficients(coef, n)
    sens = toeplitz_sensitivity(c, n, min_sep, k).value
    return sens * sens * prefix_error(c, n, kind)


def relative_loss(
    coef_or_blt: np.ndarray | BLT,
    n: int,
    min_sep: int = 1,
    k: int | None = None,
    kind: ErrorKind = "mean",
) -> float:
    """:func:`loss` of a strategy divided by that of the dense square root ``prefix_sum_sqrt_coefficients(n)``
    (Fichtenberger, Henzinger and Upadhyay 2023), the reference a banded or BLT strategy approximates: above 1
    the strategy is that factor worse; below 1 it beats the reference (possible for ``"mean"`` error or under
    multiple participation, where the square root is not optimal)."""
    if max_participations(n, min_sep, k) == 0:
        raise ValueError(f"invalid max_participations={k!r}: allowed >= 1 or None (a zero sensitivity)")
    return loss(coef_or_blt, n, min_sep, k, kind) / loss(prefix_sum_sqrt_coefficients(n), n, min_sep, k, kind)


# --------------------------------------------------------------------------- optimisers
def optimal_banded_toeplitz(
    n: int, bands: int, min_sep: int = 1, k: int | None = None, kind: ErrorKind = "mean"
) -> np.ndarray:
    """The ``bands`` coefficients (``c_0 = 1``) of the banded Toeplitz strategy minimising :func:`loss` among
    those with non-negative, non-increasing coefficients, where the sensitivity formula is exact: the banded
    Toeplitz strategy of Choquette-Choo et al. 2023 (arXiv:2306.08153; its amplified setting takes
    ``bands <= min_sep``) with the sensitivity of arXiv:2405.13763, Theorem 2.

    Parametrised as ``c_j = c_{j-1} * sigmoid(a_j)``, initialised at the truncated square root
    ``prefix_sum_sqrt_coefficients(bands)``, and never returns a strategy worse than it. Cached per
    arguments."""
    _check_n(n)
    if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)) or not 1 <= bands <= n:
        raise ValueError(f"invalid bands={bands!r}: allowed an integer with 1 <= bands <= n={n}")
    _check_kind(kind)
    _check_participates(n, min_sep, k)
    return np.array(_optimal_banded_cached(int(n), int(bands), int(min_sep), k, kind))


def optimal_blt(
    n: int, buffers: int, min_sep: int = 1, k: int | None = None, kind: ErrorKind = "mean"
) -> BLT:
    """The :class:`BLT` strategy with ``buffers`` buffers minimising :func:`loss` (McMahan et al. 2024,
    arXiv:2408.08868, Sec. 4, here with the exact Toeplitz sensitivity of arXiv:2405.13763, Theorem 2).

    Its Toeplitz coefficients are ``c_0 = 1``, ``c_j = sum_i w_i d_i^(j-1)``; the search keeps the decays
    ``d_i`` in ``(0, 1)``, the output scales ``w_i > 0`` and ``sum_i w_i < 1``, so the coefficients are
    positive and non-increasing and the sensitivity is exact. Deterministic starts: decays ``1 - n^(-s_i)``
    for exponents ``s_i`` spread over ``(0, 1]`` with scales summing to ``1/2`` (the square root's ``c_1``),
    and the optimum with one buffer fewer, its largest buffer split in two (the same strategy, so the loss
    never grows with ``buffers``). The best is returned in canonical order (decays descending).

    Positive scales make the coefficients a completely monotone sequence; under many participations the
    optimum in this class can be a single geometric decay, and extra buffers then merge into it (equal
    decays). ``buffers = 0`` is the identity strategy (independent noise). Cached per arguments."""
    _check_n(n)
    if isinstance(buffers, bool) or not isinstance(buffers, (int, np.integer)) or buffers < 0:
        raise ValueError(f"invalid buffers={buffers!r}: allowed an integer >= 0")
    _check_kind(kind)
    _check_participates(n, min_sep, k)
    return _optimal_blt_cached(int(n), int(buffers), int(min_sep), k, kind)


@functools.lru_cache(maxsize=128)
def _optimal_banded_cached(
    n: int, bands: int, min_sep: int, k: int | None, kind: ErrorKind
) -> tuple[float, ...]:
    if bands == 1:
        return (1.0,)
    import torch

    k_eff = max_participations(n, min_sep, k)
    weights = _error_weights(n, kind)
    init = prefix_sum_sqrt_coefficients(bands)
    ratios = init[1:] / init[:-1]  # (2j - 1) / (2j), in (0, 1)
    logits = torch.tensor(np.log(ratios / (1.0 - ratios)), dtype=torch.float64, requires_grad=True)

    def coefficients(a: torch.Tensor) -> torch.Tensor:
        one = torch.ones(1, dtype=torch.float64)
        return torch.cat([one, torch.cumprod(torch.sigmoid(a), 0)])

    def objective(a: torch.Tensor) -> torch.Tensor:
        c = coefficients(a)
        error = _prefix_error_op(c, weights, None, None)
        return torch.log(_sensitivity_squared(c, n, min_sep, k_eff)) + torch.log(error)

    best = _minimise(objective, logits)
    with torch.no_grad():
        return tuple(float(v) for v in coefficients(best))


@functools.lru_cache(maxsize=128)
def _optimal_blt_cached(n: int, buffers: int, min_sep: int, k: int | None, kind: ErrorKind) -> BLT:
    if buffers == 0:
        return BLT((), ())
    import torch

    k_eff = max_participations(n, min_sep, k)
    weights = _error_weights(n, kind)
    lags = torch.arange(n - 1, dtype=torch.float64)

    def blt_parameters(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        decays = torch.sigmoid(p[:buffers])
        # softmax over the scales and a slack: w_i > 0 and sum w_i < 1 (c_1 <= c_0, non-increasing)
        scales = torch.softmax(torch.cat([p[buffers:], torch.zeros(1, dtype=torch.float64)]), 0)[:buffers]
        return decays, scales

    def objective(p: torch.Tensor) -> torch.Tensor:
        decays, scales = blt_parameters(p)
        tail = scales @ torch.pow(decays[:, None], lags[None, :])
        c = torch.cat([torch.ones(1, dtype=torch.float64), tail])
        num, den = _blt_inverse_filter(decays.detach().numpy(), scales.detach().numpy())
        error = _prefix_error_op(c, weights, num, den)
        return torch.log(_sensitivity_squared(c, n, min_sep, k_eff)) + torch.log(error)

    starts = _blt_starts(n, buffers)
    if buffers > 1:  # one buffer fewer, its largest-scale buffer split in two: the same C, so never worse
        fewer = _optimal_blt_cached(n, buffers - 1, min_sep, k, kind)
        decays, scales = np.array(fewer.decays), np.array(fewer.output_scales)
        split = int(np.argmax(scales))
        scales[split] /= 2
        starts.append(_blt_unconstrained(np.append(decays, decays[split]), np.append(scales, scales[split])))
    best_value, best_params = math.inf, None
    for start in starts:
        params = _minimise(objective, torch.tensor(start, dtype=torch.float64, requires_grad=True))
        with torch.no_grad():
            value = float(objective(params))
        if value < best_value:
            best_value, best_params = value, params
    with torch.no_grad():
        decays, scales = (t.numpy().copy() for t in blt_parameters(best_params))
    decays = np.minimum(decays, np.nextafter(1.0, 0.0))  # a sigmoid may round to 1.0; BLT wants [0, 1)
    order = np.argsort(-decays, kind="stable")
    return BLT(tuple(float(v) for v in decays[order]), tuple(float(v) for v in scales[order]))


def _blt_starts(n: int, buffers: int) -> list[np.ndarray]:
    """Deterministic starting points in the unconstrained parameters: decays ``1 - n^(-s_i)`` for exponents
    ``s_i`` spread evenly over ``[1/2, 1]`` and over ``[1/buffers, 1]`` (memory lengths from a few rounds to
    ``n``), equal scales summing to ``1/2`` (the square root's ``c_1``)."""
    starts = []
    for low in (0.5, 1.0 / buffers):
        exponents = np.linspace(low, 1.0, buffers) if buffers > 1 else np.array([low])
        decays = np.clip(1.0 - float(n) ** -exponents, 0.05, 1.0 - 1e-9)
        starts.append(_blt_unconstrained(decays, np.full(buffers, 0.5 / buffers)))
    unique = []
    for s in starts:
        if not any(np.allclose(s, u) for u in unique):
            unique.append(s)
    return unique


def _blt_unconstrained(decays: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The unconstrained parameters of a BLT: the decays' logits, then ``log(w_i / (1 - sum w))``. Decays and
    scales that underflowed to 0 are taken at the smallest positive value (a change far below rounding)."""
    tiny = np.finfo(np.float64).tiny
    decays = np.clip(decays, tiny, 1.0 - np.finfo(np.float64).eps)
    scales = np.maximum(scales, tiny)
    return np.concatenate([np.log(decays) - np.log1p(-decays), np.log(scales) - np.log1p(-scales.sum())])


def _minimise(objective, start: torch.Tensor) -> torch.Tensor:
    """L-BFGS with a strong-Wolfe line search from ``start``; returns the best parameters evaluated (so never
    worse than the start), detached."""
    import torch

    best = {"value": math.inf, "params": start.detach().clone()}
    optimiser = torch.optim.LBFGS(
        [start],
        lr=1.0,
        max_iter=_MAX_ITERATIONS,
        max_eval=_MAX_ITERATIONS * 5 // 4,
        history_size=_HISTORY,
        tolerance_grad=1e-9,
        tolerance_change=1e-13,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        value = objective(start)
        if not torch.isfinite(value):  # a line-search probe off the cliff: reject it, steer back
            return torch.tensor(math.inf, dtype=torch.float64)
        value.backward()
        if value.item() < best["value"]:
            best["value"], best["params"] = value.item(), start.detach().clone()
        return value

    optimiser.step(closure)
    return best["params"]


# --------------------------------------------------------------------------- differentiable pieces
def _sensitivity_squared(c: torch.Tensor, n: int, min_sep: int, k: int) -> torch.Tensor:
    """``sum_t (sum_{m < k} c_{t - m min_sep})^2`` (the client at rounds ``0, min_sep, ...``), in ``O(n)`` and
    differentiable: the coefficients, zero-padded to a multiple of ``min_sep`` and laid out ``min_sep`` to a
    row, summed down each column over windows of ``k`` rows. Equals ``toeplitz_sensitivity(c, n, min_sep,
    k).value ** 2`` for non-negative, non-increasing ``c``; with ``len(c) <= min_sep`` it is the sum of the
    ``k`` participations' column norms, ``k ||c||^2`` when none is cut by the horizon."""
    import torch

    rows = -(-n // min_sep)
    c = c[:n]
    padding = torch.zeros(rows * min_sep - c.shape[0], dtype=c.dtype)
    padded = torch.cat([c, padding]).reshape(rows, min_sep)
    cumulative = torch.cumsum(padded, 0)
    if k < rows:
        cumulative = cumulative - torch.cat([torch.zeros(k, min_sep, dtype=c.dtype), cumulative[:-k]])
    return (cumulative.reshape(-1)[:n] ** 2).sum()


def _prefix_error_op(c: torch.Tensor, weights: np.ndarray, num: np.ndarray | None, den: np.ndarray | None):
    """``prefix_error`` as a torch op of the Toeplitz coefficients ``c``, with its adjoint gradient.
    ``C^{-1}`` is the recursive filter ``num / den`` (``None``: ``1 / c``, from a banded strategy's own
    coefficients)."""
    return _prefix_error_function().apply(c, weights, num, den)


@functools.cache
def _prefix_error_function():
    import torch

    class PrefixError(torch.autograd.Function):
        @staticmethod
        def forward(ctx, c, weights, num, den):
            coef = c.detach().numpy()
            if den is None:
                num, den = np.ones(1), coef
            value, grad = _prefix_error_and_gradient(num, den, weights, coef.size)
            ctx.save_for_backward(torch.from_numpy(grad))
            return c.new_tensor(value)

        @staticmethod
        def backward(ctx, grad_output):
            (grad,) = ctx.saved_tensors
            return grad_output * grad, None, None, None

    return PrefixError


def _prefix_error_and_gradient(
    num: np.ndarray, den: np.ndarray, weights: np.ndarray, m: int
) -> tuple[float, np.ndarray]:
    """``err = sum_j w_j e_j^2`` (``e = cumsum(d)``, ``d = T^{-1} e_0``, ``T^{-1}`` the filter ``num / den``)
    and its gradient with respect to the first ``m`` Toeplitz coefficients of ``T``.

    With ``g = dErr/dd = L^T (2 w e)`` (a reversed cumulative sum) and the adjoint ``lam = T^{-T} g``,
    ``dErr/dc_j = -sum_{i >= j} lam_i d_{i-j}``. A lower-triangular Toeplitz matrix is persymmetric
    (``T^T = J T J``, ``J`` the reversal), so ``T^{-T} g`` is the same filter run backwards in time."""
    from scipy.signal import fftconvolve

    n = weights.size
    d = _inverse_first_column(num, den, n)
    e = np.cumsum(d)
    value = float(weights @ (e * e))
    g = np.cumsum((2.0 * weights * e)[::-1])[::-1]
    lam = _apply_filter(num, den, g[::-1])[::-1]
    # sum_{i >= j} lam_i d_{i-j} = (reverse(lam) * d)[n - 1 - j]
    correlation = fftconvolve(lam[::-1], d)[:n][::-1]
    return value, -correlation[:m]


def _blt_inverse_filter(decays: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``C^{-1}`` of a BLT as a recursive filter: ``c(x) = 1 + x sum_i w_i / (1 - d_i x) = P(x) / Q(x)`` with
    ``Q(x) = prod_i (1 - d_i x)`` and ``P = Q + x sum_i w_i prod_{j != i} (1 - d_j x)``, so ``C^{-1}`` is the
    filter ``Q / P`` (coefficients in ascending powers of ``x``)."""
    q = np.poly(decays)  # ascending coefficients of prod (1 - d_i x)
    p = q.copy()
    for i, w in enumerate(scales):
        p[1:] += w * np.poly(np.delete(decays, i))
    return q, p


def _inverse_first_column(num: np.ndarray, den: np.ndarray, n: int) -> np.ndarray:
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return _apply_filter(num, den, impulse)


def _apply_filter(num: np.ndarray, den: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``T^{-1} x`` for the lower-triangular Toeplitz ``T`` with generating function ``den / num``: the causal
    filter ``sum_j den_j y_{t-j} = sum_j num_j x_{t-j}`` (forward substitution, in C)."""
    from scipy.signal import lfilter

    return lfilter(num, den, x)


# --------------------------------------------------------------------------- checks and helpers
def _error_weights(n: int, kind: ErrorKind) -> np.ndarray:
    if kind == "max":
        return np.ones(n)
    return (n - np.arange(n, dtype=np.float64)) / n


def _coefficients(strategy: np.ndarray | BLT, n: int) -> np.ndarray:
    _check_n(n)
    if isinstance(strategy, BLT):
        return strategy.toeplitz_coefficients(n)
    return _check_coefficients(strategy)[:n]


def _check_coefficients(coef: np.ndarray) -> np.ndarray:
    c = np.asarray(coef, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)) or c[0] <= 0:
        raise ValueError(
            f"invalid strategy coefficients {np.ravel(c).tolist()[:8]}: allowed a non-empty 1-D array of "
            "finite numbers, the first one > 0"
        )
    return c


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"invalid n={n!r}: allowed an integer >= 1 (the number of rounds)")


def _check_kind(kind: str) -> None:
    if kind not in _KINDS:
        raise ValueError(f"invalid kind={kind!r}: allowed 'mean' (average over rounds) or 'max' (last round)")


def _check_participates(n: int, min_sep: int, k: int | None) -> None:
    if max_participations(n, min_sep, k) == 0:
        raise ValueError(f"invalid max_participations={k!r}: allowed >= 1 or None (nothing to optimise at 0)")
