"""The ledger of released rounds: what has been spent so far, serialisable, cheap to query.

Records are appended in round order; several records with the same round are several releases in
that round. Releases of one round that share the round's sampled cohort (same sampling scheme,
population and rate) are composed *before* sampling into one Gaussian with
``z_eff = (sum z_i^-2)^(-1/2)`` (see :func:`fedsim.privacy.mechanism.compose_same_cohort`); releases
with a different sampling, and different rounds, compose normally.

``epsilon(delta, "pld")`` keeps the composed PLD of the rounds so far, so calling it after every round
costs one PLD composition per round (dp-accounting's own, the PLDs ``fedsim privacy`` composes too).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from . import certified
from .accountants import ACCOUNTANTS, compute_curve, validate_delta, validate_method
from .errors import PrivacyInputError
from .mechanism import Mechanism, compose_same_cohort

__all__ = ["Ledger", "Release"]


LEDGER_FORMAT = "fedsim.privacy.ledger/1"


@dataclass(frozen=True)
class Release:
    round: int
    name: str
    mechanism: Mechanism

    def to_dict(self) -> dict:
        return dict(round=self.round, name=self.name, mechanism=self.mechanism.to_dict())


def _round_events(mechanisms: Iterable[Mechanism]) -> tuple[Mechanism, ...]:
    """The releases of one round grouped by cohort and composed per cohort (order-stable)."""
    groups: dict[tuple, list[Mechanism]] = {}
    for m in mechanisms:
        groups.setdefault(m.sampling_key(), []).append(m)
    return tuple(compose_same_cohort(g) for g in groups.values())


class Ledger:
    """Rounds released so far (heterogeneous mechanisms allowed).

    >>> ledger = Ledger()
    >>> ledger.record(round=1, mechanism=m, name="model")
    >>> ledger.record(round=1, mechanism=m_count, name="clip-count")   # same round, same cohort
    >>> ledger.epsilon(delta=1e-5)                                      # certified (PLD)
    """

    def __init__(self, pld_discretization: float = certified.DEFAULT_PLD_DISCRETIZATION):
        self._releases: list[Release] = []
        self.pld_discretization = float(pld_discretization)
        self._pld_prefix: tuple | None = None  # (relation, n_rounds, last round's events, pld)
        self._pld_total: tuple | None = None  # the same for the last query's whole composition
        self.pld_fallback: str | None = (
            None  # why the last pld query was answered with rdp (None: it was not)
        )
        self._pld_fallback_warned = False
        self._memo: dict = {}

    # ------------------------------------------------------------------ recording
    def record(self, round: int, mechanism: Mechanism, name: str = "model") -> None:
        if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 1:
            raise PrivacyInputError("round", round, "must be an integer >= 1")
        if self._releases and round < self._releases[-1].round:
            raise PrivacyInputError(
                "round",
                round,
                f"must be >= the last recorded round ({self._releases[-1].round}); the ledger is append-only",
            )
        if not isinstance(mechanism, Mechanism):
            raise PrivacyInputError(
                "mechanism", type(mechanism).__name__, "must be a fedsim.privacy.Mechanism"
            )
        self._releases.append(Release(int(round), str(name), mechanism))
        self._memo.clear()

    @property
    def releases(self) -> tuple[Release, ...]:
        return tuple(self._releases)

    @property
    def private(self) -> bool:
        """Whether every release so far was noised (False once a non-private baseline release is recorded: its
        epsilon is infinite)."""
        return all(r.mechanism.private for r in self._releases)

    @property
    def rounds(self) -> int:
        """Number of distinct rounds recorded."""
        return len({r.round for r in self._releases})

    @property
    def last_round(self) -> int:
        return self._releases[-1].round if self._releases else 0

    def __len__(self) -> int:
        return len(self._releases)

    def __repr__(self) -> str:
        return f"Ledger(rounds={self.rounds}, releases={len(self)})"

    def _rounds_grouped(self, extra: list[Mechanism] | None = None) -> list[tuple[Mechanism, ...]]:
        out: list[tuple[Mechanism, ...]] = []
        cur_round, cur = None, []
        for r in self._releases:
            if r.round != cur_round and cur:
                out.append(_round_events(cur))
                cur = []
            cur_round = r.round
            cur.append(r.mechanism)
        if cur:
            out.append(_round_events(cur))
        if extra:
            out.append(_round_events(extra))
        return out

    # ------------------------------------------------------------------ accounting
    def epsilon(self, delta: float, method: str = "pld") -> float:
        """Epsilon of everything recorded so far at ``delta`` (certified for pld and rdp, a valid closed-form
        bound for igmm-corrected, kairouz and basic; NaN where a paper bound makes no statement). 0.0 for an
        empty ledger."""
        delta = validate_delta(delta)
        method = validate_method(method)
        key = (len(self._releases), delta, method)
        if key not in self._memo:
            self._memo[key] = self._epsilon(self._rounds_grouped(), delta, method, cache=True)
        return self._memo[key]

    def epsilon_with(self, mechanisms: Iterable[Mechanism], delta: float, method: str = "pld") -> float:
        """Epsilon if one more round releasing ``mechanisms`` were recorded; the ledger is unchanged."""
        delta = validate_delta(delta)
        method = validate_method(method)
        extra = list(mechanisms)
        for m in extra:
            if not isinstance(m, Mechanism):
                raise PrivacyInputError("mechanism", type(m).__name__, "must be a fedsim.privacy.Mechanism")
        return self._epsilon(self._rounds_grouped(extra), delta, method, cache=False)

    def would_exceed(
        self, mechanism: Mechanism, max_epsilon: float, delta: float, method: str = "pld", releases=None
    ) -> bool:
        """Whether one more round releasing ``mechanism`` (plus ``releases``: further mechanisms in the
        same round, or an int number of identical releases) would take epsilon above ``max_epsilon``.
        Does not change the ledger."""
        try:
            cap = float(max_epsilon)
        except (TypeError, ValueError):
            raise PrivacyInputError("max_epsilon", max_epsilon, "must be a positive number") from None
        if not cap > 0:
            raise PrivacyInputError("max_epsilon", max_epsilon, "must be a positive number")
        if releases is None:
            extra = [mechanism]
        elif isinstance(releases, (int, np.integer)) and not isinstance(releases, bool):
            if releases < 1:
                raise PrivacyInputError("releases", releases, "must be >= 1 or a list of mechanisms")
            extra = [mechanism] * int(releases)
        else:
            extra = [mechanism, *list(releases)]
        eps = self.epsilon_with(extra, delta, method)
        return not (eps <= cap)  # NaN (no statement) counts as exceeding

    def _epsilon(self, rounds: list[tuple[Mechanism, ...]], delta: float, method: str, cache: bool) -> float:
        if not rounds:
            return 0.0
        if any(not m.private for events in rounds for m in events):
            return math.inf  # an un-noised (or unclipped) release: not private, by every accountant
        all_mechs = [m for events in rounds for m in events]
        relation = certified.ledger_relation(all_mechs)
        acc = ACCOUNTANTS[method]
        if acc.of_ledger is not None:
            try:
                eps = float(acc.of_ledger(rounds, relation, delta, self, cache))
            except certified.PldTooLarge as exc:
                # Instead of exhausting memory: RDP is also a valid upper bound on the true epsilon, usually a
                # looser one than PLD's, so the run over-reports rather than under-reports.
                if not self._pld_fallback_warned:
                    warnings.warn(
                        f"PLD accounting is impractical here ({exc}); epsilon is reported with RDP "
                        "(a valid, looser upper bound)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    self._pld_fallback_warned = True
                self.pld_fallback = str(exc)
                return float(ACCOUNTANTS["rdp"].of_ledger(rounds, relation, delta, self, cache))
            if acc.name == "pld":
                self.pld_fallback = None  # describes the last pld query only
            return eps
        # the remaining closed forms need a homogeneous ledger: one identical event per round
        first = rounds[0]
        if len(first) != 1 or any(events != first for events in rounds):
            raise PrivacyInputError(
                "method",
                method,
                "needs the same single mechanism in every round; use pld, rdp or basic for this ledger",
            )
        curve = compute_curve(first[0], len(rounds), delta, method)
        return float(curve.epsilon[-1])

    def pld_epsilon(self, rounds, relation: str, delta: float, cache: bool = True) -> float:
        """Compose the rounds' PLDs with dp-accounting (its public ``compose`` and ``get_epsilon_for_delta``, the
        same PLDs ``fedsim privacy`` uses) and read epsilon off the result.

        Cached: the composition of every round but the last, and the whole composition with the last round's
        events; a query after one more round reuses the latter as its prefix, so it costs one composition.
        Raises :class:`certified.PldTooLarge` instead of building a PLD that would not fit in memory."""
        vdi = self.pld_discretization
        complete, last = rounds[:-1], rounds[-1]
        acc, size = None, (0, 0.0, 0.0)
        n0 = 0
        for cached in (self._pld_total, self._pld_prefix):
            # (relation, rounds covered, events of its last covered round, pld, its size estimate)
            if cached is None or cached[0] != relation or cached[1] > len(complete) or cached[1] == 0:
                continue
            if cached[2] != rounds[cached[1] - 1]:
                continue
            n0, acc, size = cached[1], cached[3], cached[4]
            break
        # only the releases not yet composed are checked (the cache carries the size of the rest), so this check
        # does not grow with the run; the composition is checked once, whole, as before
        prefix_size = certified.check_pld_size(
            (m for events in complete[n0:] for m in events), relation, vdi, size, whole=False
        )
        total_size = certified.check_pld_size(last, relation, vdi, prefix_size)

        def compose(acc, m: Mechanism):
            p = certified.round_pld(m, relation, vdi)
            return p if acc is None else acc.compose(p)

        for i in range(n0, len(complete)):
            for m in complete[i]:
                acc = compose(acc, m)
        if cache and complete:
            self._pld_prefix = (relation, len(complete), complete[-1], acc, prefix_size)
        total = acc
        for m in last:
            total = compose(total, m)
        if cache:
            self._pld_total = (relation, len(rounds), last, total, total_size)
        return float(total.get_epsilon_for_delta(delta))

    # ------------------------------------------------------------------ curves and serialisation
    def epsilon_curve(self, delta: float, method: str = "pld") -> np.ndarray:
        """Epsilon after each recorded round (recomputed; for reports, not for the training loop)."""
        delta = validate_delta(delta)
        method = validate_method(method)
        rounds = self._rounds_grouped()
        return np.array(
            [self._epsilon(rounds[: i + 1], delta, method, cache=False) for i in range(len(rounds))]
        )

    def to_dict(self) -> dict:
        return dict(
            format=LEDGER_FORMAT,
            pld_discretization=self.pld_discretization,
            releases=[r.to_dict() for r in self._releases],
        )

    @classmethod
    def from_dict(cls, d: dict) -> Ledger:
        if not isinstance(d, dict) or d.get("format") != LEDGER_FORMAT:
            raise PrivacyInputError(
                "ledger.format", d.get("format") if isinstance(d, dict) else d, f"must be {LEDGER_FORMAT!r}"
            )
        led = cls(pld_discretization=d.get("pld_discretization", certified.DEFAULT_PLD_DISCRETIZATION))
        for r in d.get("releases", []):
            led.record(
                round=r["round"], mechanism=Mechanism.from_dict(r["mechanism"]), name=r.get("name", "model")
            )
        return led

    def save(self, path) -> None:
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> Ledger:
        with open(path) as f:
            return cls.from_dict(json.load(f))
