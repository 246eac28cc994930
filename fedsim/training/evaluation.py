"""What evaluating the global model on one client gives: one row of :data:`COLUMNS` per client.

Classification (labels ``[n]``, outputs ``[n, classes]``) and sequence tasks (targets ``[n, *T]``, outputs
``[n, *T, classes]``) share one layout, so that every engine, the Flower ClientApp and the reports handle both:

* ``examples``, ``loss_sum``: the number of examples and the sum of their per-example losses (the user's loss, or
  the default cross-entropy, which for a sequence is each example's mean over its scored tokens);
* ``correct``, ``scored``: predictions (argmax over the last axis of the outputs) equal to the target, and the
  number of targets scored: every label for classification, every token that is not
  :data:`~fedsim.factories.IGNORE_INDEX` for a sequence. Accuracy is ``correct / scored``: token accuracy for a
  sequence task. NaN when the outputs are not ``[*target_shape, classes]`` (a user loss on another shape);
* ``nll_sum``: for a sequence task with the default cross-entropy, the summed negative log-likelihood of the
  scored tokens (perplexity is ``exp(nll_sum / scored)``); NaN otherwise;
* ``metric_sum``: the sum over examples of the scenario's ``model.metric``; NaN without one.

:func:`client_means` turns rows into client-level means (each client weighs the same, the unit of privacy); it is
here, beside the rows it reads, so that the deployed ClientApp reports its client's means without importing the
report package (which writes them into a run's rows, :mod:`fedsim.report.rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedsim.factories import IGNORE_INDEX, cross_entropy, per_example

COLUMNS: tuple[str, ...] = ("client", "examples", "loss_sum", "correct", "scored", "nll_sum", "metric_sum")
"""The columns of an evaluation row, in order."""
WIDTH = len(COLUMNS)
COL = {name: i for i, name in enumerate(COLUMNS)}


def is_sequence(targets: torch.Tensor) -> bool:
    """Targets with a time (or other) axis after the example axis: a sequence task."""
    return targets.dim() > 1


def evaluate_outputs(
    outputs: torch.Tensor,
    targets: torch.Tensor,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float, float, float, float]:
    """``(loss_sum, correct, scored, nll_sum, metric_sum)`` of one client's outputs (see the module docstring)."""
    losses = per_example(loss, outputs, targets)
    loss_sum = float(losses.sum())
    nll_sum = math.nan
    if outputs.dim() == targets.dim() + 1 and outputs.shape[:-1] == targets.shape:
        keep = targets != IGNORE_INDEX
        correct = float(((outputs.argmax(-1) == targets) & keep).sum())
        scored = float(keep.sum())
        if loss is cross_entropy and is_sequence(targets):
            # an example's loss is its mean over its scored tokens: times their number, their summed NLL
            nll_sum = float((losses.double() * keep.reshape(len(targets), -1).sum(1)).sum())
    else:
        correct, scored = math.nan, float(targets.shape[0])
    metric_sum = math.nan if metric is None else float(per_example(metric, outputs, targets, "metric").sum())
    return loss_sum, correct, scored, nll_sum, metric_sum


def client_means(rows: np.ndarray) -> dict[str, Any]:
    """Client-level means of evaluation rows (:data:`COLUMNS`): each client weighs the same, the unit of privacy
    and of generalization. ``loss``: the mean over clients of their mean per-example loss; ``accuracy``: of
    ``correct / scored`` (token accuracy for a sequence task); for a sequence task with the default cross-entropy,
    ``perplexity``: ``exp`` of the mean over clients of their per-token negative log-likelihood; with a
    ``model.metric``, ``metric``: the mean over clients of its per-example mean."""
    rows = rows[rows[:, COL["examples"]] > 0]
    if rows.size == 0:
        return {"loss": math.nan, "accuracy": math.nan, "clients": 0}
    n, scored = rows[:, COL["examples"]], rows[:, COL["scored"]]
    out: dict[str, Any] = {"loss": float((rows[:, COL["loss_sum"]] / n).mean())}
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = rows[:, COL["correct"]] / scored
        nll = rows[:, COL["nll_sum"]] / scored
    acc, nll = acc[np.isfinite(acc)], nll[np.isfinite(nll)]
    out["accuracy"] = float(acc.mean()) if acc.size else math.nan
    if nll.size:
        out["perplexity"] = float(math.exp(min(nll.mean(), 700.0)))
    metric = rows[:, COL["metric_sum"]]
    if np.isfinite(metric).any():
        out["metric"] = float(np.nanmean(metric / n))
    out["clients"] = int(rows.shape[0])
    return out


def domain_means(rows: np.ndarray, data: Any) -> list[dict[str, float]]:
    """:func:`client_means` per domain (index = domain) of ``data`` (a :class:`~fedsim.data.FederatedData`)."""
    doms = (
        np.array([data.domain(int(c)) for c in rows[:, 0]], dtype=np.int64) if len(rows) else np.zeros(0, int)
    )
    return [client_means(rows[doms == d]) for d in range(int(data.num_domains))]
