"""Canary clients (``privacy.canaries = k``): privacy measured empirically in the one simulated run.

2k canary directions are drawn (unit vectors in the model's parameter space, from the scenario's seed on a stream
of their own); each is inserted into the training population with probability 1/2, independently (k expected;
the number is in the rows), and the rest are never inserted. An inserted canary is a client like any other: it
is sampled by the run's sampler, counted in the population the accountant uses, and its update (its direction
scaled to the round's clip) is clipped and noised with everyone's. It never trains or evaluates on data.

After each round the released model is scored against every direction:

* ``final``: the cosine between the model's change since round 0 and the direction (Andrew et al., ICLR 2024,
  "One-shot empirical privacy estimation for federated learning", the final-model statistic);
* ``all-rounds``: the largest cosine between one round's model change and the direction, over the rounds so far
  (their statistic when every iterate is released, as a federated server releases them).

From those scores: Andrew et al.'s epsilon **estimate** (:func:`fedsim.privacy.empirical.andrew_estimate`, from
the inserted and the never-inserted canaries' cosines) for both statistics, and Steinke, Nasr and Jagielski's
(NeurIPS 2023, "Privacy auditing with one (1) training run") **lower bound** at ``privacy.canary_confidence``
(:func:`fedsim.privacy.empirical.one_run_audit`, on the all-rounds scores): a claim of (epsilon, delta)-DP with a
smaller epsilon is refuted at that confidence by this run. Neither is a certificate; the certified epsilon is the
ledger's.

Each comes with what it can say at this canary count: the lower bound with its ceiling (the largest bound the
audit can return in this run, every guess right; a certified epsilon above it cannot be refuted by this run,
whatever the mechanism did), the estimate with its confidence interval and its resolution (what canaries that
reveal nothing give). Thousands of canaries are cheap: their updates enter the round's sum as one array, every
cosine of a round is one matrix product, and the audit's p-values are summed only where they matter.

Where the one-run bound holds. Steinke et al.'s Theorem 3 needs two things: each canary inserted by a fair coin
independent of everything else (the coins are drawn on :data:`CANARY_STREAM`, which nothing else draws from), and a
mechanism that is (epsilon, delta)-DP with respect to inserting or removing one canary, the others fixed. The bound
is then about the whole run's output, whatever the rounds share: so it holds

* under participation schedules (``cyclic``, ``min-separation``): a schedule gives an inserted canary its rounds as
  it gives every client's. Direction ``j`` is always client ``first_id + j`` (inserted or not), so one canary's
  coin moves no other client's id, and a cyclic group, keyed by the client id, is the same whoever else is
  inserted; the sampler enforces the schedule on canaries as on everyone, so a canary takes part no more often
  than the accountant's participation pattern allows;
* under correlated noise (``tree``, ``banded-mf``, ``blt``): a canary that takes part in several rounds sees
  noise correlated across them, and the ledger's certified epsilon is that of the whole correlated release under
  the schedule, for add/remove neighbours, which is exactly the guarantee audited. The all-rounds statistic stays
  a valid guess (any post-processing of the released models is); it may be a weaker attack there than a
  statistic fitted to the mechanism, which only lowers the bound.

It does not hold where the certified epsilon is not a guarantee about one canary's insertion: replace-one
neighbours (fixed-size cohorts: inserting a canary changes everyone's sampling probability) and no clipping; nor
where a canary would have to do more than submit its update (distributed noise shares, agnostic FL's losses).
:meth:`scenarios.schema.Scenario._canaries_allowed` refuses those, saying what would be needed.

Canaries exist only in simulation: a deployed ServerApp refuses them (a canary would be a fabricated client in a
real population).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .empirical import (
    andrew_estimate,
    andrew_interval,
    andrew_null,
    one_run_audit,
    one_run_canaries_needed,
    one_run_ceiling,
)
from .errors import PrivacyInputError

#: the generator stream of the canary directions and their insertion coins (no other quantity draws from it)
CANARY_STREAM = 0xCA7A
#: the largest canary matrix (2k x model parameters, float64) fedsim keeps in memory
MAX_CANARY_BYTES = 1 << 30


class CanaryClients:
    """The canaries of one run: ``2k`` directions over a ``dim``-parameter model, the inserted ones given client ids
    from ``first_id`` on (after every real client's id). :meth:`observe` scores each released model;
    :meth:`estimates` gives the row's ``empirical_privacy`` columns."""

    def __init__(
        self, k: int, dim: int, seed: int, first_id: int, delta: float, confidence: float = 0.95
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise PrivacyInputError("canaries", k, "must be a whole number >= 1 (0 turns canaries off)")
        m = 2 * int(k)
        if m * int(dim) * 8 > MAX_CANARY_BYTES:
            raise PrivacyInputError(
                "canaries",
                k,
                f"2 x {k} directions of {dim:,} parameters would take {m * dim * 8 / 2**30:.1f} GiB; at most "
                f"{MAX_CANARY_BYTES // (8 * max(1, dim)) // 2:,} canaries fit in 1 GiB for this model",
            )
        rng = np.random.default_rng([int(seed), CANARY_STREAM])
        directions = rng.standard_normal((m, int(dim)))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        self.directions = directions
        #: which of the 2k directions are inserted: independent fair coins (one-run auditing assumes them)
        self.included = rng.random(m) < 0.5
        self.k, self.delta, self.confidence = int(k), float(delta), float(confidence)
        self.seed = int(seed)
        #: each direction's norm (1 up to rounding), computed once: the cosines divide by it every round
        self._norms = np.linalg.norm(directions, axis=1)
        #: the inserted canaries' client ids: direction ``j`` is client ``first_id + j`` whether or not the others
        #: are inserted, so that one canary's coin moves no other client (a schedule keyed by client id, such as
        #: cyclic groups, gives every other canary the same rounds whether this one is inserted or not)
        self.ids = int(first_id) + np.flatnonzero(self.included).astype(np.int64)
        self._first_id = int(first_id)
        self._ceiling: dict[str, Any] | None = None
        self.final = np.zeros(m)
        self.all_rounds = np.full(m, -np.inf)
        self.rounds_seen = 0

    @property
    def inserted(self) -> int:
        return int(self.included.sum())

    def is_canary(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(ids, self.ids)

    def update(self, cid: int, clip: float) -> np.ndarray:
        """What canary ``cid`` submits: its direction scaled to the round's clip (a norm exactly at the clip, so
        clipping leaves it as it is)."""
        return self.updates(np.array([cid], dtype=np.int64), clip)[0]

    def updates(self, cids: np.ndarray, clip: float) -> np.ndarray:
        """What each canary of ``cids`` submits (:meth:`update`), as rows of one array."""
        if not math.isfinite(clip):
            raise PrivacyInputError(
                "clip", clip, "canaries need a finite clip (their update is scaled to it)"
            )
        pos = np.asarray(cids, dtype=np.int64) - self._first_id
        valid = (pos >= 0) & (pos < self.included.size)
        valid[valid] = self.included[pos[valid]]
        if not np.all(valid):
            bad = np.asarray(cids)[~valid]
            raise KeyError(f"not inserted canary ids: {bad[:5].tolist()}{' ...' if bad.size > 5 else ''}")
        out = self.directions[pos]  # a copy (fancy indexing), scaled in place
        out *= clip
        return out

    def submit(self, partial: Any, cids: np.ndarray, clip: float, block: int = 1024) -> np.ndarray:
        """Add the updates of the sampled canaries ``cids`` to the round's clipped sum ``partial`` (a
        :class:`fedsim.round.PartialSum`), ``block`` rows at a time through :meth:`PartialSum.add_rows` (numpy: the
        clipping, counts and norms of :meth:`PartialSum.add`; ``tests/privacy/test_canaries.py`` checks the two
        agree). A canary's update is finite with its norm at the clip up to rounding, so whether it counts as
        unclipped (adaptive clipping's bit) depends on the last bit. Returns each one's norm before clipping."""
        cids = np.asarray(cids, dtype=np.int64)
        out = np.zeros(cids.size)
        for i in range(0, cids.size, block):
            out[i : i + block] = partial.add_rows(self.updates(cids[i : i + block], clip), clip)
        return out

    def observe(self, before: np.ndarray, after: np.ndarray, initial: np.ndarray) -> None:
        """Score the model released this round (``after``; ``before``: the model of the round before; ``initial``:
        round 0's) against every direction."""
        after = np.asarray(after, dtype=np.float64)
        step, total = self._cosines(after - np.asarray(before, dtype=np.float64), after - initial)
        self.all_rounds = np.maximum(self.all_rounds, step)
        self.final = total
        self.rounds_seen += 1

    def _cosines(self, *vectors: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each vector's cosine with every direction (:func:`fedsim.privacy.empirical.canary_cosines`), all in
        one pass over the direction matrix (one matrix product), with the directions' norms computed once."""
        v = np.stack([np.asarray(x, dtype=np.float64).ravel() for x in vectors], axis=1)
        if v.shape[0] != self.directions.shape[1] or not np.all(np.isfinite(v)):
            raise PrivacyInputError(
                "model change",
                f"array of shape {v.shape}",
                f"must be {self.directions.shape[1]} finite numbers",
            )
        v_norm = np.linalg.norm(v, axis=0)
        dots = self.directions @ v
        return tuple(
            dots[:, j] / (self._norms * v_norm[j]) if v_norm[j] > 0 else np.zeros(self._norms.size)
            for j in range(v.shape[1])
        )

    def estimates(self) -> dict[str, Any]:
        """The row's ``empirical_privacy``: Andrew et al.'s estimates (final-model and all-rounds) and Steinke et
        al.'s lower bound (all-rounds scores), with what they were computed from. Labelled estimates.

        Beside each figure, what it can say at this canary count: the lower bound's ceiling
        (``steinke_epsilon_ceiling``: the largest bound this audit can return in this run, every guess right,
        :func:`~fedsim.privacy.empirical.one_run_ceiling`), and for each estimate its confidence interval
        (``andrew_epsilon_<stat>_ci_low`` / ``_ci_high`` at ``confidence``,
        :func:`~fedsim.privacy.empirical.andrew_interval`) and what it gives when the canaries reveal nothing
        (``andrew_null_median_<stat>``, its floor, and ``andrew_resolution_<stat>``, the ``confidence`` quantile:
        an estimate at or below it cannot be told from no privacy loss; :func:`~fedsim.privacy.empirical.andrew_null`,
        the in/out labels shuffled, seeded from the run's seed)."""
        inc = self.included
        out: dict[str, Any] = {
            "kind": "empirical estimates from canary clients, not certificates",
            "canaries_inserted": self.inserted,
            "canaries_held_out": int((~inc).sum()),
            "confidence": self.confidence,
            "delta": self.delta,
        }
        for name, scores in (("final", self.final), ("all_rounds", self.all_rounds)):
            try:
                est = andrew_estimate(scores[inc], scores[~inc], self.delta)
            except ValueError:  # fewer than 2 canaries on a side: no estimate
                out[f"andrew_epsilon_{name}"] = None
                continue
            out[f"andrew_epsilon_{name}"] = _finite_or_none(est["epsilon"])
            ci = andrew_interval(scores[inc], scores[~inc], self.delta, self.confidence)
            out[f"andrew_epsilon_{name}_ci_low"] = _finite_or_none(ci["low"])
            out[f"andrew_epsilon_{name}_ci_high"] = _finite_or_none(ci["high"])
            null = andrew_null(
                scores[inc], scores[~inc], self.delta, self.confidence, rng=[self.seed, CANARY_STREAM, 1]
            )
            out[f"andrew_null_median_{name}"] = _finite_or_none(null["median"])
            out[f"andrew_resolution_{name}"] = _finite_or_none(null["resolution"])
            out[f"andrew_{name}_cosines"] = {k: float(est[k]) for k in ("mu_in", "sd_in", "mu_out", "sd_out")}
        audit = one_run_audit(self.all_rounds, inc, self.delta, confidence=self.confidence)
        out["steinke_epsilon_lower_bound"] = float(audit["epsilon_lower_bound"])
        out["steinke_epsilon_ceiling"] = self.ceiling()
        out["steinke_guesses"] = int(audit["guesses"])
        out["steinke_correct"] = int(audit["correct"])
        return out

    def ceiling(self) -> float:
        """The largest lower bound this run's audit can return (every guess right, for these canaries' coins;
        computed once: it depends on nothing the training does)."""
        if self._ceiling is None:
            self._ceiling = one_run_ceiling(
                self.included.size, self.delta, self.confidence, included=self.included
            )
        return float(self._ceiling["epsilon_lower_bound"])


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def interpret(certified: float | None, igmm: float | None, estimates: dict[str, Any]) -> list[str]:
    """What the measured figures mean beside the certified epsilon and the IGMM bound as printed: the report's
    lines (``fedsim report``, ``fedsim run``, ``summary.json``)."""
    lines: list[str] = []
    lower = estimates.get("steinke_epsilon_lower_bound")
    conf = estimates.get("confidence", 0.95)
    if lower is not None and igmm is not None and math.isfinite(igmm) and lower > igmm:
        lines.append(
            f"the measured lower bound {lower:.3g} exceeds the IGMM bound as printed ({igmm:.3g}) at "
            f"{conf:.0%} confidence: evidence that the printed bound is not a certificate for this run"
        )
    if lower is not None and certified is not None and math.isfinite(certified) and lower > certified:
        lines.append(
            f"the measured lower bound {lower:.3g} exceeds the certified epsilon {certified:.3g}: the "
            "mechanism that ran is less private than the ledger says (or a 1 - confidence event happened)"
        )
    ceiling = estimates.get("steinke_epsilon_ceiling")
    finite_certified = certified is not None and math.isfinite(certified)
    if lower is not None and ceiling is not None and finite_certified and certified > ceiling:
        lines.append(ceiling_line(certified, ceiling, estimates))
    est = estimates.get("andrew_epsilon_all_rounds")
    low, high = (
        estimates.get("andrew_epsilon_all_rounds_ci_low"),
        estimates.get("andrew_epsilon_all_rounds_ci_high"),
    )
    interval = (
        f"{conf:.0%} interval [{_g(low)}, {_g(high)}]"
        if "andrew_epsilon_all_rounds_ci_low" in estimates
        else None
    )
    if est is not None and finite_certified and est > certified:
        where = ""
        if interval is not None:
            above = low is not None and low > certified
            where = (
                f"; its {interval} lies above it: under the Gaussian model of the cosines, evidence against the "
                "certificate, not a proof"
                if above
                else f"; its {interval} includes it"
            )
        lines.append(
            f"the estimate {est:.3g} exceeds the certified epsilon {certified:.3g}: an estimate from "
            f"{estimates.get('canaries_inserted')} + {estimates.get('canaries_held_out')} canaries' fitted Gaussians, "
            f"not a bound (more canaries narrow it){where}; the lower bound is what would refute the certificate"
        )
    resolution = estimates.get("andrew_resolution_all_rounds")
    if est is not None and resolution is not None and est <= resolution:
        lines.append(
            f"the estimate {est:.3g} is within what canaries that reveal nothing give at this count (resolution "
            f"{resolution:.3g} at {conf:.0%}, median {_g(estimates.get('andrew_null_median_all_rounds'))}, with "
            "the inserted and held-out labels shuffled): it cannot be told from no privacy loss at all; more "
            "canaries lower the resolution"
        )
    resolved = resolution is None or est is None or est > resolution
    if est is not None and resolved and finite_certified and est < 0.5 * certified:
        lines.append(
            f"the estimate {est:.3g} is far below the certified epsilon {certified:.3g}: the accountant may be "
            "loose for this run (or these canaries a weak attack); it does not mean the run is more private "
            "than certified"
        )
    return lines


def _g(v: float | None) -> str:
    return "none" if v is None else f"{v:.3g}"


def ceiling_line(certified: float, ceiling: float, estimates: dict[str, Any]) -> str:
    """Why an audit whose ceiling is below the certified epsilon cannot catch a broken mechanism, and how many
    canaries would let it (:func:`fedsim.privacy.empirical.one_run_canaries_needed`, from the row's delta)."""
    m = int(estimates.get("canaries_inserted") or 0) + int(estimates.get("canaries_held_out") or 0)
    conf = estimates.get("confidence", 0.95)
    line = (
        f"the certified epsilon {certified:.3g} is above {ceiling:.3g}, the largest lower bound this audit can "
        f"return with {m:,} canary directions at {conf:.0%} (every guess right): no outcome of it can refute the "
        "certificate, so at this canary count it cannot tell a broken mechanism (less private than certified) "
        "from an honest one"
    )
    delta = estimates.get("delta")
    if delta is None:
        return line
    need = one_run_canaries_needed(certified, delta, conf)
    if need["canaries"] is not None:
        n = int(need["canaries"])
        return f"{line}; a lower bound of {certified:.3g} needs at least {n:,} directions (privacy.canaries >= {-(-n // 2):,})"
    return (
        f"{line}; no canary count reaches it at delta = {delta:g}: the ceiling grows only to about "
        f"{need['peak']:.3g} (at about {int(need['peak_canaries']):,} directions), then falls, as the delta term "
        "grows with the count"
    )
