"""DP-FedAvg with client-level differential privacy, as a Flower Message-API strategy.

One round (``docs/architecture.md``): sample the cohort from the strategy's own seeded generator, broadcast, clip
each client's update to flat L2 norm ``clip``, add the noise mechanism's noise of scale ``noise_multiplier * clip``
to the sum (centrally, or as per-client shares), divide by the *expected* cohort size, apply the server
optimizer, and record in the ledger what the mechanism says the round released.

The same object serves two callers:

* Flower (``strategy.start(grid=...)`` in any ServerApp): :meth:`configure_train` / :meth:`aggregate_train`;
* fedsim's engines, which train the cohort themselves and hand back a :class:`PartialSum`:
  :meth:`begin_round` / :meth:`finish_round`.

Both paths run the same code for sampling, clipping, noise and accounting (:mod:`fedsim.privacy`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import Strategy

from fedsim.flower import protocol
from fedsim.labels import NON_PRIVATE
from fedsim.privacy import Ledger, Mechanism, ScheduleAccounting
from fedsim.privacy.mechanism import ZERO_OUT
from fedsim.privacy.schedule import schedule_bounds
from fedsim.privacy.settings import AdaptiveClipping, PrivacySettings, check_combination, deployment_refusal
from fedsim.round import (
    ADD_REMOVE,
    CLIP_COUNT,
    NOISE_SOURCES,
    STREAM_EVALUATION,
    NoiseSource,
    PartialSum,
    RoundPlan,
    Sampler,
    bounded_value,
    check_declared,
    decoded_mean,
    id_array,
    make_noise_source,
    make_sampler,
    placement,
    private_mean,
    randomness_kind,
)
from fedsim.validation import PrivacyInputError

from .server_opt import ServerOptimizer


def check_distributed_noise(settings: Any, opted_in: bool, opt_in: str) -> None:
    """Refuse distributed noise on real Flower nodes unless the operator opted in (``opt_in`` names how):
    :func:`fedsim.privacy.settings.deployment_refusal`, the one rule the ServerApp asks too. Opting in says so in
    the log."""
    why = deployment_refusal(settings, opted_in, opt_in)
    if why:
        raise ValueError(why)
    if getattr(settings, "secagg", None) is not None:
        log(
            INFO,
            "secure aggregation (SecAgg+): the server learns only the sum of the clients' noised encodings",
        )
    elif placement(settings.noise_placement).clients_add_noise:
        log(
            WARNING,
            "%s: distributed noise WITHOUT secure aggregation. The server sees every client's update with only the "
            "client's own noise share; the certified epsilon holds against third parties who see the released "
            "model, not against this server",
            opt_in,
        )


__all__ = ["AdaptiveClipping", "BudgetExhausted", "DPFedAvg", "check_distributed_noise"]


class BudgetExhausted(PrivacyBudgetExhausted):
    """Raised before a round whose release would take the certified epsilon above ``max_epsilon``.

    A :class:`flwr.serverapp.exception.PrivacyBudgetExhausted`: a ServerApp that lets it propagate exits with
    Flower's exit code for an unmet strategy precondition."""


class DPFedAvg(Strategy):
    """Federated averaging with client-level (epsilon, delta)-DP.

    Parameters
    ----------
    privacy
        the run's privacy settings (:class:`fedsim.privacy.PrivacySettings`: sampling and cohort, clip, noise
        multiplier, noise placement, noise mechanism and its options, participation schedule, adaptive
        clipping, delta, accountant, max_epsilon), validated once with the one set of combination rules. A
        Python caller may give the same settings as keywords instead (``DPFedAvg(sampling_rate=0.1,
        noise_multiplier=1.0)``): they build the object. Briefly: ``clip = 0`` is no clipping (plain FedAvg,
        needs ``noise_multiplier = 0``); ``noise_multiplier = 0`` is the un-noised baseline (epsilon
        infinite); ``noise_placement = "distributed"`` has each sampled client add its share of the noise (the
        mechanism's :meth:`~fedsim.round.NoiseSource.share_scale` over the expected cohort, a public number)
        and the server the shares missing below the expected cohort, so the total is at least the accounted
        one; with Flower (:meth:`start`) it is refused unless ``distributed_without_secagg=True``: secure
        aggregation (``privacy.secagg``) runs in fedsim's own ServerApp (:mod:`fedsim.secagg`), whose rounds
        have the protocol's several message exchanges.
    sampling
        as a keyword, also a :class:`fedsim.round.Sampler` object (with its state).
    noise
        a :class:`fedsim.round.NoiseSource` object (with its state) instead of the settings' ``mechanism``
        name; its declarations are checked by the same rules. It provides every noise vector the strategy
        releases and says what the ledger records for each round
        (:meth:`~fedsim.round.NoiseSource.dp_release`).
    server_optimizer
        applied to the private mean update (default: plain SGD with lr 1, i.e. FedAvg).
    seed
        seeds the sampling and noise generators (simulation). ``None`` (the default): every random quantity
        that protects clients (cohort, central noise, the count noise of adaptive clipping) is drawn from the
        operating system's entropy; deployments must use that.
    population
        the public population size, fixed before the run (for example the number of clients the deployment is
        for). Everything released that would depend on the number of clients comes from it, never from the
        realised one, which one client changes under add/remove neighbours: the denominator (the expected
        cohort ``q * population``, or ``population`` for ``"all"``) and, when ``clients_per_round`` is given,
        the sampling probability ``q = clients_per_round / population`` (McMahan et al.'s fixed-denominator
        estimator). The accounting stays over the clients actually sampled from in each round (the connected
        nodes under Flower, the training clients in fedsim's engines), whatever their number. ``None``: each
        round's realised number of clients is used and is therefore public: the guarantee is then for zero-out
        neighbours (a client replaced by one contributing nothing; the same epsilon), which ``relation`` and
        the summary say.
    fraction_evaluate
        fraction of nodes asked for federated evaluation. Client evaluation metrics are *not* privatised nor
        accounted: needs ``diagnostics=True``.
    diagnostics
        also return the round's non-private diagnostics (:data:`NON_PRIVATE`: exact cohort and reply counts,
        un-noised norm statistics) to Flower, which logs them, and allow federated evaluation. Off by default:
        without it, only noised or public quantities leave the strategy through Flower.
    ledger
        a ledger to continue (e.g. ``Ledger.load("ledger.json")`` of an earlier run): its releases count
        toward ``max_epsilon`` and new rounds are recorded after its last round.
    distributed_without_secagg
        accept ``noise_placement="distributed"`` in :meth:`start` although fedsim has no secure aggregation
        (:func:`check_distributed_noise`); the certified epsilon then holds against parties who see the
        released model, not against this server.
    rounds
        the run's planned rounds (a correlated mechanism optimises its noise for them; None: not known).
    """

    def __init__(
        self,
        privacy: PrivacySettings | None = None,
        *,
        server_optimizer: ServerOptimizer | None = None,
        seed: int | None = None,
        population: int | None = None,
        fraction_evaluate: float = 0.0,
        diagnostics: bool = False,
        ledger: Ledger | None = None,
        distributed_without_secagg: bool = False,
        rounds: int | None = None,
        sampling: str | Sampler | None = None,
        noise: str | NoiseSource | None = None,
        **settings: Any,
    ) -> None:
        # the privacy settings: one validated object (fedsim.privacy.settings), given whole or from keywords; a sampler
        # or noise mechanism given as an object (with state, or not registered) is checked by the same rules
        sampler_obj = sampling if isinstance(sampling, Sampler) else None
        noise_obj = noise if isinstance(noise, NoiseSource) else None
        if (
            noise_obj is not None
        ):  # an object drawing its own noise must declare what it releases, registered or not
            check_declared(type(noise_obj))
        if privacy is None:
            if sampling is not None:
                settings["sampling"] = sampling.name if sampler_obj is not None else sampling
            if isinstance(noise, str):  # a name: the registry's (an unknown one is refused)
                settings["mechanism"] = noise
            elif noise_obj is not None and noise_obj.name in NOISE_SOURCES:
                settings["mechanism"] = noise_obj.name
            # an object of an unregistered class: checked below by the same rules, through its own declarations
            privacy = PrivacySettings(**settings)
        else:
            named = (["sampling"] if isinstance(sampling, str) else []) + (
                ["noise"] if isinstance(noise, str) else []
            )
            if settings or named:
                raise PrivacyInputError(
                    "privacy",
                    sorted(settings) + named,
                    "give the privacy settings either as one PrivacySettings or as keywords, not both",
                )
            for what, obj, name in (
                ("sampling", sampler_obj, privacy.sampling),
                ("noise", noise_obj, privacy.mechanism),
            ):
                if obj is not None and obj.name != name and (what == "sampling" or obj.name in NOISE_SOURCES):
                    raise PrivacyInputError(
                        what, obj.name, f"the privacy settings name {what} {name!r}: give one or the other"
                    )
        self.privacy: PrivacySettings = privacy
        # pluggable, with state a checkpoint can save: who takes part, and where the noise comes from
        self.sampler: Sampler = make_sampler(sampler_obj or privacy.sampling, seed)
        self.noise: NoiseSource = (
            make_noise_source(noise_obj, seed) if noise_obj else privacy.noise_source(seed)
        )
        if randomness_kind(self.sampler.seed) != randomness_kind(self.noise.seed):
            raise ValueError(
                f"the sampler's randomness is {randomness_kind(self.sampler.seed)} but the noise source's is "
                f"{randomness_kind(self.noise.seed)}: both seeded (simulation) or both from the operating system"
            )
        if noise_obj is not None or sampler_obj is not None:  # the objects' own declarations decide
            check_combination(privacy, self.sampler, self.noise)
        self.min_separation, self.max_participations = privacy.min_separation, privacy.max_participations
        #: whether rounds are accounted over a schedule (a participation schedule, correlated noise, or both)
        self.scheduled = bool(self.sampler.scheduled or self.noise.correlated)
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            raise PrivacyInputError("rounds", rounds, "must be an integer >= 1 (the run's rounds) or None")
        self.rounds = rounds
        if self.scheduled:  # a correlated mechanism fixes its strategy matrix for the schedule
            self.noise.prepare(rounds, *self.schedule_bounds())
        self._accounting: ScheduleAccounting | None = None
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise PrivacyInputError("fraction_evaluate", fraction_evaluate, "must be in [0, 1]")
        if fraction_evaluate > 0 and not diagnostics:
            raise PrivacyInputError(
                "fraction_evaluate",
                fraction_evaluate,
                "asks clients for un-noised evaluation metrics that "
                "epsilon does not cover; pass diagnostics=True to accept that, or keep fraction_evaluate=0",
            )
        self.sampling = self.sampler.name
        self.sampling_rate = privacy.sampling_rate
        self.clients_per_round = privacy.clients_per_round
        self.clip = privacy.clip  # moves with adaptive clipping
        self.noise_multiplier = privacy.noise_multiplier
        self.noise_placement = privacy.noise_placement
        self.adaptive_clipping = privacy.adaptive_clipping
        self.server_optimizer = server_optimizer or ServerOptimizer("sgd", lr=1.0)
        self.delta = privacy.delta
        self.accountant = privacy.accountant
        self.max_epsilon = privacy.max_epsilon
        self.population = population
        self.fraction_evaluate = fraction_evaluate
        self.diagnostics = bool(diagnostics)
        self.distributed_without_secagg = bool(distributed_without_secagg)
        self.ledger = ledger if ledger is not None else Ledger()
        # a continued ledger: this run's round t is recorded as round (offset + t), and draws from the streams of that
        # round: a seeded continuation never repeats the cohort or the noise of a round its ledger already counts
        self._round_offset = self.ledger.last_round
        if self._round_offset:
            self.sampler.stream_offset = self.noise.stream_offset = int(self._round_offset)
        self.history: list[dict[str, Any]] = []
        self.stopped_reason: str | None = None
        self._pending: tuple[RoundPlan, ArrayRecord] | None = None
        self._node_to_client: dict[int, int] = {}
        self._mechanisms: dict[tuple, Mechanism] = {}
        # Validate the cohort arguments now, against a nominal population, so errors surface at construction.
        if population is not None:
            self.mechanism(population)

    # ------------------------------------------------------------------ the mechanism
    def mechanism(self, population: int, clip: float | None = None) -> Mechanism:
        """The round's mechanism over ``population`` clients (``clip``: the clip applied this round), from the privacy
        settings (:meth:`PrivacySettings.mechanism_at`), validated once per population and clip."""
        # the public population is part of the key: a deployment sets it after the strategy was built
        key = (int(population), float(self.clip if clip is None else clip), self.population)
        if key not in self._mechanisms:  # one entry: the clip moves with adaptive clipping
            m = self.privacy.mechanism_at(key[0], clip=key[1], public_population=self.population)
            self._mechanisms = {key: m.replace(noise_kind=self.noise.noise_kind)}
        return self._mechanisms[key]

    @property
    def relation(self) -> str:
        """The neighbouring relation the certified epsilon is stated for (:attr:`fedsim.privacy.Mechanism.relation`):
        the sampling scheme's, or ``"zero-out"`` when no public population was fixed before the run."""
        scheme = self.sampler.neighbouring
        return ZERO_OUT if scheme == ADD_REMOVE and self.population is None else scheme

    def _count_mechanism(self, model: Mechanism) -> Mechanism:
        assert self.adaptive_clipping is not None
        return model.replace(clip=1.0, noise_multiplier=self._count_noise_multiplier(model))

    def _count_noise_multiplier(self, model: Mechanism) -> float:
        assert self.adaptive_clipping is not None
        z_b = self.adaptive_clipping.count_noise_multiplier
        return float(z_b) if z_b is not None else model.expected_cohort / 20.0

    def round_releases(self, model: Mechanism) -> list[tuple[str, Mechanism]]:
        """Everything one round releases, each on the round's cohort (the budget check and the ledger)."""
        releases = [("model", model)]
        if self.adaptive_clipping is not None:
            releases.append((CLIP_COUNT, self._count_mechanism(model)))
        return releases

    # ------------------------------------------------------------------ schedules and correlated noise
    def schedule_bounds(self) -> tuple[int, int | None]:
        """``(min_sep, k)``: how often one client may take part, as the accounting assumes it (every round for
        ``all``)."""
        return schedule_bounds(self.sampler, self.min_separation, self.max_participations)

    @property
    def accounting(self) -> ScheduleAccounting | None:
        """How a scheduled run's rounds enter the ledger (None: each round is its own release)."""
        if self.scheduled and self._accounting is None:
            self._accounting = ScheduleAccounting.for_schedule(
                self.noise, self.sampler, self.sampling_rate, self.min_separation, self.max_participations
            )
        return self._accounting

    def accounted_releases(self, server_round: int, releases: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """What the ledger records for round ``server_round`` (this run's count, from 1): what the noise mechanism
        says each release is (:meth:`fedsim.round.NoiseSource.dp_release`: the round itself for independent
        Gaussian noise, the schedule's :class:`fedsim.privacy.ScheduledGaussian` for a scheduled run, or the
        mechanism's own release kind). It is a function of public parameters alone, so the same before the round
        (the budget check) and after it; never of how many clients replied."""
        return [(name, self.noise.dp_release(int(server_round), m, self.accounting)) for name, m in releases]

    def noise_floor_refusal(self, plan: RoundPlan, partial: PartialSum) -> str | None:
        """Why ``plan``'s round must not be released because too few clients' noise shares are in its sum (a
        mechanism that cannot top them up: :meth:`fedsim.round.NoiseSource.noise_floor_refusal`), or None."""
        if not plan.mechanism.placement.clients_add_noise:
            return None
        return self.noise.noise_floor_refusal(plan.mechanism, partial.noise_shares)

    @property
    def seed(self) -> int | None:
        """The seed of the sampler and the noise source (None: the operating system's entropy)."""
        return self.noise.seed

    @property
    def randomness(self) -> str:
        """``"seeded"`` (simulation: reproducible from ``seed``) or ``"os-entropy"`` (deployment)."""
        return self.noise.randomness

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must save to continue this strategy: sampler and noise-source state, the clip, the
        server optimizer's state and the ledger."""
        return {
            "sampler": self.sampler.state_dict(),
            "noise": self.noise.state_dict(),
            "clip": self.clip,
            "server_optimizer": self.server_optimizer.state_dict(),
            "ledger": self.ledger.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a checkpoint): the next round is the one after the ledger's last,
        with the same cohorts, noise, clip and server-optimizer state as an uninterrupted run."""
        self.sampler.load_state_dict(state["sampler"])
        self.noise.load_state_dict(state["noise"])
        self.clip = float(state["clip"])
        self.server_optimizer.load_state_dict(state["server_optimizer"])
        self.ledger = Ledger.from_dict(state["ledger"])
        self._accounting = None  # the noise source's restored strategy matrix decides it

    def epsilon(self) -> float:
        """Certified epsilon (at ``self.delta``) of every release so far."""
        return (
            float(self.ledger.epsilon(delta=self.delta, method=self.accountant)) if len(self.ledger) else 0.0
        )

    # ------------------------------------------------------------------ engine-facing API
    def begin_round(self, server_round: int, client_ids: Iterable[int]) -> RoundPlan:
        """Check the budget, sample the cohort and fix the round's clip. Raises :class:`BudgetExhausted`."""
        ids = id_array(client_ids)
        if ids.size == 0:
            raise ValueError("no clients are available to sample from")
        # the realised number of clients sampled from: the accounting is over it; nothing released depends on it when
        # a public population was fixed (self.population: the denominator and q come from that)
        population = int(ids.size)
        model = self.mechanism(population)
        releases = self.round_releases(model)
        accounted = [m for _, m in self.accounted_releases(server_round, releases)]
        if self.max_epsilon is not None and self.ledger.would_exceed(
            accounted[0],
            self.max_epsilon,
            self.delta,
            method=self.accountant,
            releases=accounted[1:],
        ):
            raise BudgetExhausted(
                f"stopping before round {server_round}: releasing it would take the certified epsilon "
                f"above max_epsilon={self.max_epsilon} at delta={self.delta} ({self.accountant}); "
                f"spent so far: epsilon={self.epsilon():.4g} after {self.ledger.rounds} rounds"
            )
        cohort = self.sampler.sample(server_round, ids, model)
        # distributed noise: the clients draw their shares (split over the expected cohort, which is public, never the
        # realised one) from the source's client side; with central noise nothing of the source leaves the server
        shares = self.noise.for_clients() if model.placement.clients_add_noise else None
        # a mechanism whose clients encode (secure aggregation): the round's public randomness, drawn once here
        public = (
            self.noise.public_randomness(server_round) if shares is not None and self.noise.encodes else {}
        )
        return RoundPlan(server_round, cohort, model, releases, noise=shares, public=public)

    def finish_round(
        self,
        plan: RoundPlan,
        weights: np.ndarray,
        partial: PartialSum,
        missing: int = 0,
        account: bool = True,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Noise, average, apply the server optimizer, adapt the clip, record the releases.

        ``account=False`` leaves ``metrics["epsilon"]`` to the caller (the runner computes it in a background
        thread while the next round trains; the releases are in the ledger either way).

        ``weights``: the flat global model the cohort trained from; ``partial``: the clipped sum of the
        replies; ``missing``: sampled clients whose reply never arrived (counted as rejected, zero update).
        """
        partial.reject(missing, reason="no_reply")
        self.noise.set_model_size(weights.size)
        decoding: dict[str, Any] = {}
        if plan.encodes:
            mean, decoding = decoded_mean(
                partial, plan.mechanism, self.noise, plan.round, plan.encoding_for(weights.size)
            )
            server_std = 0.0
        else:
            mean, server_std = self._noised_mean(plan, partial)
        new_weights = self.server_optimizer.step(weights, mean)
        # Private: functions of the noised releases and of public parameters only.
        metrics: dict[str, Any] = {
            "round": plan.round,
            # false for the non-private baseline (noise_multiplier = 0 or clip = 0): epsilon is infinite
            "private": all(m.private for _, m in plan.releases),
            "clip": plan.mechanism.clip,  # 0: no clipping
            # z, as the run used it (calibrated to privacy.target_epsilon where one was given); 0: no noise
            "noise_multiplier": plan.mechanism.noise_multiplier,
            # the std of the noise actually added to this round's sum: under correlated noise a combination of
            # fresh draws of std noise_multiplier * clip (noise_std_draw), up to 2x that for the tree
            "noise_std_sum": self.noise.added_std(plan.round, plan.mechanism.noise_std),
            "noise_std_draw": plan.mechanism.noise_std,
            "update_norm": float(np.linalg.norm(mean)),  # of the released (noised) mean update
        }
        # Not covered by epsilon: exact counts, un-noised norm statistics (see NON_PRIVATE).
        diagnostics: dict[str, Any] = {
            "cohort": int(plan.cohort.size),
            "received": int(partial.count),
            "rejected": int(partial.rejected),
            "failed": dict(sorted(partial.failures.items())),  # rejected by reason (fedsim.round.FAILURES)
            "server_noise_std": server_std,  # distributed noise: reveals how many shares were missing
        }
        if partial.norms:
            norms = np.asarray(partial.norms)
            diagnostics["clipped_fraction"] = float(np.mean(norms > plan.clip))
            diagnostics["median_update_norm"] = float(np.median(norms))
        if plan.encodes:
            # public: a function of the sum of the clients' noised integers (the rounds' release) and of the encoding
            metrics["wrapped_coordinates"] = decoding.get(
                "wrapped", -1
            )  # -1: unknown (a deployment's secure sum)
            metrics["grid_step"] = decoding["grid_step"]
            if "quantisation_error_norm" in decoding:  # the clients' exact rounding errors: simulation only
                diagnostics["quantisation_error_norm"] = decoding["quantisation_error_norm"]
        metrics[NON_PRIVATE] = diagnostics
        for name, mech in self.accounted_releases(plan.round, plan.releases):
            self.ledger.record(round=self._round_offset + plan.round, mechanism=mech, name=name)
        self._after_release(plan, partial, metrics)
        metrics["epsilon"] = self.epsilon() if account else None
        self.history.append(metrics)
        return new_weights, metrics

    def _noised_mean(self, plan: RoundPlan, partial: PartialSum) -> tuple[np.ndarray, float]:
        """The released model update: noised clipped sum over the expected cohort."""
        return private_mean(partial, plan.mechanism, self.noise, plan.round)

    def _after_release(self, plan: RoundPlan, partial: PartialSum, metrics: dict[str, Any]) -> None:
        """Server-side state updates from this round's releases (adaptive clipping)."""
        count = plan.release(CLIP_COUNT)
        if self.adaptive_clipping is not None and count is not None:
            ac = self.adaptive_clipping
            # the clients' noised bits and the server's part (the shares missing below the expected cohort), or the
            # exact count and all of the noise
            shares = count.placement.present_shares(partial.count_shares)
            bits = partial.unclipped_noised if count.placement.clients_add_noise else partial.unclipped
            added, _ = self.noise.server_noise(plan.round, None, count, shares, purpose="count")
            frac = (bits + added) / count.expected_cohort
            self.clip = float(plan.clip * math.exp(-ac.learning_rate * (frac - ac.target_quantile)))
            metrics["unclipped_fraction_noised"] = float(frac)
            metrics["next_clip"] = self.clip

    # ------------------------------------------------------------------ Flower Message API
    def summary(self) -> None:
        log(INFO, "\t├── DPFedAvg (client-level DP)")
        log(
            INFO,
            "\t│\t├── sampling: %s (rate=%s, clients_per_round=%s)",
            self.sampling,
            self.sampling_rate,
            self.clients_per_round,
        )
        log(
            INFO,
            "\t│\t├── clip: %s%s, noise multiplier: %s, noise: %s",
            self.clip,
            " (adaptive)" if self.adaptive_clipping else "",
            self.noise_multiplier,
            self.noise_placement,
        )
        log(
            INFO,
            "\t│\t├── mechanism: %s",
            self.accounting.describe() if self.accounting is not None else self.noise.describe(),
        )
        log(
            INFO,
            "\t│\t└── accountant: %s at delta=%s, max_epsilon=%s",
            self.accountant,
            self.delta,
            self.max_epsilon,
        )

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any) -> Any:
        """Flower's :meth:`Strategy.start`, after refusing distributed noise without secure aggregation (unless
        ``distributed_without_secagg=True``): the same rule as fedsim's own ServerApp."""
        self._refuse_secagg()
        check_distributed_noise(
            self.privacy, self.distributed_without_secagg, "DPFedAvg(distributed_without_secagg=True)"
        )
        return super().start(grid, initial_arrays, *args, **kwargs)

    def _refuse_secagg(self) -> None:
        """Flower's Strategy API has one train message per client a round: with secure aggregation it would receive
        the clients' encodings unmasked, so it is refused (fedsim's ServerApp runs the protocol's stages)."""
        if self.privacy.secagg is not None:
            raise ValueError(
                "privacy.secagg: secure aggregation runs in fedsim's ServerApp (fedsim.apps.server_app, or "
                "fedsim.apps.server_app.run_on_grid), whose rounds exchange the protocol's four messages with each "
                "client; Flower's Strategy API sends one train message per client and would receive the clients' "
                "encodings unmasked"
            )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._refuse_secagg()
        self._pending = None
        if self.stopped_reason is not None:
            return []
        self.noise.set_model_size(sum(int(a.numpy().size) for a in arrays.values()))
        try:
            plan = self.begin_round(server_round, grid.get_node_ids())
        except BudgetExhausted as exc:
            self.stopped_reason = str(exc)
            log(WARNING, "%s", exc)
            return []
        # A grid that addresses nodes by client id (fedsim.flower.grid.ClientIdGrid) says how to map replies back;
        # read after get_node_ids(), which refreshes it.
        self._node_to_client = dict(getattr(grid, "node_to_client", {}) or {})
        self._pending = (plan, arrays)
        if self.diagnostics:  # the realised cohort size is not covered by epsilon
            log(
                INFO,
                "configure_train: sampled %d of %d nodes (%s) [non-private diagnostic]",
                plan.cohort.size,
                plan.population,
                self.sampling,
            )
        return protocol.train_messages(plan, arrays, config)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self._refuse_secagg()
        if self._pending is None:  # stopped by the budget: nothing released, the model stays as it is
            return None, None
        plan, global_arrays = self._pending
        self._pending = None
        weights = protocol.flat_arrays(global_arrays)
        partial = self.collect_replies(plan, weights, global_arrays, replies, self._node_to_client)
        floor = self.noise_floor_refusal(plan, partial)
        if floor is not None:  # not released; the run stops, as fedsim's own loop does (its failure policy)
            self.stopped_reason = f"stopping at round {server_round}: {floor}; the round was not released"
            log(WARNING, "%s", self.stopped_reason)  # names the floor only, never how many arrived
            return None, None
        new_weights, metrics = self.finish_round(plan, weights, partial)
        # Flower logs and keeps what this returns: private quantities only, unless diagnostics were asked for
        return protocol.to_arrays(new_weights, global_arrays), MetricRecord(self.flower_metrics(metrics))

    def flower_metrics(self, metrics: dict[str, Any]) -> dict[str, float]:
        """A round's metrics as Flower's flat MetricRecord values: the private ones, and the non-private ones
        (prefixed ``non_private.``) only with ``diagnostics=True``."""
        out = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if self.diagnostics:
            out.update(
                {
                    f"{NON_PRIVATE}.{k}": v
                    for k, v in metrics.get(NON_PRIVATE, {}).items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                }
            )
        return out

    def collect_replies(
        self,
        plan: RoundPlan,
        weights: np.ndarray,
        like: ArrayRecord,
        replies: Iterable[Message],
        node_to_client: dict[int, int],
    ) -> PartialSum:
        """The round's partial sum from Flower replies: each valid reply through :meth:`accept_reply`, an error
        or a malformed reply rejected, a sampled client that never replied counted as rejected."""
        partial = PartialSum(weights.size)
        received = 0
        encoding = plan.encoding_for(weights.size) if plan.encodes else None
        for msg in replies:
            received += 1
            if encoding is not None:  # each client's encoding, as a secure sum would add it
                encoded = protocol.reply_encoded(msg, encoding)
                if encoded is None:
                    partial.reject(reason="error" if msg.has_error() else "wrong_shape")
                elif plan.sampled(protocol.reply_source(msg, node_to_client)):
                    partial.add_encoded(encoded, math.nan)
                else:
                    partial.reject(reason="not_sampled")
                continue
            model = protocol.reply_model(msg, like)
            if model is None:
                partial.reject(reason="error" if msg.has_error() else "wrong_shape")
                continue
            client = protocol.reply_source(msg, node_to_client)
            self.accept_reply(plan, partial, client, model - weights, protocol.reply_metrics(msg))
        partial.reject(max(int(plan.cohort.size) - received, 0), reason="no_reply")
        return partial

    def accept_reply(
        self, plan: RoundPlan, partial: PartialSum, client: int, update: np.ndarray, metrics: dict[str, float]
    ) -> None:
        """Add one client's update (``reply - global``) to the round's partial sum.

        Every client value that enters a noised sum is checked first; a reply with a non-finite or missing one
        is rejected whole (counted, contributing zero). A reply from a client that was not sampled is rejected."""
        if not plan.sampled(client):
            partial.reject(reason="not_sampled")
            return
        if plan.mechanism.placement.clients_add_noise:
            bit = 0.0
            if plan.count_share_std > 0:  # the client's unclipped bit, noised by the client itself
                bit = bounded_value(metrics.get(protocol.MET_UNCLIPPED_NOISED, math.nan), -math.inf, math.inf)
                if bit is None:
                    partial.reject(reason="non_finite")
                    return
            shares = partial.noise_shares
            partial.add(update, plan.clip, already_clipped_and_noised=True)
            if plan.count_share_std > 0 and partial.noise_shares > shares:  # the update was accepted
                partial.add_noised_count(bit)
            return
        partial.add(update, plan.clip)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.fraction_evaluate == 0.0:
            return []
        nodes = id_array(grid.get_node_ids())
        k = max(1, int(round(self.fraction_evaluate * nodes.size)))
        rng = self.noise.rng(server_round, STREAM_EVALUATION)
        chosen = np.sort(rng.choice(nodes, size=min(k, nodes.size), replace=False))
        config = ConfigRecord(dict(config))
        config[protocol.CFG_ROUND] = server_round
        record = RecordDict({"arrays": arrays, "config": config})
        return [
            Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=int(n)) for n in chosen
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        totals: dict[str, float] = {}
        weight = 0.0
        for msg in replies:
            if msg.has_error() or not msg.content.metric_records:
                continue
            rec = next(iter(msg.content.metric_records.values()))
            n = float(rec.get("num-examples", 1.0))
            weight += n
            for k, v in rec.items():
                if k != "num-examples" and isinstance(v, int | float):
                    totals[k] = totals.get(k, 0.0) + n * float(v)
        if weight == 0:
            return None
        return MetricRecord({k: v / weight for k, v in totals.items()} | {"num-examples": weight})
