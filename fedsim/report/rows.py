"""A round's row, the run's summary, and the one-line console view of a row.

A row holds the private quantities at its top level (the noised releases and functions of them, the certified
epsilon, the paper bounds beside it, held-out metrics of the released model, public parameters) and everything
epsilon does not cover under ``non_private`` (:data:`NON_PRIVATE`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedsim.privacy import Mechanism, compose_same_cohort, epsilon_curve
from fedsim.privacy.paper import audit_closed_forms, generalization_statement, min_population

#: Where a row keeps what epsilon does NOT cover (the strategies' metrics use the same key).
NON_PRIVATE = "non_private"


def round_mechanisms(strategy: Any, population: int) -> dict[str, Mechanism]:
    """The scenario's nominal mechanisms: ``model`` (the model release alone, what the papers analyse) and
    ``round`` (every release of a round on its cohort, composed: model plus adaptive clipping's count or
    agnostic FL's domain losses), which is what the ledger accounts."""
    model = strategy.mechanism(population)
    return {"model": model, "round": compose_same_cohort(m for _, m in strategy.round_releases(model))}


def paper_bounds(strategy: Any, population: int, rounds: int, delta: float) -> dict[str, np.ndarray]:
    """The closed-form bounds per round: ``igmm`` as printed for the model release (the paper's claim),
    ``igmm-corrected`` (a valid closed-form bound) for all of a round's releases composed."""
    out = {}
    mechs = round_mechanisms(strategy, population)
    for method, mech in (("igmm", mechs["model"]), ("igmm-corrected", mechs["round"])):
        try:
            out[method] = np.asarray(epsilon_curve(mech, rounds, delta, method=method), dtype=float)
        except Exception as exc:  # a paper bound outside its domain must never stop a run
            out[method] = np.full(rounds, math.nan)
            out[method + ":error"] = str(exc)  # type: ignore[assignment]
    return out


def format_row(row: dict[str, Any], rounds: int) -> str:
    def f(v: Any, spec: str = ".3f") -> str:
        return "  n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)

    gen = row.get("generalization", {})
    diag = row.get(NON_PRIVATE, {})
    failed = diag.get("failed") or {}
    failures = (" failed " + ",".join(f"{k}={v}" for k, v in failed.items())) if failed else ""
    return (
        f"round {row['round']:>3}/{rounds} | cohort {diag.get('cohort', '?'):>3}{failures} | "
        f"train loss {f(diag.get('train_loss'))} acc {f(diag.get('train_accuracy'))} | "
        f"held-out loss {f(row.get('heldout_loss'))} acc {f(row.get('heldout_accuracy'))} | "
        f"gap {f(diag.get('gap_accuracy'), '+.3f')} | "
        f"eps {f(row['epsilon'], '.3f')} (delta={row['delta']:.0e}, {row['accountant']}) | "
        f"bound {gen.get('status', 'n/a')}"
    )


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
        if data.num_domains > 1:
            cols["domains_heldout"] = domain_means(heldout_rows, data)
            cols["worst_domain_heldout_loss"] = max(
                d["loss"] for d in cols["domains_heldout"] if d["clients"]
            )
    if train_rows is not None:
        tr = client_means(train_rows)
        diag: dict[str, Any] = {"train_loss": tr["loss"], "train_accuracy": tr["accuracy"]}
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


def privacy_columns(
    round_: int, epsilon: float, bounds: dict[str, np.ndarray], delta: float, population: int
) -> dict[str, Any]:
    """The paper bounds beside the certified epsilon, and the generalization statement it implies."""
    cols: dict[str, Any] = {}
    for method in ("igmm", "igmm-corrected"):
        v = float(bounds[method][round_ - 1])
        cols[f"paper_epsilon_{method}"] = v if math.isfinite(v) else None
    cols["generalization"] = generalization_statement(epsilon, delta, population)
    return cols


PRIVACY_SCOPE = (
    "epsilon (certified by dp-accounting) covers every noised release recorded in ledger.json: the model "
    "updates and, where used, adaptive clipping's noised count and agnostic FL's noised domain losses; held-out "
    "metrics are computed from the released model on clients outside the training population. It does NOT "
    "cover the values under 'non_private' in each row (exact cohort, reply and rejection counts, un-noised "
    "update-norm statistics, metrics on training clients and the gap computed from them, timings): simulation "
    "diagnostics, which a deployment reports only on request. The population size, the domain sizes and the "
    "schedule are public."
)


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
) -> dict[str, Any]:
    """``summary.json``: the last row's values, what epsilon covers, the audit of the paper bounds."""
    last = rows[-1] if rows else {}
    diag = last.get(NON_PRIVATE, {})
    return {
        "scenario": scenario.name,
        "rounds_completed": len(rows),
        "rounds_planned": scenario.rounds,
        "stopped_reason": stopped,
        "stopped_by": stopped_by,
        "non_private_failed_clients": _failed_totals(rows),  # by reason; epsilon does not cover it
        "final": {
            k: last.get(k)
            for k in (
                "heldout_loss",
                "heldout_accuracy",
                "epsilon",
                "paper_epsilon_igmm",
                "paper_epsilon_igmm-corrected",
                "generalization",
            )
        },
        "final_non_private": {
            k: diag.get(k) for k in ("train_loss", "train_accuracy", "gap_loss", "gap_accuracy")
        },
        "delta": scenario.privacy.delta,
        "accountant": scenario.privacy.accountant,
        "randomness": strategy.randomness,
        "privacy_scope": PRIVACY_SCOPE,
        "certified": "epsilon is certified by dp-accounting. paper_epsilon_igmm is UAI Theorem 7 as printed, for "
        "the model release alone (as the paper states it): a paper bound, not a certificate (see `fedsim "
        "privacy`). paper_epsilon_igmm-corrected is a valid closed-form bound (not dp-accounting) for all of a "
        "round's releases composed",
        "timings": timings,
        "paper_bounds_audit": audit(scenario, strategy, population),
    }


def audit(scenario: Any, strategy: Any, population: int) -> dict[str, Any]:
    """Verdicts on the closed-form paper bounds for the scenario's nominal model release, and how many clients
    the generalization statement would need for all of a round's releases (``None``: no population suffices
    at this epsilon)."""
    out: dict[str, Any] = {}
    try:
        mechs = round_mechanisms(strategy, population)
        found = audit_closed_forms(mechs["model"], scenario.rounds, scenario.privacy.delta)
        out["verdicts"] = {k: v.get("verdict") for k, v in found.items() if isinstance(v, dict)}
        out["verdicts_describe"] = "the model release alone, as the papers state their theorems"
        out["min_population_for_statement"] = min_population(
            mechs["round"], scenario.rounds, scenario.privacy.delta
        )
        out["min_population_describes"] = "all of a round's releases composed (what the ledger accounts)"
    except Exception as exc:  # the audit explains paper bounds; it must never cost a run its results
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def client_means(rows: np.ndarray) -> dict[str, float]:
    """Client-level means (each client weighs the same: the unit of privacy and of generalization)."""
    rows = rows[rows[:, 1] > 0]
    if rows.size == 0:
        return {"loss": math.nan, "accuracy": math.nan, "clients": 0}
    loss = rows[:, 2] / rows[:, 1]
    acc = rows[:, 3] / rows[:, 1]
    return {"loss": float(loss.mean()), "accuracy": float(acc.mean()), "clients": int(rows.shape[0])}


def domain_means(rows: np.ndarray, data: Any) -> list[dict[str, float]]:
    """:func:`client_means` per domain (index = domain)."""
    doms = (
        np.array([data.domain(int(c)) for c in rows[:, 0]], dtype=np.int64) if len(rows) else np.zeros(0, int)
    )
    return [client_means(rows[doms == d]) for d in range(int(data.num_domains))]
