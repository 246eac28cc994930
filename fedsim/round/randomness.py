"""Where the randomness that protects clients comes from: a seeded stream, or the operating system.

Two kinds (``RANDOMNESS``), recorded in every run's config as ``privacy.randomness``:

* ``"seeded"`` (simulation): every stream comes from its own NumPy generator seeded by
  ``(seed, round, stream[, client])``, so a run is reproducible and independent of call order and worker count.
  Anyone who holds the seed can regenerate the noise and the cohort: never deploy with it.
* ``"os-entropy"`` (deployment): every value is drawn from ``os.urandom``, the kernel's cryptographically secure
  generator, through :class:`OsEntropyGenerator`. Nothing about it is stored or derivable from a config.

Both expose the few ``numpy.random.Generator`` methods the private round uses (``random``, ``normal``,
``choice`` without replacement), so the round's code does not care which it holds.

Known limit (as in Opacus' ``secure_mode``, which adds several draws to blunt it): Gaussian samples computed in
floating point do not have exactly Gaussian tails, which floating-point attacks on DP exploit (Mironov 2012;
Jin et al. 2022). :class:`OsEntropyGenerator` makes the *seed* unrecoverable; it does not change float64
arithmetic.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

SEEDED = "seeded"
OS_ENTROPY = "os-entropy"
RANDOMNESS = (SEEDED, OS_ENTROPY)

# Stream identifiers: independent generators for independent purposes.
STREAM_SAMPLING = 1
STREAM_NOISE = 2
STREAM_CLIENT = 3
STREAM_COUNT_NOISE = 4
STREAM_LOSS_NOISE = 5
STREAM_NOISE_SHARE = 6
STREAM_EVALUATION = 7
STREAM_TREE_NODE = 8  # tree aggregation: one draw per node, keyed (seed, index, stream, level)
STREAM_ROTATION = (
    9  # distributed discrete noise: the round's public rotation (one seed per round, server side)
)
STREAM_ROUNDING = (
    10  # distributed discrete noise: a client's randomized rounding, keyed (seed, round, stream, client)
)
STREAM_SECAGG = 11  # secure aggregation: the round's neighbour graph (server side) and simulated dropouts

_TWO_PI = 2.0 * math.pi
_2_POW_53 = float(1 << 53)


class OsEntropyGenerator:
    """Uniforms, Gaussians and subsets drawn from ``os.urandom`` (the kernel CSPRNG), never from a seed.

    ``random``: 53-bit uniforms in ``[0, 1)``. ``normal``: Box-Muller on two such uniforms (the first taken in
    ``(0, 1]`` so that its logarithm is finite). ``choice(a, size, replace=False)``: the ``size`` elements of
    ``a`` with the smallest independent 64-bit random keys, a uniformly random subset (up to key ties, whose
    probability is below ``len(a)^2 / 2^65``), returned in the order of ``a``'s keys.
    """

    kind = OS_ENTROPY

    @staticmethod
    def _u64(n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64) if n > 0 else np.zeros(0, dtype=np.uint64)

    def random(self, size: int | tuple[int, ...] | None = None) -> Any:
        n = 1 if size is None else int(np.prod(size))
        u = (self._u64(n) >> np.uint64(11)).astype(np.float64) / _2_POW_53
        return float(u[0]) if size is None else u.reshape(size)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: int | tuple[int, ...] | None = None) -> Any:
        n = 1 if size is None else int(np.prod(size))
        pairs = (n + 1) // 2
        u = (self._u64(2 * pairs) >> np.uint64(11)).astype(np.float64) / _2_POW_53
        u1 = 1.0 - u[:pairs]  # (0, 1]
        radius = np.sqrt(-2.0 * np.log(u1))
        angle = _TWO_PI * u[pairs:]
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]
        out = loc + scale * z
        return float(out[0]) if size is None else out.reshape(size)

    def choice(self, a: Any, size: int, replace: bool = False) -> np.ndarray:
        if replace:
            raise ValueError("OsEntropyGenerator.choice draws without replacement only")
        items = np.asarray(a)
        if not 0 <= int(size) <= items.size:
            raise ValueError(f"cannot choose {size} of {items.size} items without replacement")
        keys = self._u64(items.size)
        return items[np.argsort(keys, kind="stable")[: int(size)]]


def make_rng(seed: int | None, round_: int, stream: int, *extra: int) -> Any:
    """A generator owned by one purpose: ``(seed, round, stream, *extra)`` -> an independent seeded stream, or,
    with ``seed=None``, an :class:`OsEntropyGenerator` (the operating system's entropy)."""
    if seed is None:
        return OsEntropyGenerator()
    return np.random.default_rng([int(seed), int(round_), int(stream), *(int(e) for e in extra)])


class SeededState:
    """State a checkpoint saves for a component of the round (a sampler, a noise source): its name, its seed, and
    whatever else it keeps (:meth:`extra_state`).

    Every draw of the shipped components is a function of ``(seed, round, stream)``, so the seed is all there is to
    restore; a component that keeps earlier draws (correlated noise across rounds) or history (a participation
    schedule) returns it from :meth:`extra_state` (JSON values and NumPy arrays: a checkpoint saves the arrays as
    ``.npy`` members) and takes it back in :meth:`load_extra_state`."""

    name: str = ""
    seed: int | None
    #: rounds the same seed drew before this run's round 1 (a strategy continuing a ledger): round ``t`` draws from
    #: the streams of round ``stream_offset + t``, so a continuation never repeats an earlier run's cohort or noise
    stream_offset: int = 0

    def stream_round(self, round_: int) -> int:
        """The round whose streams round ``round_`` of this run draws from (:attr:`stream_offset`)."""
        return int(round_) + int(self.stream_offset)

    def extra_state(self) -> dict[str, Any]:
        """State beyond the name and the seed that a checkpoint must save to continue the same draws."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`."""

    def state_dict(self) -> dict[str, Any]:
        offset = (
            {"stream_offset": int(self.stream_offset)} if self.stream_offset else {}
        )  # saved only when set
        return {"name": self.name, "seed": self.seed, **offset, **self.extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"state of {state.get('name')!r} cannot be loaded into {self.name!r}")
        self.seed = state.get("seed")
        self.stream_offset = int(state.get("stream_offset", 0))
        self.load_extra_state({k: v for k, v in state.items() if k not in ("name", "seed", "stream_offset")})


def register_component(registry: dict[str, Any], cls: Any, base: type, *, replace: bool = False) -> Any:
    """Add ``cls``, a subclass of ``base`` (a sampler, a noise source) with a non-empty ``name``, to ``registry``;
    a name registered already to another class is a ``ValueError`` unless ``replace``."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"only a {base.__name__} subclass can be registered, got {cls!r}")
    if not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{cls.__name__}.name must be a non-empty string")
    if cls.name in registry and registry[cls.name] is not cls and not replace:
        raise ValueError(
            f"a {base.__name__} named {cls.name!r} is registered already ({', '.join(registry)}); "
            "pass replace=True to replace it"
        )
    registry[cls.name] = cls
    return cls


def make_component(registry: dict[str, Any], value: Any, seed: int | None, field: str, base: type) -> Any:
    """``value`` if it is a ``base`` object (its seed must then agree with ``seed``, or ``seed`` be None), else the
    registered class ``value`` names, built with ``seed``; an unknown name names the registered ones."""
    from fedsim.validation import one_of

    if isinstance(value, base):
        if seed is not None and value.seed != seed:
            raise ValueError(
                f"the {base.__name__} object has seed {value.seed!r}, the strategy seed {seed!r}: give one"
            )
        return value
    return registry[one_of(field, value, tuple(registry))](seed)


def randomness_kind(seed: int | None) -> str:
    """``"seeded"`` or ``"os-entropy"``: what :func:`make_rng` draws from for this seed."""
    return OS_ENTROPY if seed is None else SEEDED
