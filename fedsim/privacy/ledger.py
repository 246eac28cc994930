"""The ledger of releases: what has been spent so far, serialisable, cheap to query.

Records are appended in round order; several records with the same round are several releases in
that round. A release is a per-round :class:`~fedsim.privacy.Mechanism` or any other :class:`DpRelease`: a
release that knows its dp-accounting event (a whole-run event such as a matrix-factorization mechanism over all
rounds, a bound on each client's participations), recorded at the round it is released.

Releases of one round that are Mechanisms sharing the round's sampled cohort (same sampling scheme, population
and rate) are composed *before* sampling into one Gaussian with ``z_eff = (sum z_i^-2)^(-1/2)`` (see
:func:`fedsim.privacy.mechanism.compose_same_cohort`); releases with a different sampling, other releases and
different rounds compose as independent events (a release whose event shares a cohort with the round's Mechanisms
must say so in its own event).

The ledger hands its rounds to the accountant (:data:`~fedsim.privacy.ACCOUNTANTS`) and gets a number; it keeps
one :class:`~fedsim.privacy.accountants.LedgerAccountant` per accountant and PLD discretisation. ``pld``'s keeps the
composed PLD of the rounds so far, so calling ``epsilon(delta, "pld")`` after every round costs one PLD composition
per round (dp-accounting's own, the PLDs ``fedsim privacy`` composes too), and answers with RDP where a PLD would
not fit in memory (:meth:`Ledger.fell_back` says why).

Serialised (``ledger.json``, format ``fedsim.privacy.ledger/1``), each release is ``{round, name, mechanism}`` for
a Mechanism, and ``{round, name, kind, mechanism}`` for another release, ``mechanism`` then holding its own
``to_dict()``; its class, registered with :func:`register_release_kind`, loads it back.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import certified
from .accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    Accountant,
    LedgerAccountant,
    validate_delta,
    validate_method,
)
from .errors import PrivacyInputError
from .mechanism import Mechanism, compose_same_cohort

__all__ = ["MECHANISM_KIND", "RELEASE_KINDS", "DpRelease", "Ledger", "Release", "register_release_kind"]


LEDGER_FORMAT = "fedsim.privacy.ledger/1"
RELATIONS = ("add-remove", "replace-one")


class DpRelease(Protocol):
    """Anything the ledger records: a release that knows its dp-accounting event.

    * ``to_dp_event(relation)``: its ``dp_accounting.DpEvent`` under ``relation`` (``"add-remove"`` or
      ``"replace-one"``: the ledger accounts every release under replace-one as soon as one release needs it);
    * ``private``: False for an un-noised release (the ledger's epsilon is then infinite);
    * ``neighbouring``: the relation it is defined under (``"add-remove"`` or ``"replace-one"``);
    * ``to_dict()`` (JSON values) and a classmethod ``from_dict(d)``, with a class attribute ``kind`` registered in
      :data:`RELEASE_KINDS` (:func:`register_release_kind`), so that a saved ledger loads back.

    :class:`~fedsim.privacy.Mechanism` is the per-round kind (``"mechanism"``; serialised without a ``kind`` key). A
    release may also offer ``pld_parameters(relation) -> (standard_deviation, sampling_prob, relation name)`` when
    it is one sampled Gaussian of sensitivity 1: the PLD accountant then builds its PLD directly (cached, size
    checked) instead of through dp-accounting's ``PLDAccountant``.
    """

    @property
    def private(self) -> bool: ...

    @property
    def neighbouring(self) -> str: ...

    def to_dp_event(self, relation: str | None = None) -> Any: ...

    def to_dict(self) -> dict: ...


#: the kind of a per-round Mechanism (serialised without a ``kind`` key, as before other kinds existed)
MECHANISM_KIND = "mechanism"

#: release kinds by name: the class whose ``from_dict`` loads a saved release of that kind back
RELEASE_KINDS: dict[str, type] = {MECHANISM_KIND: Mechanism}


def register_release_kind(cls: type, *, replace: bool = False) -> type:
    """Add a :class:`DpRelease` class (with a class attribute ``kind``, ``from_dict``, ``to_dict``, ``to_dp_event``)
    to :data:`RELEASE_KINDS`, so a ledger records it and loads it back; usable as a class decorator. A kind
    registered already (to another class) is a ``ValueError`` unless ``replace``."""
    if not isinstance(cls, type):
        raise TypeError(f"register_release_kind takes a class, got {cls!r}")
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__}.kind must be a non-empty string (the name saved in ledger.json)")
    missing = [a for a in ("from_dict", "to_dict", "to_dp_event") if not callable(getattr(cls, a, None))]
    if missing:
        raise TypeError(f"{cls.__name__} is not a DP release: it has no {', '.join(missing)}")
    if kind in RELEASE_KINDS and RELEASE_KINDS[kind] is not cls and not replace:
        raise ValueError(
            f"a release kind named {kind!r} is registered already ({', '.join(RELEASE_KINDS)}); "
            "pass replace=True to replace it"
        )
    RELEASE_KINDS[kind] = cls
    return cls


def release_kind(release: Any) -> str:
    """The registered kind of ``release`` (``"mechanism"`` for a :class:`~fedsim.privacy.Mechanism`)."""
    return MECHANISM_KIND if isinstance(release, Mechanism) else str(getattr(type(release), "kind", ""))


def _check_release(release: Any, field: str = "mechanism") -> None:
    """A :class:`~fedsim.privacy.Mechanism`, or a :class:`DpRelease` of a registered kind (one-line error else)."""
    if isinstance(release, Mechanism):
        return
    name = type(release).__name__
    missing = [a for a in ("to_dp_event", "to_dict") if not callable(getattr(release, a, None))]
    missing += [a for a in ("private", "neighbouring") if not hasattr(release, a)]
    if missing:
        raise PrivacyInputError(
            field,
            name,
            "must be a fedsim.privacy.Mechanism or a DP release (to_dp_event(relation), private, neighbouring, "
            f"to_dict(), a registered kind); it has no {', '.join(missing)}",
        )
    if release.neighbouring not in RELATIONS:
        raise PrivacyInputError(
            f"{field}.neighbouring", release.neighbouring, f"must be one of {', '.join(RELATIONS)}"
        )
    kind = release_kind(release)
    if RELEASE_KINDS.get(kind) is not type(release):
        raise PrivacyInputError(
            field,
            name,
            f"its kind {kind!r} is not registered to {name} (kinds: {', '.join(RELEASE_KINDS)}): register it with "
            "fedsim.privacy.register_release_kind, so a saved ledger loads it back",
        )


@dataclass(frozen=True)
class Release:
    """One recorded release: its round, its name and the release itself (``mechanism``: a per-round
    :class:`~fedsim.privacy.Mechanism` or any other :class:`DpRelease`)."""

    round: int
    name: str
    mechanism: Any

    @property
    def kind(self) -> str:
        return release_kind(self.mechanism)

    def to_dict(self) -> dict:
        if isinstance(self.mechanism, Mechanism):  # the format of every ledger.json written so far
            return dict(round=self.round, name=self.name, mechanism=self.mechanism.to_dict())
        return dict(round=self.round, name=self.name, kind=self.kind, mechanism=self.mechanism.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> Release:
        kind = d.get("kind", MECHANISM_KIND)
        release_cls = RELEASE_KINDS.get(kind)
        if release_cls is None:
            raise PrivacyInputError(
                "ledger.releases.kind",
                kind,
                f"is not a registered release kind ({', '.join(RELEASE_KINDS)}): register its class with "
                "fedsim.privacy.register_release_kind before loading this ledger",
            )
        # the round and name as saved: Ledger.record checks them
        return cls(d["round"], d.get("name", "model"), release_cls.from_dict(d["mechanism"]))


def _round_events(releases: Iterable[Any]) -> tuple[Any, ...]:
    """The releases of one round: Mechanisms grouped by cohort and composed per cohort, other releases as they are
    (order-stable: by first appearance)."""
    groups: dict[Any, list[Any]] = {}
    for r in releases:
        key = ("cohort", r.sampling_key()) if isinstance(r, Mechanism) else ("release", id(r), len(groups))
        groups.setdefault(key, []).append(r)
    return tuple(compose_same_cohort(g) if key[0] == "cohort" else g[0] for key, g in groups.items())


class Ledger:
    """Releases so far (heterogeneous mechanisms and other DP releases allowed).

    >>> ledger = Ledger()
    >>> ledger.record(round=1, mechanism=m, name="model")
    >>> ledger.record(round=1, mechanism=m_count, name="clip-count")   # same round, same cohort
    >>> ledger.record(round=1, mechanism=whole_run, name="mf")          # any DpRelease of a registered kind
    >>> ledger.epsilon(delta=1e-5)                                      # certified (PLD)
    """

    def __init__(self, pld_discretization: float = certified.DEFAULT_PLD_DISCRETIZATION):
        self._releases: list[Release] = []
        self.pld_discretization = float(pld_discretization)
        # one accountant state per (method, PLD discretisation), with the registry entry it was made from
        self._accountants: dict[tuple[str, float], tuple[Accountant, LedgerAccountant]] = {}
        self._memo: dict = {}

    # ------------------------------------------------------------------ recording
    def record(self, round: int, mechanism: Any, name: str = "model") -> None:
        """Append a release at ``round``: a :class:`~fedsim.privacy.Mechanism` or any :class:`DpRelease`."""
        if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 1:
            raise PrivacyInputError("round", round, "must be an integer >= 1")
        if self._releases and round < self._releases[-1].round:
            raise PrivacyInputError(
                "round",
                round,
                f"must be >= the last recorded round ({self._releases[-1].round}); the ledger is append-only",
            )
        _check_release(mechanism)
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

    def fell_back(self, method: str) -> tuple[str, str] | None:
        """``(accountant, why)`` if the last query by ``method`` was answered by the accountant it falls back to
        (:attr:`~fedsim.privacy.accountants.Accountant.falls_back_to`: ``pld`` by ``rdp`` where a PLD would not fit
        in memory), else None (also for a method not queried yet, or not registered). Held by the accountant's
        state (its :attr:`~fedsim.privacy.accountants.LedgerAccountant.fallback`)."""
        held = self._accountants.get((method, self.pld_discretization))
        why = getattr(held[1], "fallback", None) if held else None
        if not why:
            return None
        return held[0].falls_back_to or "another accountant", why

    @property
    def pld_fallback(self) -> str | None:
        """Why the last ``pld`` query was answered with RDP (a PLD would not fit in memory); None if it was not
        (:meth:`fell_back` for any accountant)."""
        answered = self.fell_back("pld")
        return answered[1] if answered else None

    def __len__(self) -> int:
        return len(self._releases)

    def __repr__(self) -> str:
        return f"Ledger(rounds={self.rounds}, releases={len(self)})"

    def _rounds_grouped(self, extra: list[Any] | None = None) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
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
    def accountant(self, method: str = DEFAULT_ACCOUNTANT) -> LedgerAccountant:
        """This ledger's state of accountant ``method`` at its PLD discretisation (made on first use by the
        registry's :meth:`~fedsim.privacy.accountants.Accountant.for_ledger`; remade if the registry entry was
        replaced)."""
        acc = ACCOUNTANTS[validate_method(method)]
        key = (method, self.pld_discretization)
        held = self._accountants.get(key)
        if held is None or held[0] is not acc:
            held = self._accountants[key] = (acc, acc.for_ledger(self.pld_discretization))
        return held[1]

    def epsilon(self, delta: float, method: str = DEFAULT_ACCOUNTANT) -> float:
        """Epsilon of everything recorded so far at ``delta`` (certified for pld and rdp, a valid closed-form
        bound for igmm-corrected, kairouz and basic; NaN where a paper bound makes no statement). 0.0 for an
        empty ledger."""
        delta = validate_delta(delta)
        method = validate_method(method)
        key = (len(self._releases), delta, method, self.pld_discretization, id(ACCOUNTANTS[method]))
        if key not in self._memo:
            self._memo[key] = self._epsilon(self._rounds_grouped(), delta, method, cache=True)
        return self._memo[key]

    def epsilon_with(
        self, mechanisms: Iterable[Any], delta: float, method: str = DEFAULT_ACCOUNTANT
    ) -> float:
        """Epsilon if one more round releasing ``mechanisms`` (Mechanisms or other :class:`DpRelease`) were
        recorded; the ledger is unchanged."""
        delta = validate_delta(delta)
        method = validate_method(method)
        extra = list(mechanisms)
        for m in extra:
            _check_release(m)
        return self._epsilon(self._rounds_grouped(extra), delta, method, cache=False)

    def would_exceed(
        self,
        mechanism: Any,
        max_epsilon: float,
        delta: float,
        method: str = DEFAULT_ACCOUNTANT,
        releases=None,
    ) -> bool:
        """Whether one more round releasing ``mechanism`` (plus ``releases``: further releases in the
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

    def _epsilon(self, rounds: list[tuple[Any, ...]], delta: float, method: str, cache: bool) -> float:
        if not rounds:
            return 0.0
        if any(not r.private for events in rounds for r in events):
            return math.inf  # an un-noised (or unclipped) release: not private, by every accountant
        relation = certified.ledger_relation(r for events in rounds for r in events)
        return float(self.accountant(method).epsilon(rounds, relation, delta, cache))

    # ------------------------------------------------------------------ curves and serialisation
    def epsilon_curve(self, delta: float, method: str = DEFAULT_ACCOUNTANT) -> np.ndarray:
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
            rel = Release.from_dict(r)
            led.record(round=rel.round, mechanism=rel.mechanism, name=rel.name)
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
