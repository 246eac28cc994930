"""Noise correlated across rounds: the matrix-factorization mechanisms of DP-FTRL, as noise sources.

Each releases, in round ``t``, the model update's noise ``(C^{-1} z)_t`` for a lower-triangular strategy matrix
``C`` and i.i.d. Gaussian draws ``z_t`` (std ``noise_multiplier * clip``, drawn exactly as independent noise draws
them: from ``(seed, round)``, or the operating system's entropy in deployment). Summed over rounds, the noise on
the model is ``A C^{-1} z`` for the prefix-sum workload ``A``, much smaller than independent noise's ``A z`` at the
same privacy when one client takes part rarely. The privacy meaning is the sensitivity of ``C`` under the
participation schedule (:mod:`fedsim.round.matrix_factorization`, :mod:`fedsim.round.tree`), which the
strategy records per round (:class:`fedsim.privacy.ScheduledGaussian`).

=========  ======================================================================  ===========================
name       strategy ``C``                                                           per round, memory and time
=========  ======================================================================  ===========================
tree       binary-tree aggregation (Kairouz et al. 2021), the standard or the        ``O(log T x model)``
           Honaker estimator
banded-mf  banded lower-triangular Toeplitz, ``bands`` coefficients optimised for    ``O(bands x model)``
           the run's rounds and schedule (Choquette-Choo et al. 2023; McMahan et
           al. 2024)
blt        buffered-linear-Toeplitz (Dvijotham et al. 2024), ``buffers`` decays      ``O(buffers x model)``
           and scales optimised likewise
=========  ======================================================================  ===========================

Their state (the last outputs, the buffers, the tree's open nodes, the chosen coefficients and the round reached) is
in :meth:`NoiseSource.extra_state`, so a checkpoint resumes the exact same noise. Only the model update's noise
(purpose ``"model"``) is correlated; a strategy that releases anything else per round (adaptive clipping's count,
agnostic FL's losses) or splits the noise into client shares is refused with these mechanisms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedsim.validation import PrivacyInputError

from .noise import NoiseSource, register_noise_source
from .randomness import STREAM_NOISE, STREAM_TREE_NODE

#: the error measure the strategies are optimised for: the mean over rounds of the prefix sums' squared error
OBJECTIVE = "mean"


@dataclass
class CorrelatedNoise(NoiseSource):
    """A noise source whose model-update noise combines earlier rounds' draws (see the module). Subclasses build the
    per-round stream (:meth:`_new_stream`) and give the strategy's sensitivity."""

    # what it releases, declared (fedsim.round.noise): Gaussian draws combined across rounds by the server, for the
    # model update alone, accounted over the participation schedule; the papers' closed forms do not describe it
    correlated: ClassVar[bool] = True
    noise_kind: ClassVar[str] = "gaussian"
    placements: ClassVar[tuple[str, ...]] = ("central",)
    paper_bounds: ClassVar[bool] = False
    single_release: ClassVar[bool] = True
    #: what this mechanism optimises for the run's planned rounds before round 1 (:meth:`prepare`, kept in a
    #: checkpoint), so that a run extended past them would not be the longer run from scratch (the resume refusal
    #: names it); None: nothing, the run extends. A subclass says which: by default its strategy may depend on them
    fixed_for_rounds: ClassVar[str | None] = (
        "its strategy (NoiseSource.prepare may depend on the rounds planned)"
    )

    def dp_release(self, round_: int, release: Any, schedule: Any | None = None) -> Any:
        """Round ``round_``'s :class:`fedsim.privacy.ScheduledGaussian`: its share of the sensitivity of the
        released prefix under the run's schedule (``schedule``, which this mechanism needs)."""
        if schedule is None:
            raise ValueError(
                f"the {self.name} mechanism is accounted over its participation schedule: give the run's "
                "ScheduleAccounting"
            )
        return super().dp_release(round_, release, schedule)

    #: the run's number of rounds, which the strategy matrix is optimised for (None: the unoptimised choice)
    rounds: int | None = None
    _stream: Any = field(default=None, init=False, repr=False)
    _last_round: int = field(default=0, init=False, repr=False)
    _std: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rounds is not None and (
            isinstance(self.rounds, bool) or not isinstance(self.rounds, (int, np.integer)) or self.rounds < 1
        ):
            raise PrivacyInputError(
                "rounds", self.rounds, "must be an integer >= 1 (the run's rounds) or None"
            )

    # ------------------------------------------------------------------ the stream
    def _new_stream(self, size: int) -> Any:
        raise NotImplementedError

    def noise(
        self, round_: int, purpose: str, size: int | None, std: Any, *, client: int | None = None
    ) -> Any:
        if purpose != "model":
            return super().noise(round_, purpose, size, std, client=client)
        if size is None or client is not None or np.ndim(std) != 0:
            raise ValueError(f"the {self.name} mechanism correlates the central model-update noise only")
        if round_ != self._last_round + 1:
            raise ValueError(
                f"the {self.name} mechanism's noise of round {round_} was asked after round {self._last_round}: "
                "correlated noise is drawn once a round, in order (resume from a checkpoint to continue a run)"
            )
        std = float(std)
        if self._std is not None and not math.isclose(std, self._std, rel_tol=1e-12, abs_tol=0.0):
            raise ValueError(
                f"the {self.name} mechanism's noise std changed from {self._std} to {std} in round {round_}: its "
                "accounting assumes one std for the whole run (adaptive clipping is refused with it)"
            )
        self._std = std
        self._last_round = int(round_)
        if not std > 0:
            return np.zeros(size)
        if self._stream is None:
            self._stream = self._new_stream(int(size))
        return self._step(int(round_), int(size), std)

    def added_std(self, round_: int, std: float) -> float:
        """The std of round ``round_``'s added noise: ``std`` times the norm of the row of ``C^{-1}`` (or of the
        tree's combination of node draws) that forms it, from a probe stream of the same mechanism that is fed
        unit draws instead of Gaussian ones (:meth:`_next_factor`). Not part of the state: a resumed run rebuilds
        it."""
        return float(std) * self._added_factor(int(round_))

    def _added_factor(self, round_: int) -> float:
        factors = self.__dict__.setdefault("_factors", [])
        while len(factors) < round_:
            factors.append(self._next_factor(len(factors) + 1))
        return factors[round_ - 1]

    def _next_factor(self, round_: int) -> float:
        """The norm of the combination of fresh draws that round ``round_``'s noise is, asked in order. A
        time-invariant stream (banded Toeplitz, BLT): ``sqrt(sum_{j < t} g_j^2)`` with ``g`` the stream's response
        to one unit draw in round 1, from a one-number probe stream."""
        probe = self.__dict__.get("_probe")
        if probe is None:
            probe = self.__dict__["_probe"] = [self._new_stream(1), 0.0]
        g = float(probe[0].step(np.array([1.0 if round_ == 1 else 0.0]))[0])
        probe[1] += g * g
        return math.sqrt(probe[1])

    def _step(self, round_: int, size: int, std: float) -> np.ndarray:
        """Round ``round_``'s noise from its fresh draw ``z_t`` (``N(0, std^2)``, the independent noise's stream)."""
        return self._stream.step(self.rng(round_, STREAM_NOISE).normal(0.0, std, size=size))

    # ------------------------------------------------------------------ state
    def _stream_state(self) -> dict[str, Any]:
        return {}

    def _load_stream_state(self, state: dict[str, Any], size: int) -> None:
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"last_round": self._last_round, "std": self._std}
        if self._stream is not None:
            out["size"] = int(self._stream_size())
            out.update(self._stream_state())
        return out

    def _stream_size(self) -> int:
        raise NotImplementedError

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._last_round = int(state.get("last_round", 0))
        self._std = None if state.get("std") is None else float(state["std"])
        self._stream = None
        if state.get("size") is not None:
            self._load_stream_state(state, int(state["size"]))


def _sequence(value: Any, name: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64).ravel()
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        raise PrivacyInputError(name, value, "must be a non-empty list of finite numbers")
    return tuple(float(v) for v in arr)


@dataclass
class BandedMatrixFactorization(CorrelatedNoise):
    """``banded-mf``: a banded lower-triangular Toeplitz strategy with ``bands`` coefficients (``c_0 = 1``),
    optimised for the run's rounds and schedule among non-negative, non-increasing coefficients (where its
    sensitivity is exact): :func:`fedsim.round.mf_optimize.optimal_banded_toeplitz`. Without the run's rounds the
    coefficients are the square root of the prefix-sum workload cut to ``bands`` (Fichtenberger, Henzinger and
    Upadhyay 2023). ``bands`` defaults to the schedule's ``min_separation``: then one client's participations touch
    disjoint rounds' releases, and a cyclic schedule with sampling within its groups is accounted with
    amplification (Choquette-Choo et al. 2023). One band is independent noise, exactly."""

    fixed_for_rounds: ClassVar[str | None] = (
        "its banded Toeplitz coefficients (privacy.mechanism.bands of them)"
    )
    name = "banded-mf"
    aliases: ClassVar[tuple[str, ...]] = ()
    bands: int | None = None
    coefficients: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bands is not None and (
            isinstance(self.bands, bool) or not isinstance(self.bands, (int, np.integer)) or self.bands < 1
        ):
            raise PrivacyInputError("bands", self.bands, "must be an integer >= 1")
        self.coefficients = _sequence(self.coefficients, "coefficients")
        if self.coefficients is not None:
            if self.coefficients[0] <= 0:
                raise PrivacyInputError("coefficients", self.coefficients, "the first must be > 0")
            if self.bands is not None and self.bands != len(self.coefficients):
                raise PrivacyInputError(
                    "bands", self.bands, f"must equal the number of coefficients ({len(self.coefficients)})"
                )
            self.bands = len(self.coefficients)

    def prepare(self, rounds: int | None, min_sep: int, k: int | None) -> None:
        if self.coefficients is not None:
            return
        rounds = self.rounds if rounds is None else rounds
        bands = int(self.bands or min_sep)
        if rounds is not None:
            bands = min(bands, int(rounds))
            from .mf_optimize import optimal_banded_toeplitz

            coef = optimal_banded_toeplitz(int(rounds), bands, min_sep, k, kind=OBJECTIVE)
        else:
            from .matrix_factorization import prefix_sum_sqrt_coefficients

            coef = prefix_sum_sqrt_coefficients(bands)
        self.bands = bands
        self.coefficients = tuple(float(c) for c in np.asarray(coef, dtype=np.float64))

    def _coef(self) -> np.ndarray:
        if self.coefficients is None:
            raise ValueError(
                "banded-mf: prepare(rounds, min_sep, k) fixes the coefficients before the first round"
            )
        return np.asarray(self.coefficients, dtype=np.float64)

    def _new_stream(self, size: int) -> Any:
        from .matrix_factorization import ToeplitzNoise

        return ToeplitzNoise(self._coef(), size)

    def _stream_size(self) -> int:
        return int(self._stream.size)

    def _stream_state(self) -> dict[str, Any]:
        state = self._stream.state()
        return {"past": state["ring"], "past_head": state["head"]}

    def _load_stream_state(self, state: dict[str, Any], size: int) -> None:
        stream = self._new_stream(size)
        stream.load_state({"ring": state["past"], "head": state["past_head"]})
        self._stream = stream

    def extra_state(self) -> dict[str, Any]:
        return {
            **super().extra_state(),
            "coefficients": None if self.coefficients is None else list(self.coefficients),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("coefficients") is not None:
            self.coefficients = tuple(float(c) for c in state["coefficients"])
            self.bands = len(self.coefficients)
        super().load_extra_state(state)

    def prefix_sensitivity_squared(
        self, n: int, min_sep: int, k: int | None, cyclic: bool = False
    ) -> tuple[np.ndarray, bool]:
        # the worst pattern (rounds 0, b, 2b, ...) is a cyclic group's: the same value either way
        from .matrix_factorization import toeplitz_prefix_sensitivity_squared

        return toeplitz_prefix_sensitivity_squared(self._coef(), n, min_sep, k)

    def amplified_sensitivity_squared(self, min_sep: int) -> float | None:
        coef = self._coef()
        return float(coef @ coef) if coef.size <= min_sep else None

    def describe(self) -> str:
        c = self.coefficients
        shown = (
            ""
            if c is None
            else " (c = " + ", ".join(f"{v:.3g}" for v in c[:4]) + (", ..." if len(c) > 4 else "") + ")"
        )
        return f"banded matrix factorization, {self.bands} bands{shown}"


@dataclass
class BufferedToeplitz(CorrelatedNoise):
    """``blt``: a buffered-linear-Toeplitz strategy (Dvijotham et al. 2024; McMahan et al. 2024) with ``buffers``
    decays and output scales, optimised for the run's rounds and schedule
    (:func:`fedsim.round.mf_optimize.optimal_blt`; positive, non-increasing Toeplitz coefficients, so the
    sensitivity is exact), or given as ``decays`` and ``output_scales``. Its noise keeps ``buffers`` vectors:
    ``O(buffers x model)`` memory and time a round however many rounds run."""

    fixed_for_rounds: ClassVar[str | None] = "its buffers' decays and output scales"
    name = "blt"
    aliases: ClassVar[tuple[str, ...]] = ()
    buffers: int = 2
    decays: tuple[float, ...] | None = None
    output_scales: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            isinstance(self.buffers, bool)
            or not isinstance(self.buffers, (int, np.integer))
            or self.buffers < 1
        ):
            raise PrivacyInputError("buffers", self.buffers, "must be an integer >= 1")
        self.decays = _sequence(self.decays, "decays")
        self.output_scales = _sequence(self.output_scales, "output_scales")
        if (self.decays is None) != (self.output_scales is None):
            raise PrivacyInputError(
                "decays/output_scales", (self.decays, self.output_scales), "give both or neither"
            )
        if self.decays is not None:
            self._blt()  # validates
            self.buffers = len(self.decays)

    def _blt(self) -> Any:
        from .matrix_factorization import BLT

        if self.decays is None:
            raise ValueError(
                "blt: prepare(rounds, min_sep, k) fixes the decays and scales before the first round"
            )
        try:
            return BLT(tuple(self.decays), tuple(self.output_scales))
        except ValueError as exc:
            raise PrivacyInputError(
                "decays/output_scales", (self.decays, self.output_scales), str(exc)
            ) from None

    def prepare(self, rounds: int | None, min_sep: int, k: int | None) -> None:
        if self.decays is not None:
            return
        rounds = self.rounds if rounds is None else rounds
        if rounds is None:
            raise PrivacyInputError(
                "rounds",
                None,
                "mechanism 'blt' optimises its decays for the run's rounds: give them (or decays and "
                "output_scales)",
            )
        from .mf_optimize import optimal_blt

        blt = optimal_blt(int(rounds), int(self.buffers), min_sep, k, kind=OBJECTIVE)
        self.decays = tuple(float(d) for d in blt.decays)
        self.output_scales = tuple(float(w) for w in blt.output_scales)

    def _new_stream(self, size: int) -> Any:
        from .matrix_factorization import BLTNoise

        return BLTNoise(self._blt(), size)

    def _stream_size(self) -> int:
        return int(self._stream.buffers.shape[1])

    def _stream_state(self) -> dict[str, Any]:
        return {"buffers_state": self._stream.buffers.copy()}

    def _load_stream_state(self, state: dict[str, Any], size: int) -> None:
        stream = self._new_stream(size)
        stream.buffers = np.array(state["buffers_state"], dtype=np.float64).reshape(stream.buffers.shape)
        self._stream = stream

    def extra_state(self) -> dict[str, Any]:
        return {
            **super().extra_state(),
            "decays": None if self.decays is None else list(self.decays),
            "output_scales": None if self.output_scales is None else list(self.output_scales),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("decays") is not None:
            self.decays = tuple(float(d) for d in state["decays"])
            self.output_scales = tuple(float(w) for w in state["output_scales"])
            self.buffers = len(self.decays)
        super().load_extra_state(state)

    def prefix_sensitivity_squared(
        self, n: int, min_sep: int, k: int | None, cyclic: bool = False
    ) -> tuple[np.ndarray, bool]:
        # the worst pattern (rounds 0, b, 2b, ...) is a cyclic group's: the same value either way
        from .matrix_factorization import toeplitz_prefix_sensitivity_squared

        return toeplitz_prefix_sensitivity_squared(self._blt().toeplitz_coefficients(n), n, min_sep, k)

    def amplified_sensitivity_squared(self, min_sep: int) -> float | None:
        return None  # every column is dense: one client's participations overlap

    def describe(self) -> str:
        if self.decays is None:
            return f"buffered-linear-Toeplitz noise, {self.buffers} buffers"
        pairs = ", ".join(f"{d:.4g}/{w:.3g}" for d, w in zip(self.decays, self.output_scales, strict=True))
        return f"buffered-linear-Toeplitz noise, {self.buffers} buffers (decay/scale {pairs})"


@dataclass
class TreeAggregation(CorrelatedNoise):
    """``tree``: DP-FTRL tree aggregation (Kairouz et al. 2021): a binary tree over the rounds, each complete node a
    fresh Gaussian draw (from ``(seed, node)``, or the operating system's entropy), the prefix sums estimated by the
    ``standard`` estimator (one node per set bit of the round) or ``honaker``'s variance-reduced one; round ``t``'s
    noise is the change of the prefix noise (:class:`fedsim.round.tree.TreeNoise`). Memory ``O(log T x model)``.
    The sensitivity counts every complete node, as Kairouz et al. and TensorFlow Privacy account it (conservative
    for the standard estimator, which uses left children only); exact for cyclic and full participation, and for
    min-separation schedules where its dynamic programme is cheap, else a per-level upper bound."""

    #: each node is drawn from the seed, its level and its index when it completes, and the sensitivity of the first
    #: t rounds counts the nodes complete by then, whatever the rounds planned: an extended run is the longer run
    fixed_for_rounds: ClassVar[str | None] = None
    name = "tree"
    aliases: ClassVar[tuple[str, ...]] = ()
    estimator: str = "standard"

    def __post_init__(self) -> None:
        super().__post_init__()
        from .tree import ESTIMATORS

        if self.estimator not in ESTIMATORS:
            raise PrivacyInputError("estimator", self.estimator, f"must be one of {', '.join(ESTIMATORS)}")

    def _new_stream(self, size: int) -> Any:
        from .tree import TreeNoise

        return TreeNoise(size, self.estimator)

    def _step(self, round_: int, size: int, std: float) -> np.ndarray:
        def draw(level: int, index: int) -> np.ndarray:
            return self.rng(index, STREAM_TREE_NODE, level).normal(0.0, std, size=size)

        return self._stream.step(draw)

    def _next_factor(self, round_: int) -> float:
        # the tree is not time-invariant: a probe TreeNoise whose node draws are unit vectors, one coordinate per
        # node (the vectors grow as nodes are drawn), gives the combination of node draws each round adds
        probe = self.__dict__.get("_probe")
        if probe is None:
            from .tree import TreeNoise

            probe = self.__dict__["_probe"] = {"tree": TreeNoise(64, self.estimator), "ids": {}}
        tree, ids = probe["tree"], probe["ids"]
        # room for the nodes one round may draw (at most log2 of the rounds + 1)
        if len(ids) + 64 > tree.size:
            tree.widen(2 * tree.size)

        def unit(level: int, index: int) -> np.ndarray:
            e = np.zeros(tree.size)
            e[ids.setdefault((level, index), len(ids))] = 1.0
            return e

        return float(np.linalg.norm(tree.step(unit)))

    def _stream_size(self) -> int:
        return int(self._stream.size)

    def _stream_state(self) -> dict[str, Any]:
        state = self._stream.state()
        return {"tree_steps": int(state["steps"]), "tree_nodes": state["nodes"]}

    def _load_stream_state(self, state: dict[str, Any], size: int) -> None:
        stream = self._new_stream(size)
        stream.load_state(
            {
                "estimator": self.estimator,
                "size": size,
                "steps": int(state["tree_steps"]),
                "nodes": state["tree_nodes"],
            }
        )
        self._stream = stream

    def prefix_sensitivity_squared(
        self, n: int, min_sep: int, k: int | None, cyclic: bool = False
    ) -> tuple[np.ndarray, bool]:
        from .tree import tree_prefix_sensitivity_squared

        return tree_prefix_sensitivity_squared(n, min_sep, k, pattern="cyclic" if cyclic else None)

    def amplified_sensitivity_squared(self, min_sep: int) -> float | None:
        return None  # a participation enters every node above it: participations overlap

    def describe(self) -> str:
        return f"tree aggregation ({self.estimator} estimator)"


for _cls in (TreeAggregation, BandedMatrixFactorization, BufferedToeplitz):
    register_noise_source(_cls)
