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

Canaries exist only in simulation: a deployed ServerApp refuses them (a canary would be a fabricated client in a
real population).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .empirical import andrew_estimate, canary_cosines, one_run_audit
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
        rows = np.flatnonzero(self.included)
        #: the inserted canaries' client ids, and the direction each one submits
        self.ids = np.arange(first_id, first_id + rows.size, dtype=np.int64)
        self._row_of = dict(zip(self.ids.tolist(), rows.tolist(), strict=True))
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
        if not math.isfinite(clip):
            raise PrivacyInputError(
                "clip", clip, "canaries need a finite clip (their update is scaled to it)"
            )
        return self.directions[self._row_of[int(cid)]] * clip

    def observe(self, before: np.ndarray, after: np.ndarray, initial: np.ndarray) -> None:
        """Score the model released this round (``after``; ``before``: the model of the round before; ``initial``:
        round 0's) against every direction."""
        step = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
        self.all_rounds = np.maximum(self.all_rounds, canary_cosines(step, self.directions))
        self.final = canary_cosines(np.asarray(after, dtype=np.float64) - initial, self.directions)
        self.rounds_seen += 1

    def estimates(self) -> dict[str, Any]:
        """The row's ``empirical_privacy``: Andrew et al.'s estimates (final-model and all-rounds) and Steinke et
        al.'s lower bound (all-rounds scores), with what they were computed from. Labelled estimates."""
        inc = self.included
        out: dict[str, Any] = {
            "kind": "empirical estimates from canary clients, not certificates",
            "canaries_inserted": self.inserted,
            "canaries_held_out": int((~inc).sum()),
            "confidence": self.confidence,
        }
        for name, scores in (("final", self.final), ("all_rounds", self.all_rounds)):
            try:
                est = andrew_estimate(scores[inc], scores[~inc], self.delta)
            except ValueError:  # fewer than 2 canaries on a side: no estimate
                out[f"andrew_epsilon_{name}"] = None
                continue
            out[f"andrew_epsilon_{name}"] = _finite_or_none(est["epsilon"])
            out[f"andrew_{name}_cosines"] = {k: float(est[k]) for k in ("mu_in", "sd_in", "mu_out", "sd_out")}
        audit = one_run_audit(self.all_rounds, inc, self.delta, confidence=self.confidence)
        out["steinke_epsilon_lower_bound"] = float(audit["epsilon_lower_bound"])
        out["steinke_guesses"] = int(audit["guesses"])
        out["steinke_correct"] = int(audit["correct"])
        return out


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
    est = estimates.get("andrew_epsilon_all_rounds")
    if est is not None and certified is not None and math.isfinite(certified) and est > certified:
        lines.append(
            f"the estimate {est:.3g} exceeds the certified epsilon {certified:.3g}: an estimate from "
            f"{estimates.get('canaries_inserted')} + {estimates.get('canaries_held_out')} canaries' fitted Gaussians, "
            "not a bound (more canaries narrow it); the lower bound is what would refute the certificate"
        )
    if est is not None and certified is not None and math.isfinite(certified) and est < 0.5 * certified:
        lines.append(
            f"the estimate {est:.3g} is far below the certified epsilon {certified:.3g}: the accountant may be "
            "loose for this run (or these canaries a weak attack); it does not mean the run is more private "
            "than certified"
        )
    return lines
