"""``engine.name = "auto"`` (the default): the in-process engine or the Ray engine, picked before the first round.

The pick is a function of the scenario and of the machine's usable CPUs only (never of a timing), so the same
scenario on the same machine always runs on the same engine. In order:

1. **Ray when the run needs it**: ``engine.ray_address`` (a cluster), ``engine.num_gpus_per_worker > 0`` (Ray
   places workers on GPUs) or ``engine.round_timeout_s`` (only another process can be stopped when a client hangs).
2. **In process when Ray's pool would oversubscribe the machine**: the pool asks for
   ``num_workers x num_cpus_per_worker`` CPUs and the driver, Ray's GCS and raylet need one more. On fewer usable
   CPUs the workers share cores with the driver and Ray's own processes; measured on a 2-core machine, the Ray
   engine's 2 x 1-CPU pool then runs the workload of ``benchmarks/default_command.py`` at 0.84x the speed of one
   process.
3. **In process when the parallel saving cannot repay Ray**: a round's training is estimated from its size
   (expected cohort x mean examples per client x local epochs x model parameters, at :data:`PARAM_EXAMPLES_PER_S`
   on one core); Ray is picked only when ``rounds x (round x (1 - 1/workers) - per-round overhead)`` exceeds Ray's
   start-up (:data:`RAY_ROUND_OVERHEAD_S`, :data:`RAY_START_S`, both measured here).

Otherwise Ray. The run says which engine it picked and why: a log line, ``summary.json``'s ``engine`` and
``fedsim run``'s output. ``engine.name = "ray"`` or ``"local"`` always forces one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsim.experiment import privacy_settings

log = logging.getLogger(__name__)

#: one core's training speed assumed by the estimate, in (parameter x example) per second: a 40-100-10 perceptron on
#: MNIST-1D (batch 16, per-layer rules) trains 100 clients x 50 examples (25.6 M) in 11 ms on one thread here
PARAM_EXAMPLES_PER_S = 2.3e9
#: the Ray engine's cost per round beyond its workers' training (2 workers of 1 CPU, the workload of
#: ``benchmarks/default_command.py``): the round's call to each worker, the streamed partial sums, the driver's
#: merge (timed around the calls: 15-18 ms rounds against the workers' own 8-10 ms)
RAY_ROUND_OVERHEAD_S = 0.005
#: a local Ray instance's start and its workers' (each builds a trainer): 4-5 s measured on this 2-core machine
RAY_START_S = 4.5


@dataclass(frozen=True)
class EngineChoice:
    """The engine ``auto`` picked (``name``: a registered engine) and the one-line reason."""

    name: str
    why: str

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "requested": "auto", "why": self.why}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def expected_cohort(scenario: Any, population: int) -> float:
    """Clients a round trains, expected: the round's mechanism from the scenario's privacy settings
    (:func:`fedsim.experiment.privacy_settings`), whose sampling scheme gives the public denominator the strategy
    uses, over ``population`` clients."""
    return float(privacy_settings(scenario).mechanism_at(population).expected_cohort)


def estimated_round_s(scenario: Any, data: Any, num_params: int) -> float:
    """One round's training on one core, estimated from its size (see the module docstring)."""
    train = np.asarray(data.train_clients)
    population = int(train.size)
    if population == 0:
        return 0.0
    # the mean client size, from at most 2,000 clients spread over the population (cheap for any data)
    step = max(1, population // 2000)
    mean_examples = float(np.mean(data.num_examples_array(train[::step])))
    work = expected_cohort(scenario, population) * mean_examples * scenario.client.local_epochs * num_params
    return work / PARAM_EXAMPLES_PER_S


def choose_engine(scenario: Any, data: Any, num_params: int, cpus: int | None = None) -> EngineChoice:
    """The engine ``auto`` runs ``scenario`` on (the rules of the module docstring), on ``cpus`` usable CPUs
    (default: this process's)."""
    e = scenario.engine
    if e.ray_address:
        return EngineChoice(
            "ray", f"engine.ray_address={e.ray_address!r}: the Ray cluster trains the clients"
        )
    if e.num_gpus_per_worker > 0:
        return EngineChoice(
            "ray", f"engine.num_gpus_per_worker={e.num_gpus_per_worker:g}: Ray places the workers"
        )
    if e.round_timeout_s is not None:
        return EngineChoice(
            "ray", "engine.round_timeout_s is set: only a worker process can be stopped when a client hangs"
        )
    cpus = usable_cpus() if cpus is None else int(cpus)
    pool = e.num_workers * e.num_cpus_per_worker
    if cpus < pool + 1:
        return EngineChoice(
            "local",
            f"{cpus} usable CPUs: Ray's pool of {e.num_workers} x {e.num_cpus_per_worker:g} CPUs would share them "
            "with the driver and Ray's own processes",
        )
    round_s = estimated_round_s(scenario, data, num_params)
    saving = scenario.rounds * (round_s * (1 - 1 / e.num_workers) - RAY_ROUND_OVERHEAD_S)
    if saving < RAY_START_S:
        return EngineChoice(
            "local",
            f"a round trains in about {round_s * 1e3:.3g} ms on one core (estimated from its size): "
            f"{e.num_workers} Ray workers would save about {max(saving, 0.0):.3g} s over {scenario.rounds} rounds, "
            f"less than Ray's start-up (~{RAY_START_S:g} s)",
        )
    return EngineChoice(
        "ray",
        f"a round trains in about {round_s * 1e3:.3g} ms on one core (estimated from its size): {e.num_workers} "
        f"Ray workers on {cpus} usable CPUs save about {saving:.3g} s over {scenario.rounds} rounds",
    )


class AutoEngine:
    """The registry's ``auto`` entry: :meth:`start` picks (:func:`choose_engine`) and starts that engine, which
    carries the pick as its ``choice`` (:class:`EngineChoice`)."""

    name = "auto"

    @classmethod
    def start(cls, scenario: Any, data: Any, settings: Any) -> Any:
        from fedsim.registry import engine_entry
        from fedsim.training.trainer import initial_weights

        num_params = int(initial_weights(settings, data.input_shape, data.num_classes).size)
        choice = choose_engine(scenario, data, num_params)
        log.info("engine.name='auto' picked %r: %s", choice.name, choice.why)
        target = engine_entry(choice.name).resolve()
        engine = getattr(target, "start", target)(scenario, data, settings)
        engine.choice = choice
        return engine
