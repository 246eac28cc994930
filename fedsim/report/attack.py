"""A client-level membership-inference attack, each evaluated round: does the model tell its training clients from
clients it never saw?

The loss-threshold attack of Yeom et al. (2018), at the level of clients: a client's score is its mean loss under
the released model; members are training clients, non-members held-out clients, in balanced sets (as many of
each, drawn without replacement from the larger group by a generator of the seed and the round). The attacker
says "member" when the loss is at most a threshold. Reported:

* ``accuracy``: at the best threshold for these sets (the attacker knows the threshold that works best: an
  optimistic, upper figure for this attack; it is above 0.5 by chance alone on small sets: for indistinguishable
  clients it averages 0.59 on 20 pairs and 0.53 on 200, 95th percentiles 0.68 and 0.56);
* ``accuracy_train_mean``: at Yeom et al.'s threshold, the mean loss over the training clients;
* ``auc``: the area under the ROC curve of the score (threshold-free; 0.5 is chance);
* ``pairs``: members (= non-members) in the sets.

The result uses training clients' losses: a non-private diagnostic (epsilon does not cover it), reported under
``non_private`` like the training accuracy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import rankdata


def client_losses(rows: np.ndarray) -> np.ndarray:
    """Mean loss per client from evaluation rows (:data:`fedsim.training.evaluation.COLUMNS`: ``[client, n,
    loss_sum, ...]``; clients with data only)."""
    rows = np.asarray(rows, dtype=float)
    keep = rows[:, 1] > 0
    return rows[keep, 2] / rows[keep, 1]


def loss_threshold_attack(
    member_losses: np.ndarray, nonmember_losses: np.ndarray, rng: np.random.Generator
) -> dict[str, Any]:
    """The attack on balanced sets drawn from the two groups (see the module docstring)."""
    m = np.asarray(member_losses, dtype=float)
    n = np.asarray(nonmember_losses, dtype=float)
    m, n = m[np.isfinite(m)], n[np.isfinite(n)]
    k = int(min(m.size, n.size))
    if k == 0:
        return {"accuracy": None, "accuracy_train_mean": None, "auc": None, "pairs": 0}
    if m.size > k:
        m = rng.choice(m, size=k, replace=False)
    if n.size > k:
        n = rng.choice(n, size=k, replace=False)
    scores = np.concatenate([m, n])
    is_member = np.concatenate([np.ones(k, bool), np.zeros(k, bool)])
    # every threshold between distinct scores: predict member when score <= t
    order = np.argsort(scores, kind="stable")
    s, mem = scores[order], is_member[order]
    members_at_or_below = np.cumsum(mem)
    nonmembers_above = k - (np.arange(1, 2 * k + 1) - members_at_or_below)
    last_of_tie = np.r_[s[1:] != s[:-1], True]  # a threshold cannot split equal scores
    correct = (members_at_or_below + nonmembers_above)[last_of_tie]
    best = max(int(correct.max()), k)  # t below every score: all "non-member", k correct
    yeom = float(((m <= m.mean()).sum() + (n > m.mean()).sum()) / (2 * k))
    # AUC of "lower loss means member" (Mann-Whitney U, ties counted half)
    ranks = rankdata(-scores)
    auc = float((ranks[:k].sum() - k * (k + 1) / 2) / (k * k))
    return {"accuracy": best / (2 * k), "accuracy_train_mean": yeom, "auc": auc, "pairs": k}


def attack_columns(
    train_rows: np.ndarray, heldout_rows: np.ndarray, seed: int, round_: int
) -> dict[str, Any]:
    """``non_private.attack`` of a row."""
    rng = np.random.default_rng(
        [int(seed), int(round_), 0x4D1A]
    )  # its own generator: touches no other stream
    return loss_threshold_attack(client_losses(train_rows), client_losses(heldout_rows), rng)
