"""A round's row, the run's summary, and the one-line console view of a row.

A row holds the private quantities at its top level (the noised releases and functions of them, the certified
epsilon, the paper bounds beside it, held-out metrics of the released model, public parameters) and everything
epsilon does not cover under ``non_private`` (:data:`NON_PRIVATE`).

What a row's paper bounds mean (:func:`paper_bounds`, :func:`round_mechanisms`, :func:`audit`) lives with the
privacy code (:mod:`fedsim.privacy.row_bounds`), and the client-level means of evaluation rows with the evaluation
that makes them (:func:`fedsim.training.evaluation.client_means`), where a client app imports them without this
package; both are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedsim.labels import INFINITE, NON_PRIVATE, REASON_SUFFIX
from fedsim.privacy.row_bounds import audit
from fedsim.privacy.row_bounds import paper_bounds as paper_bounds
from fedsim.privacy.row_bounds import privacy_columns as privacy_columns
from fedsim.privacy.row_bounds import round_mechanisms as round_mechanisms
from fedsim.training.evaluation import client_means, domain_means

#: opens the group of a console row that epsilon does not cover (the row's ``non_private``); ``]`` closes it
CONSOLE_NON_PRIVATE = "[non-private:"


def format_row(row: dict[str, Any], rounds: int) -> str:
    """The console line of a row (``fedsim run``): the held-out metrics of the released model, the certified
    epsilon and the generalization statement first, then, in one bracketed group opened by
    :data:`CONSOLE_NON_PRIVATE`, the exact facts about clients that epsilon does not cover (the cohort, failures
    by reason, the training clients' loss and accuracy, the gap computed from them). Print it without markup."""

    def f(v: Any, spec: str = ".3f") -> str:
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return "  n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)

    gen = row.get("generalization", {})
    diag = row.get(NON_PRIVATE, {})
    failed = diag.get("failed") or {}
    failures = (", failed " + " ".join(f"{k}={v}" for k, v in failed.items())) if failed else ""
    extra = "".join(
        f" {label} {f(row[f'heldout_{k}'], '.2f')}"
        for k, label in (("perplexity", "ppl"), ("metric", "metric"))
        if f"heldout_{k}" in row
    )
    return (
        f"round {row['round']:>3}/{rounds} | "
        f"held-out loss {f(row.get('heldout_loss'))} acc {f(row.get('heldout_accuracy'))}{extra} | "
        f"eps {'inf (not private)' if row.get('private') is False else f(row['epsilon'], '.3f')} "
        f"(delta={row['delta']:.0e}, {row['accountant']}) | "
        f"bound {gen.get('status', 'n/a')} | "
        f"{CONSOLE_NON_PRIVATE} cohort {diag.get('cohort', '?'):>3}{failures}, "
        f"train loss {f(diag.get('train_loss'))} acc {f(diag.get('train_accuracy'))}, "
        f"gap {f(diag.get('gap_accuracy'), '+.3f')}]"
    )


#: how a non-private run's epsilon is shown: infinite, by every accountant
NOT_PRIVATE_TEXT = "infinite (not private: noise_multiplier = 0)"


def format_epsilon(row: dict[str, Any], key: str = "epsilon", spec: str = ".3f") -> str:
    """A row's epsilon for people: a number, ``infinite`` (an infinite value, or null with ``<key>_reason`` in a
    file: no finite epsilon at this delta) or ``n/a``."""
    v = row.get(key)
    if (
        row.get("private") is False
    ):  # a release without noise (noise_multiplier = 0, or clip = 0): the baseline
        return NOT_PRIVATE_TEXT
    if isinstance(v, int | float) and not isinstance(v, bool):
        if math.isinf(v):
            return "infinite (no finite epsilon at this delta)" if v > 0 else "-infinite"
        return "n/a" if math.isnan(v) else format(v, spec)
    if v is None and row.get(key + REASON_SUFFIX) == INFINITE:
        return "infinite (no finite epsilon at this delta)"
    return "n/a"


#: client-level means reported only for some tasks: sequence tasks (perplexity), a ``model.metric`` (metric)
EXTRA_MEANS: tuple[str, ...] = ("perplexity", "metric")


def evaluation_columns(
    data: Any, train_rows: np.ndarray | None, heldout_rows: np.ndarray | None
) -> dict[str, Any]:
    """Client-level loss/accuracy on training and held-out clients, their gap, and per-domain metrics.

    Held-out clients never contribute to the model, so their metrics are post-processing of the private model
    on data outside the population epsilon is about: top level. Metrics on training clients, and the gap that
    uses them, are not covered by epsilon: under ``non_private`` (``train_rows=None``: not computed)."""
    cols: dict[str, Any] = {}
    if heldout_rows is not None:
        ho = client_means(heldout_rows)
        cols.update(heldout_loss=ho["loss"], heldout_accuracy=ho["accuracy"])
        cols.update({f"heldout_{k}": ho[k] for k in EXTRA_MEANS if k in ho})
        if data.num_domains > 1:
            cols["domains_heldout"] = domain_means(heldout_rows, data)
            cols["worst_domain_heldout_loss"] = max(
                d["loss"] for d in cols["domains_heldout"] if d["clients"]
            )
    if train_rows is not None:
        tr = client_means(train_rows)
        diag: dict[str, Any] = {"train_loss": tr["loss"], "train_accuracy": tr["accuracy"]}
        diag.update({f"train_{k}": tr[k] for k in EXTRA_MEANS if k in tr})
        if heldout_rows is not None:
            diag.update(
                gap_loss=cols["heldout_loss"] - tr["loss"],
                gap_accuracy=tr["accuracy"] - cols["heldout_accuracy"],
            )
        if data.num_domains > 1:
            diag["domains_train"] = domain_means(train_rows, data)
            diag["worst_domain_train_loss"] = max(d["loss"] for d in diag["domains_train"] if d["clients"])
        cols[NON_PRIVATE] = diag
    return cols


def merge_columns(row: dict[str, Any], cols: dict[str, Any]) -> dict[str, Any]:
    """``row.update(cols)``, merging the two ``non_private`` parts instead of replacing one with the other."""
    cols = dict(cols)
    diag = cols.pop(NON_PRIVATE, None)
    row.update(cols)
    if diag:  # in place: the loop keeps adding to the row's non_private dict after evaluation (round_time_s)
        row.setdefault(NON_PRIVATE, {}).update(diag)
    return row


PRIVACY_SCOPE = (
    "epsilon (certified by dp-accounting) covers every noised release recorded in ledger.json: the model "
    "updates and, where used, adaptive clipping's noised count and agnostic FL's noised domain losses; held-out "
    "metrics are computed from the released model on clients outside the training population. It does NOT "
    "cover (non-private, exact facts about clients; simulation diagnostics, which a deployment reports only on "
    "request): the values under 'non_private' in each row of metrics.jsonl (exact cohort, reply, rejection and "
    "failure counts, un-noised update-norm statistics, metrics on training clients and the gap computed from "
    "them, the training paths the clients actually used, timings); in summary.json, 'non_private' (timings, "
    "which grow with the realised cohort, and after a stop because too many of a round's clients failed: "
    "stopped_by, stopped_reason and rounds_completed, which are then not at the top level; how many rounds were "
    "released is still seen in ledger.json and metrics.jsonl, as every release is), "
    "'final_non_private' and 'non_private_failed_clients'; 'non_private' in data.json (exact examples per "
    "client, label entropy, totals of the partition); the training-client accuracy and the gap drawn from it "
    "in plots/accuracy.png, the training-client loss and gap in plots/loss.png, the membership-inference attack "
    "in plots/attack.png, and the measured gap in plots/generalization.png; trackers' 'non_private' scalars "
    "(TensorBoard, MLflow); in sweep.csv, the columns named non_private_*; on the console, the bracketed "
    "'[non-private: ...]' group of each round's line (cohort, failures, training-client loss and accuracy, gap), "
    "the train accuracy and gap of the 'final' line, and the 'failures' line of a run stopped by client failures "
    "(exit code 4). The population size, the domain sizes and the schedule are "
    "public, and so is a stop by the privacy budget (stopped_by 'budget': a function of public parameters and "
    "the accountant), and so are the training path and why faster paths were refused (local_training, "
    "local_training_fallbacks: a function of the model and the settings)."
)

#: why a run stopped that is a function of public parameters and the accountant only (privacy.max_epsilon):
#: it may stay at the top level of summary.json. Any other stop (``"failures"``: more than
#: engine.max_failed_fraction of a round's clients failed) is an exact fact about clients.
PUBLIC_STOPS = frozenset({"budget"})


def _failed_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Failed clients over all rounds, by reason (non-private, like the per-round counts)."""
    out: dict[str, int] = {}
    for row in rows:
        for reason, n in (row.get(NON_PRIVATE, {}).get("failed") or {}).items():
            out[reason] = out.get(reason, 0) + int(n)
    return out


def summary(
    scenario: Any,
    rows: list[dict[str, Any]],
    strategy: Any,
    stopped: str | None,
    timings: dict,
    population: int,
    stopped_by: str | None = None,
    diagnostics: bool = True,
    *,
    local_training: str | None = None,
    local_training_fallbacks: Sequence[str] | None = None,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json``: the last row's values, what epsilon covers, the audit of the paper bounds.

    ``local_training``: the path the trainers took (as in every row), ``local_training_fallbacks``: why they
    refused the faster ones (:func:`fedsim.loop.training_fallbacks`); public, ``None`` where the engine does not
    say. ``engine``: the engine that trained the rounds, the one asked for and why ``auto`` picked it
    (:func:`fedsim.loop.engine_description`; public: settings and the machine).

    What is exact about clients is under ``non_private``: the timings (with ``diagnostics``), and after a stop
    that is not in :data:`PUBLIC_STOPS` (a stop by client failures), ``stopped_by``, ``stopped_reason`` and
    ``rounds_completed``, which are then absent from the top level. A stop by the budget is a function of the
    schedule, the mechanism and the accountant (public), so it stays at the top level.
    """
    fallbacks = None if local_training_fallbacks is None else list(local_training_fallbacks)
    last = rows[-1] if rows else {}
    diag = last.get(NON_PRIVATE, {})
    stop = {"rounds_completed": len(rows), "stopped_reason": stopped, "stopped_by": stopped_by}
    public_stop = stopped_by is None or stopped_by in PUBLIC_STOPS
    non_private: dict[str, Any] = {
        "note": "exact facts about clients; epsilon does not cover them (see privacy_scope)",
    }
    if diagnostics:
        non_private["timings"] = timings  # they grow with the realised cohort
    if not public_stop:
        # whether, and when, too many of a round's clients failed. With diagnostics off (a deployment) the
        # operator still learns that and why the run ended (without counts): stopped_reason names no counts
        non_private.update(stop)
    return {
        "scenario": scenario.name,
        **(stop if public_stop else {}),
        "rounds_planned": scenario.rounds,
        "engine": engine,
        # public: a function of the model and the settings (engine.vectorize), the same for every round
        "local_training": local_training,
        "local_training_fallbacks": fallbacks,
        "non_private_failed_clients": _failed_totals(rows),  # by reason; epsilon does not cover it
        # false for the non-private baseline (noise_multiplier = 0, or clip = 0: no noise, epsilon infinite)
        "private": ledger_private(strategy) if rows else None,
        "final": {
            k: last.get(k)
            for k in (
                "private",
                "heldout_loss",
                "heldout_accuracy",
                "epsilon",
                "paper_epsilon_igmm",
                "paper_epsilon_igmm-corrected",
                "generalization",
            )
        },
        # privacy.canaries: measured from canary clients, beside the certified epsilon (estimates, not certificates)
        "empirical_privacy": _empirical(last),
        "final_non_private": {
            k: diag.get(k) for k in ("train_loss", "train_accuracy", "gap_loss", "gap_accuracy")
        },
        "delta": scenario.privacy.delta,
        "accountant": scenario.privacy.accountant,
        **noise_settings(scenario, strategy),
        "randomness": strategy.randomness,
        # the relation epsilon is stated for, and the public population the denominator and q came from (fixed
        # before round 1; "zero-out" when none was: the realised population was then used, and is public)
        "neighbouring": getattr(strategy, "relation", None),
        "public_population": getattr(strategy, "population", None),
        "noise_mechanism": describe_mechanism(strategy),
        "privacy_scope": PRIVACY_SCOPE,
        "certified": "epsilon is certified by dp-accounting. paper_epsilon_igmm is UAI Theorem 7 as printed, for "
        "the model release alone (as the paper states it): a paper bound, not a certificate (see `fedsim "
        "privacy`). paper_epsilon_igmm-corrected is a valid closed-form bound (not dp-accounting) for all of a "
        "round's releases composed",
        NON_PRIVATE: non_private,
        "paper_bounds_audit": audit(scenario, strategy, population),
    }


def noise_settings(scenario: Any, strategy: Any) -> dict[str, Any]:
    """What ``summary.json`` says of the noise the run used (public: settings): ``noise_multiplier`` (the model
    release's, calibrated where ``privacy.target_epsilon`` was given; 0: not private), ``noise_calibration`` (the
    target it was calibrated to, over how many rounds, at which delta by which accountant; None when it was set
    directly) and ``settings_rules`` (how settings that replace each other were merged:
    :func:`fedsim.scenarios.loader.noise_precedence`)."""
    p = scenario.privacy
    z = getattr(strategy, "noise_multiplier", p.noise_multiplier)
    calibration = None
    if p.target_epsilon is not None:
        calibration = {
            "target_epsilon": p.target_epsilon,
            "rounds": scenario.rounds,
            "delta": p.delta,
            "accountant": p.accountant,
        }
    return {
        "noise_multiplier": float(z),
        "noise_calibration": calibration,
        "settings_rules": list(getattr(p, "rules", [])),
    }


def _empirical(last: dict[str, Any]) -> dict[str, Any] | None:
    """The last row's canary estimates with what they mean beside the certified epsilon and the IGMM bound as
    printed (:func:`fedsim.privacy.canaries.interpret`); None for a run without canaries."""
    est = last.get("empirical_privacy")
    if not est:
        return None
    from fedsim.privacy.canaries import interpret

    return {**est, "reading": interpret(last.get("epsilon"), last.get("paper_epsilon_igmm"), est)}


def describe_mechanism(strategy: Any) -> str | None:
    """One line on the noise mechanism and, for a run accounted over a schedule, the schedule and whether
    amplification by sampling is claimed (public: settings only)."""
    accounting = getattr(strategy, "accounting", None)
    if accounting is not None:
        return accounting.describe()
    noise = getattr(strategy, "noise", None)
    return noise.describe() if noise is not None else None


def ledger_private(strategy: Any) -> bool | None:
    """Whether every release in the strategy's ledger was noised (False for the non-private baseline); ``None``
    for a strategy without a ledger."""
    ledger = getattr(strategy, "ledger", None)
    return None if ledger is None else ledger.private


def summary_stop(summary: dict[str, Any]) -> dict[str, Any]:
    """``rounds_completed``, ``stopped_by`` and ``stopped_reason`` of a ``summary.json``, wherever they are (the
    top level, or ``non_private`` after a stop by client failures; older summaries: the top level), and
    ``non_private``: whether they came from there."""
    diag = summary.get(NON_PRIVATE)
    diag = diag if isinstance(diag, dict) else {}
    hidden = "stopped_by" in diag
    source = diag if hidden else summary
    out = {k: source.get(k) for k in ("rounds_completed", "stopped_by", "stopped_reason")}
    out[NON_PRIVATE] = hidden
    return out


def summary_timings(summary: dict[str, Any]) -> dict[str, Any]:
    """The timings of a ``summary.json`` (``non_private.timings``; older summaries: ``timings``), or ``{}``."""
    diag = summary.get(NON_PRIVATE)
    t = diag.get("timings") if isinstance(diag, dict) else summary.get("timings")
    return t if isinstance(t, dict) else {}
