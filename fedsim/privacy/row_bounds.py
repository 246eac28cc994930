"""What a run's rows say for privacy beyond the certified epsilon: the papers' closed-form bounds (the nominal
mechanisms of a round, the bounds per round and the audit of them) and the generalization statement the epsilon
implies (:func:`privacy_columns`), read from the strategy (and, for the audit, the scenario's rounds and delta).

Every function takes the strategy and scenario by their attributes (``scheduled``, ``noise``, ``mechanism``,
``round_releases``, ``rounds``, ``privacy.delta``), so this module needs neither the strategies nor the scenarios
package; the report writes what it returns into each row and ``summary.json``. The papers' closed forms (IGMM, its
correction, the generalization population) analyse independent rounds under poisson, fixed or all sampling: a run
accounted over a participation schedule, or noised by a mechanism that says the closed forms do not describe it
(``NoiseSource.paper_bounds``, False for noise correlated across rounds), gets the reason instead of a number.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedsim.privacy import Mechanism, PrivacyInputError, compose_same_cohort, epsilon_curve
from fedsim.privacy.paper import audit_closed_forms, generalization_statement, min_population


def _closed_forms_apply(strategy: Any) -> bool:
    """Whether the papers' closed forms describe the strategy's rounds: not for a run accounted over a schedule,
    nor for a noise mechanism whose class says they do not (an absent flag: independent noise, they do)."""
    noise = getattr(strategy, "noise", None)
    return not getattr(strategy, "scheduled", False) and bool(getattr(type(noise), "paper_bounds", True))


def round_mechanisms(strategy: Any, population: int) -> dict[str, Mechanism]:
    """The scenario's nominal mechanisms: ``model`` (the model release alone, what the papers analyse) and
    ``round`` (every release of a round on its cohort, composed: model plus adaptive clipping's count or
    agnostic FL's domain losses), which is what the ledger accounts. A run accounted over a participation schedule
    or with correlated noise has no per-round mechanism that the papers' closed forms describe: an error says so
    (the paper bounds and the audit then report it instead of a number)."""
    if not _closed_forms_apply(strategy):
        accounting = getattr(strategy, "accounting", None)
        raise PrivacyInputError(
            "privacy",
            accounting.describe() if accounting is not None else strategy.sampling,
            "the papers' closed forms (IGMM, its correction, the generalization population) analyse independent "
            "rounds under poisson, fixed or all sampling; this run is accounted over its schedule by dp-accounting",
        )
    model = strategy.mechanism(population)
    return {"model": model, "round": compose_same_cohort(m for _, m in strategy.round_releases(model))}


def paper_bounds(strategy: Any, population: int, rounds: int, delta: float) -> dict[str, np.ndarray]:
    """The closed-form bounds per round: ``igmm`` as printed for the model release (the paper's claim),
    ``igmm-corrected`` (a valid closed-form bound) for all of a round's releases composed."""
    out = {}
    try:
        mechs = round_mechanisms(strategy, population)
    except PrivacyInputError as exc:  # a schedule or correlated noise: the papers make no statement
        return {
            **{m: np.full(rounds, math.nan) for m in ("igmm", "igmm-corrected")},
            **{m + ":error": exc.allowed for m in ("igmm", "igmm-corrected")},
        }
    for method, mech in (("igmm", mechs["model"]), ("igmm-corrected", mechs["round"])):
        try:
            out[method] = np.asarray(epsilon_curve(mech, rounds, delta, method=method), dtype=float)
        except Exception as exc:  # a paper bound outside its domain must never stop a run
            out[method] = np.full(rounds, math.nan)
            out[method + ":error"] = str(exc)  # type: ignore[assignment]
    return out


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
    except PrivacyInputError as exc:  # a schedule or correlated noise: what was run, and why no paper bound
        out["error"] = f"{exc.value}: {exc.allowed}"
    except Exception as exc:  # the audit explains paper bounds; it must never cost a run its results
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


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
