"""Private agnostic federated learning (Mohri, Sivek and Suresh, ICML 2019) on top of DP-FedAvg.

AFL solves ``min_w max_{lambda in simplex} sum_d lambda_d L_d(w)`` over client domains ``d``: the server keeps
mixture weights ``lambda`` and alternates a model step on the ``lambda``-weighted objective with projected
gradient *ascent* on ``lambda`` (the gradient in ``lambda`` is the vector of domain losses).

Two releases per round, both on the round's sampled cohort and both recorded in the ledger:

1. **Model update.** Client ``i`` of domain ``d`` gets weight ``w_i = lambda_d / m_d`` where ``m_d`` is the
   *expected* number of sampled clients of domain ``d`` (``q * N_d``, or its fixed-size analogue). The released
   update is ``sum_i w_i clip(Delta_i) + N(0, (z * clip * max_d w_d)^2 I)``: one client changes the weighted
   sum by at most ``max_d w_d * clip``, so the noise multiplier relative to the sensitivity is ``z``, as in
   DP-FedAvg (with ``lambda`` proportional to domain sizes the two coincide exactly).
2. **Domain losses.** Each sampled client reports its loss of the global model before training, per example
   clipped to ``[0, loss_bound]`` and divided by ``loss_bound``, so in ``[0, 1]``. The per-domain sums get
   ``N(0, loss_noise_multiplier^2)`` each (one client moves one sum by at most 1: L2 sensitivity 1), and
   ``lambda <- Proj_simplex(lambda + lambda_lr * noised_sum_d / m_d)``.

``lambda`` is a function of past noised releases only (post-processing), so the per-client weights of a round
are fixed before any client of that round is seen.

**Domain sizes are public constants.** The number of clients in each domain (``N_d``, hence ``m_d`` and the
weights) is fixed before the run (``domain_sizes``; fedsim's engines pass the scenario's training clients per
domain), like the public population and the schedule, and never recounted from the clients present: one client
added or removed changes nothing released but through the noised sums. Without ``domain_sizes`` the first
round's clients are counted, and those counts are then public (zero-out neighbours). Which domain a given client belongs to is used only to weight that client's own contribution.

A reply whose loss is not a finite number is rejected whole (its update is not aggregated either): clamping
alone would let a NaN through and make ``lambda`` NaN for the rest of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from fedsim.flower import protocol
from fedsim.privacy import Mechanism, PrivacySettings
from fedsim.round import PartialSum, bounded_value, id_array, placement, private_mean
from fedsim.validation import PrivacyInputError, noise_multiplier_value, positive_finite

from .dpfedavg import DPFedAvg, RoundPlan


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (Duchi et al. 2008)."""
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    ks = np.arange(1, v.size + 1)
    rho = np.nonzero(u * ks > css - 1.0)[0][-1]
    theta = (css[rho] - 1.0) / (rho + 1.0)
    return np.maximum(v - theta, 0.0)


#: the name of the per-domain loss release in a round's releases
DOMAIN_LOSSES = "domain-losses"


class DPAgnosticFedAvg(DPFedAvg):
    """DP-FedAvg whose aggregate is the ``lambda``-weighted average over client domains (agnostic FL).

    It takes :class:`DPFedAvg`'s parameters and these.

    Parameters
    ----------
    client_domains
        client id (or Flower node id) -> domain index in ``range(num_domains)``; a mapping or a callable.
    num_domains
        number of domains.
    lambda_lr
        step size of the projected gradient ascent on ``lambda``.
    loss_noise_multiplier
        std of the noise on each per-domain loss sum (sensitivity 1).
    loss_bound
        per-example losses are clipped to ``[0, loss_bound]`` and divided by it (default ``log(10)``, the loss
        of a uniform prediction over 10 classes).
    initial_lambda
        start of ``lambda`` (default: proportional to the domains' sizes, i.e. FedAvg's mixture).
    domain_sizes
        the public number of clients in each domain, fixed before the run (``None``: counted over the first
        round's clients, which makes those counts public).
    """

    def __init__(
        self,
        privacy: PrivacySettings | None = None,
        *,
        client_domains: Mapping[int, int] | Callable[[int], int],
        num_domains: int,
        lambda_lr: float = 0.1,
        loss_noise_multiplier: float = 1.0,
        loss_bound: float = math.log(10),
        initial_lambda: Iterable[float] | None = None,
        domain_sizes: Iterable[int] | None = None,
        **kwargs: Any,
    ) -> None:
        settings = kwargs if privacy is None else vars(privacy)
        if placement(settings.get("noise_placement", "central")).clients_add_noise:
            raise ValueError(
                "DPAgnosticFedAvg supports noise_placement='central' only (the weights are per client)"
            )
        if settings.get("adaptive_clipping") is not None:
            raise ValueError("DPAgnosticFedAvg does not combine with adaptive clipping yet; use a fixed clip")
        # the per-domain losses are releases of their own: the privacy settings' rules know (agnostic=True)
        if privacy is None:
            kwargs["agnostic"] = True
        else:
            privacy = privacy.replace(agnostic=True)
        super().__init__(privacy, **kwargs)
        if int(num_domains) < 1:
            raise PrivacyInputError("num_domains", num_domains, "must be an integer >= 1")
        lambda_lr = positive_finite("lambda_lr", lambda_lr)
        loss_noise_multiplier = noise_multiplier_value("loss_noise_multiplier", loss_noise_multiplier, None)
        loss_bound = positive_finite("loss_bound", loss_bound)
        self.num_domains = int(num_domains)
        self._domain_of = (
            client_domains.__getitem__ if isinstance(client_domains, Mapping) else client_domains
        )
        self.lambda_lr = float(lambda_lr)
        self.loss_noise_multiplier = float(loss_noise_multiplier)
        self.loss_bound = float(loss_bound)
        self.lam: np.ndarray | None = None
        if initial_lambda is not None:
            lam = np.asarray(list(initial_lambda), dtype=np.float64)
            if (
                lam.shape != (self.num_domains,)
                or np.any(lam < 0)
                or not math.isclose(lam.sum(), 1.0, rel_tol=1e-9)
            ):
                raise ValueError(
                    f"initial_lambda must be {self.num_domains} non-negative numbers summing to 1"
                )
            self.lam = lam
        self._domain_sizes: np.ndarray | None = None
        if domain_sizes is not None:
            sizes = np.asarray(list(domain_sizes), dtype=np.float64)
            if sizes.shape != (self.num_domains,) or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
                raise PrivacyInputError(
                    "domain_sizes",
                    list(domain_sizes),
                    f"must be {self.num_domains} non-negative client counts",
                )
            self._set_domain_sizes(sizes)

    def _set_domain_sizes(self, sizes: np.ndarray) -> None:
        if np.any(sizes == 0):
            empty = np.nonzero(sizes == 0)[0].tolist()
            raise ValueError(f"domains {empty} have no training client; every domain needs at least one")
        self._domain_sizes = sizes
        if self.lam is None:
            self.lam = sizes / sizes.sum()

    def state_dict(self) -> dict[str, Any]:
        """:meth:`DPFedAvg.state_dict` and the mixture weights lambda."""
        return {**super().state_dict(), "lambda": None if self.lam is None else self.lam.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        lam = state.get("lambda")
        self.lam = None if lam is None else np.asarray(lam, dtype=np.float64)

    def domain(self, client: int) -> int:
        d = int(self._domain_of(int(client)))
        if not 0 <= d < self.num_domains:
            raise ValueError(f"client {client} has domain {d}, outside 0..{self.num_domains - 1}")
        return d

    # ------------------------------------------------------------------ releases and weights
    def _loss_mechanism(self, model: Mechanism) -> Mechanism:
        return model.replace(clip=1.0, noise_multiplier=self.loss_noise_multiplier)

    def round_releases(self, model: Mechanism) -> list[tuple[str, Mechanism]]:
        return [("model", model), (DOMAIN_LOSSES, self._loss_mechanism(model))]

    def _expected_per_domain(self, model: Mechanism) -> np.ndarray:
        """Expected sampled clients per domain: the population's domain sizes times the sampling probability."""
        assert self._domain_sizes is not None
        return np.maximum(self._domain_sizes * model.q, 1e-12)

    def begin_round(self, server_round: int, client_ids: Iterable[int]) -> RoundPlan:
        ids = id_array(client_ids)
        if self._domain_sizes is None:  # no public sizes given: the first round's counts, public from then on
            doms = np.array([self.domain(c) for c in ids], dtype=np.int64)
            self._set_domain_sizes(np.bincount(doms, minlength=self.num_domains).astype(np.float64))
        plan = super().begin_round(server_round, ids)
        per_client = self.lam / self._expected_per_domain(plan.mechanism)
        plan.client_weights = {int(c): float(per_client[self.domain(c)]) for c in plan.cohort}
        plan.loss_bound = self.loss_bound
        return plan

    def _weight_scale(self, plan: RoundPlan) -> float:
        assert self.lam is not None
        return float(np.max(self.lam / self._expected_per_domain(plan.mechanism)))

    def _noised_mean(self, plan: RoundPlan, partial: PartialSum) -> tuple[np.ndarray, float]:
        # The partial sum is already weighted: one client moves it by at most (largest weight * clip), so the noise
        # is z times that sensitivity: the model release with the weighted clip, over no further denominator.
        weighted = plan.mechanism
        if weighted.private:
            weighted = weighted.replace(clip=weighted.clip * self._weight_scale(plan))
        return private_mean(partial, weighted, self.noise, plan.round, denominator=1.0)

    def _after_release(self, plan: RoundPlan, partial: PartialSum, metrics: dict[str, Any]) -> None:
        assert self.lam is not None
        sums = partial.extras.get("domain_loss", np.zeros(self.num_domains))
        losses = plan.release(DOMAIN_LOSSES)
        assert losses is not None
        noised = sums + self.noise.noise(plan.round, "loss", self.num_domains, losses.noise_std)
        est = noised / self._expected_per_domain(plan.mechanism)
        metrics["lambda_used"] = self.lam.tolist()
        metrics["weight_scale"] = self._weight_scale(plan)
        metrics["domain_loss_noised"] = est.tolist()
        self.lam = project_to_simplex(self.lam + self.lambda_lr * est)
        metrics["lambda_next"] = self.lam.tolist()

    # ------------------------------------------------------------------ Flower Message API
    def accept_reply(
        self, plan: RoundPlan, partial: PartialSum, client: int, update: np.ndarray, metrics: dict[str, float]
    ) -> None:
        assert plan.client_weights is not None
        if client not in plan.client_weights:  # a reply from a node that was not sampled: never aggregated
            partial.reject(reason="not_sampled")
            return
        # the loss enters a noised sum: a missing or non-finite one rejects the whole reply; else bound to [0, 1]
        loss = bounded_value(metrics.get(protocol.MET_LOSS, math.nan), 0.0, 1.0)
        if loss is None:
            partial.reject(reason="non_finite")
            return
        count = partial.count
        partial.add(update, plan.clip, weight=plan.client_weights[client])
        if partial.count > count:  # the update was accepted: its loss joins the per-domain sums
            partial.add_extra("domain_loss", self.domain(client), loss, self.num_domains)
