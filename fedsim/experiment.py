"""An experiment built from a scenario: the data, the training settings, the strategy and the starting model.

Every way of running a scenario starts here: ``fedsim run`` with any engine, Flower's Simulation Engine, the
deployed ServerApp and ClientApp. What differs between them is only where the cohort trains (the engine) and
where the randomness comes from (``privacy.randomness``; a deployment always uses the operating system's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsim.data import build_federated_data
from fedsim.privacy.settings import PrivacySettings
from fedsim.scenarios import Scenario
from fedsim.strategies import DPAgnosticFedAvg, DPFedAvg, ServerOptimizer
from fedsim.training.trainer import TrainSettings, check_fits, initial_weights


@dataclass
class Experiment:
    """What a run of ``scenario`` needs, built once: see :func:`build_experiment`."""

    scenario: Scenario
    data: Any
    settings: TrainSettings
    strategy: DPFedAvg
    initial_weights: np.ndarray
    #: what the run's settings do that they do not say (:func:`fedsim.run_checks.run_warnings`): printed where the
    #: run starts, recorded in ``summary.json``
    warnings: list[Any] = field(default_factory=list)

    @property
    def train_ids(self) -> np.ndarray:
        return np.asarray(self.data.train_clients)

    @property
    def heldout_ids(self) -> np.ndarray:
        return np.asarray(self.data.heldout_clients)


def build_data(scenario: Scenario) -> Any:
    """The scenario's federated data (partitioned, domains, held-out clients)."""
    d = scenario.data
    options: dict[str, Any] = {}
    if d.domains is not None:
        options["domain_label_swaps"] = d.domain_label_swaps
        if d.dataset != "synthetic":
            options["domain_shift"] = d.domain_shift
            options["domain_noise"] = d.domain_noise
    if d.options is not None:
        options["options"] = d.options
    if d.dataset == "mnist1d" and d.num_samples is not None:
        options["num_samples"] = d.num_samples
    if d.dataset == "synthetic":
        options["synthetic_alpha"] = d.synthetic_alpha
        options["synthetic_beta"] = d.synthetic_beta
        options["synthetic_iid"] = d.synthetic_iid
        options["synthetic_min_samples"] = d.synthetic_min_samples
        options["synthetic_max_samples"] = d.synthetic_max_samples
    if d.dataset == "shakespeare":
        options["seq_len"] = d.seq_len
        options["stride"] = d.stride
        options["min_samples"] = d.min_samples
        options["max_samples_per_client"] = d.max_samples_per_client
        options["targets"] = d.targets
    if d.partitioner == "pathological":
        options["num_classes_per_partition"] = d.classes_per_client
    if d.partitioner == "shard":
        options["num_shards_per_partition"] = d.shards_per_client
    try:
        return build_federated_data(
            dataset=d.dataset,
            num_clients=d.num_clients,
            partitioner=d.partitioner,
            alpha=d.alpha,
            heldout_fraction=d.heldout_fraction,
            seed=scenario.data_seed,  # the data side (scenarios.schema.SEEDS)
            domains=d.domains,
            **options,
        )
    except ValueError as exc:  # name the scenario's keys, not the data layer's
        msg = str(exc)
        for inner, outer in (
            ("num_classes_per_partition", "data.classes_per_client"),
            ("num_shards_per_partition", "data.shards_per_client"),
        ):
            msg = msg.replace(inner, outer)
        raise ValueError(msg) from None


def public_population(scenario: Scenario, data: Any) -> int:
    """The run's public population, fixed before its first round (:class:`DPFedAvg`'s ``population``): the training
    clients the scenario's data settings define, plus the canaries expected to be inserted (``privacy.canaries = k``:
    2k directions, each inserted with probability 1/2). The denominator and the sampling probability come from it,
    so that one client added or removed, or the canaries' coins, change nothing released but through the noised
    sum; the accountant still counts the clients actually sampled from."""
    return int(np.asarray(data.train_clients).size) + int(scenario.privacy.canaries or 0)


def privacy_settings(scenario: Scenario) -> PrivacySettings:
    """The scenario's ``[privacy]`` table as the run's one :class:`PrivacySettings`
    (:meth:`fedsim.scenarios.schema.PrivacyConfig.settings`, with agnostic FL's releases when it is enabled),
    validated by the same rules the schema asked when the scenario was loaded."""
    return scenario.privacy.settings(agnostic=scenario.agnostic.enabled)


def build_strategy(scenario: Scenario, population: int | None, data: Any = None) -> DPFedAvg:
    """The scenario's strategy: :class:`DPFedAvg`, or :class:`DPAgnosticFedAvg` when ``agnostic.enabled``, with the
    scenario's privacy settings (:func:`privacy_settings`).

    ``population``: the public population (:func:`public_population`; None: each round's realised population,
    which is then public: zero-out neighbours).
    ``noise_seed`` drives sampling and noise, only with ``privacy.randomness = "seeded"``.
    """
    p, s, a = scenario.privacy, scenario.server, scenario.agnostic
    cls: Any = DPFedAvg
    extra: dict[str, Any] = {}
    if a.enabled:
        if data is None:
            raise ValueError("agnostic.enabled needs the scenario's data (client domains)")
        cls = DPAgnosticFedAvg
        extra = dict(
            client_domains=data.domain,
            num_domains=data.num_domains,
            # public constants from the scenario's data settings, never recounted from the clients present
            domain_sizes=[int(np.asarray(data.domain_clients(d)).size) for d in range(data.num_domains)],
            lambda_lr=a.lambda_lr,
            loss_noise_multiplier=a.loss_noise_multiplier,
            loss_bound=math.log(data.num_classes),
        )
    return cls(
        privacy_settings(scenario),
        server_optimizer=ServerOptimizer(s.optimizer, lr=s.lr, momentum=s.momentum, beta2=s.beta2, eps=s.eps),
        seed=scenario.noise_seed if p.randomness == "seeded" else None,  # None: OS entropy
        population=population,
        rounds=scenario.rounds,
        **extra,
    )


def calibrated_noise_multiplier(strategy: DPFedAvg, population: int, scenario: Scenario) -> float:
    """The noise multiplier meeting ``privacy.target_epsilon`` after ``rounds`` rounds at ``privacy.delta`` by the
    scenario's certified accountant, for the strategy's sampling, schedule and mechanism over ``population``
    training clients (rounded up: the target holds)."""
    from fedsim.privacy.accountants import epsilon_at
    from fedsim.privacy.paper.calibration import CALIBRATION_RANGE, calibrate_noise
    from fedsim.privacy.schedule import calibrate_schedule
    from fedsim.validation import PrivacyInputError, target_out_of_reach

    p = scenario.privacy
    if strategy.accounting is not None:
        try:
            return calibrate_schedule(
                strategy.accounting, scenario.rounds, p.target_epsilon, p.delta, p.accountant
            )
        except PrivacyInputError as exc:  # the same error, named as the scenario's field
            raise PrivacyInputError(f"privacy.{exc.field}", exc.value, exc.allowed) from None
    mechanism = strategy.mechanism(population)
    if strategy.noise.calibrates:  # a mechanism that is not Gaussian calibrates by its own accounting
        z = strategy.noise.calibrate(mechanism, p.target_epsilon, p.delta, scenario.rounds)
        if z is None:
            raise PrivacyInputError(
                "privacy.target_epsilon",
                p.target_epsilon,
                f"is not met after {scenario.rounds} rounds at delta {p.delta:g} by mechanism "
                f"{strategy.noise.name!r} even at noise_multiplier 1000",
            )
        return float(z)
    z = calibrate_noise(mechanism, p.target_epsilon, p.delta, scenario.rounds, p.accountant)
    if z is None or z <= CALIBRATION_RANGE[0]:
        # not met even at the most noise searched, or already met at the least: a run would not spend the target
        reach = tuple(
            epsilon_at(mechanism.replace(noise_multiplier=zz), scenario.rounds, p.delta, p.accountant)
            for zz in CALIBRATION_RANGE
        )
        raise target_out_of_reach(
            "privacy.target_epsilon",
            p.target_epsilon,
            scenario.rounds,
            p.delta,
            CALIBRATION_RANGE,
            reach,
            p.accountant,
        )
    return float(z)


def build_experiment(scenario: Scenario, data: Any = None) -> Experiment:
    """Data (built here unless given), settings, strategy (checked against the training clients) and the
    initial model, a function of the data seed only."""
    data = build_data(scenario) if data is None else data
    settings = TrainSettings.from_scenario(scenario)
    check_fits(settings, data)
    population = public_population(scenario, data)
    weights = initial_weights(settings, data.input_shape, data.num_classes)
    strategy = build_strategy(scenario, population, data)
    strategy.noise.set_model_size(weights.size)  # a release over a padded, rotated update needs it
    # before any round: a mechanism that cannot make this release (bits too few for the cohort) says so now
    pool = population if population is not None else int(np.asarray(data.train_clients).size)
    strategy.noise.check_release(strategy.mechanism(pool), weights.size)
    if scenario.privacy.target_epsilon is not None:
        scenario.privacy.mark_calibrated(calibrated_noise_multiplier(strategy, population, scenario))
        strategy = build_strategy(scenario, population, data)
        strategy.noise.set_model_size(weights.size)
    from fedsim.run_checks import run_warnings

    exp = Experiment(scenario, data, settings, strategy, weights)
    exp.warnings = run_warnings(exp)
    return exp
