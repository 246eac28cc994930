"""What a built run's settings do that they do not say: the realised facts of a run, and the warnings printed where
it starts and recorded in its ``summary.json``.

:func:`run_warnings` takes a built :class:`~fedsim.experiment.Experiment` (its data, model and strategy, with a
``target_epsilon`` already calibrated) and returns one :class:`RunWarning` per setting that will not do what a
reader of the scenario expects:

``schedule``
    a cyclic schedule of ``b = min_separation`` groups over fewer rounds than groups: the groups after round
    ``rounds`` never get a turn, so an expected ``(b - rounds) / b`` of the training clients can never train.
``delta``
    ``privacy.delta >= 1/N`` over the public population ``N``: the mechanism that publishes one client's data
    outright, picked at random, is (0, 1/N)-DP, so a guarantee at such a delta permits exactly that.
``canaries``
    canary clients making up more than :data:`CANARY_SHARE_LIMIT` of the expected cohort: the mean divides by the
    whole expected cohort, so the real clients' update shrinks by that share and the canaries' random directions
    are added to it.
``noise``
    the expected L2 norm of the noise on a round's mean update more than :data:`NOISE_RATIO_LIMIT` times the clip
    (which bounds the clipped mean's norm): ``z * f * clip * sqrt(d) / cohort`` for ``d`` parameters, the expected
    cohort and ``f`` the noise source's factor (:func:`noise_factors`): 1 for independent noise; for correlated
    noise, the independent noise that leaves as much noise in the model over the run's rounds (a correlated source
    adds more than ``z * clip`` each round, :meth:`fedsim.round.NoiseSource.added_std`, and cancels over rounds; both
    are recorded). The ratio is ``z * f * sqrt(d) / cohort``: the clip cancels.

Every number comes from the settings, the public population and the model's parameter count: nothing about the
realised cohorts or the clients' data, so a warning may be printed and recorded beside the private rows.

:func:`describe_experiment` is the line ``fedsim run`` prints once the run is built (clients, training and
held-out, parameters, the expected cohort): the facts of this run, where a scenario's ``description`` is prose.
:func:`log_start` sends both to this module's logger (``fedsim.run_checks``), which ``fedsim run`` prints; from the
Python API they reach Python's logging (warnings go to stderr when logging is not configured).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: a built :class:`fedsim.experiment.Experiment` (not imported: the experiment builds these warnings, so an import
#: here, even a typing one, would close a circle)
Experiment = Any

log = logging.getLogger(__name__)

#: warn when the expected noise norm on a round's mean update exceeds the clip by more than this factor (the clip
#: bounds the clipped mean's norm; clients' updates rarely align, so the signal is usually well below it). Measured on
#: reproduction 4 (docs/reproductions/noise-mechanisms.md; noise-mechanisms-shakespeare: LSTM, 58,137 parameters, 81 clients a round, 60 rounds): the
#: runs at ratios 1.9 to 4.0 learned (held-out accuracy 0.28 to 0.36), the two above 6 did not (independent noise on
#: the cyclic schedule at 6.0 diverged to 0.04; tree noise at 6.9 reached 0.21, near the 0.19 of always predicting a
#: space); digits_cnn (6,186 parameters, 18 a round) at 4.4 reached 0.78 in 30 rounds. The diverged Shakespeare
#: transformer of issue 34 ran at 16
NOISE_RATIO_LIMIT = 5.0
#: warn when more than this share of the expected cohort are canary clients: the mean divides by the whole expected
#: cohort, so the real clients' update is scaled by (1 - share), a step size cut by the share, and the canaries'
#: random directions (norm = clip each) are added to it. A tenth is a judgment: a step 10% shorter is within the usual
#: tolerance of a tuned learning rate, while issue 34's 2,000 canaries beside 720 clients (73% of the cohort) cut the
#: held-out accuracy from 0.20 to 0.159: beyond it the canaries change the training they are meant to measure
CANARY_SHARE_LIMIT = 0.10
#: correlated noise: the per-round factor is averaged over at most this many rounds (the tree's probe grows with them)
FACTOR_ROUNDS = 2000


@dataclass(frozen=True)
class RunWarning:
    """One setting that does not do what it says: ``kind`` (``schedule``, ``delta``, ``canaries``, ``noise``),
    ``message`` (one paragraph: what happens, the numbers, what to change) and ``values`` (the numbers, by name)."""

    kind: str
    message: str
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As ``summary.json`` records it."""
        return {"kind": self.kind, "message": self.message, "values": dict(self.values)}


def experiment_facts(exp: Experiment) -> dict[str, Any]:
    """The realised facts of the run ``exp`` describes: ``clients`` (training + held-out), ``training_clients``,
    ``heldout_clients``, ``canaries`` (``privacy.canaries``: expected inserted), ``population`` (the public population
    the denominator and the sampling probability come from), ``parameters`` (of the built model), ``expected_cohort``
    (the aggregate's denominator) and ``sampling`` (the scheme, described)."""
    train, heldout = int(exp.train_ids.size), int(exp.heldout_ids.size)
    canaries = int(exp.scenario.privacy.canaries or 0)
    population = int(exp.strategy.population or train + canaries)
    mech = exp.strategy.mechanism(population)
    return {
        "clients": train + heldout,
        "training_clients": train,
        "heldout_clients": heldout,
        "canaries": canaries,
        "population": population,
        "parameters": int(exp.initial_weights.size),
        "expected_cohort": float(mech.expected_cohort),
        "sampling": mech.scheme.describe(mech),
    }


def describe_experiment(exp: Experiment, facts: dict[str, Any] | None = None) -> str:
    """One line of the run's realised facts (:func:`experiment_facts`), for the header ``fedsim run`` prints."""
    f = experiment_facts(exp) if facts is None else facts
    canaries = f" + {f['canaries']:,} canaries expected" if f["canaries"] else ""
    return (
        f"{f['clients']:,} clients: {f['training_clients']:,} training{canaries}, {f['heldout_clients']:,} held out "
        f"(never trained on); model: {f['parameters']:,} parameters; expected cohort {f['expected_cohort']:.4g} "
        f"clients a round ({f['sampling']}) over a population of {f['population']:,}; {exp.scenario.rounds} rounds"
    )


def run_warnings(exp: Experiment) -> list[RunWarning]:
    """The warnings for the built run ``exp`` (see the module), in the order schedule, delta, canaries, noise."""
    facts = experiment_facts(exp)
    found = [
        _schedule_warning(exp, facts),
        _delta_warning(exp, facts),
        _canary_warning(exp, facts),
        _noise_warning(exp, facts),
    ]
    return [w for w in found if w is not None]


def log_start(exp: Experiment, warnings: list[RunWarning] | None = None) -> None:
    """The run's facts (INFO) and each of its warnings (WARNING) on this module's logger, where a run starts."""
    log.info("run: %s", describe_experiment(exp))
    for w in exp_warnings(exp) if warnings is None else warnings:
        log.warning("%s", format_warning(w))


def exp_warnings(exp: Experiment) -> list[RunWarning]:
    """The warnings :func:`fedsim.experiment.build_experiment` computed for ``exp`` (computed now if it has none)."""
    found = getattr(exp, "warnings", None)
    return list(found) if found is not None else run_warnings(exp)


# ---------------------------------------------------------------------------------------------------- the checks
def _private(exp: Experiment) -> bool:
    """Whether the model release is noised (z > 0 and clip > 0): only then do delta and the noise mean anything."""
    p = exp.scenario.privacy
    return float(exp.strategy.noise_multiplier) > 0 and float(p.clip) > 0


def _schedule_warning(exp: Experiment, facts: dict[str, Any]) -> RunWarning | None:
    from fedsim.round.sampling import CyclicSampler

    p, rounds = exp.scenario.privacy, int(exp.scenario.rounds)
    if not isinstance(exp.strategy.sampler, CyclicSampler):
        # the min-separation sampler lets every client take part in round 1: no client is kept out by the schedule.
        # No shipped schedule can keep every client out (a cyclic schedule's first group trains in round 1), so
        # nothing here is refused for that (more groups than training clients: the strategy refuses it when built)
        return None
    b = int(exp.strategy.min_separation)
    if b <= rounds:
        return None
    # each client's group is drawn uniformly among b; groups rounds+1..b never get a turn
    fraction = (b - rounds) / b
    never = fraction * facts["training_clients"]
    return RunWarning(
        "schedule",
        f"sampling='cyclic' with privacy.min_separation={b} groups over rounds={rounds}: only groups 1 to {rounds} "
        f"ever get a turn, so an expected {fraction:.0%} of the training clients (about {never:.0f} of "
        f"{facts['training_clients']:,}; each client's group is drawn uniformly) can never take part and the model "
        f"never trains on them. Set privacy.min_separation <= {rounds} (the rounds), or rounds >= {b}, so that "
        "every group gets a turn",
        {
            "min_separation": b,
            "rounds": rounds,
            "fraction_never_participating": fraction,
            "training_clients": facts["training_clients"],
            "sampling": p.sampling,
        },
    )


def _delta_warning(exp: Experiment, facts: dict[str, Any]) -> RunWarning | None:
    if not _private(exp):
        return None
    # N: the clients with data. With canaries the public population is larger, but canaries are not people: the
    # smaller N warns at every delta the larger one would
    delta, n = float(exp.scenario.privacy.delta), int(facts["training_clients"])
    if n < 1 or delta < 1.0 / n:
        return None
    suggest = n**-1.1
    return RunWarning(
        "delta",
        f"privacy.delta={delta:g} >= 1/N = 1/{n:,} = {1 / n:.3g} (N: the training clients"
        f"{', not counting the canaries' if facts['canaries'] else ', the public population'}): a mechanism that publishes one client's data "
        "outright, that client picked at random, is (0, 1/N)-differentially private, so an (epsilon, delta) "
        "guarantee at this delta allows releasing a client's data outright, whatever epsilon says. Take delta well "
        f"below 1/N: at most N^-1.1 = {suggest:.2g} (a common choice), e.g. --set privacy.delta={_round_down(suggest):g}",
        {
            "delta": delta,
            "population": n,
            "one_over_population": 1.0 / n,
            "suggested_delta": _round_down(suggest),
        },
    )


def _canary_warning(exp: Experiment, facts: dict[str, Any]) -> RunWarning | None:
    k = int(facts["canaries"])
    if not k:
        return None
    n, cohort = int(facts["population"]), float(facts["expected_cohort"])
    share = k / n  # canaries are sampled like every client of the public population
    if share <= CANARY_SHARE_LIMIT:
        return None
    per_round = cohort * share
    most = int(math.floor(CANARY_SHARE_LIMIT * facts["training_clients"] / (1 - CANARY_SHARE_LIMIT)))
    return RunWarning(
        "canaries",
        f"privacy.canaries={k:,} beside {facts['training_clients']:,} training clients: an expected "
        f"{per_round:.3g} of the expected cohort of {cohort:.3g} clients a round are canaries ({share:.0%}, more than "
        f"{CANARY_SHARE_LIMIT:.0%}). The mean divides by the whole expected cohort, so the real clients' update is "
        f"scaled by {1 - share:.2f} and the canaries' random directions are added to it: the run trains differently "
        f"from the one it audits. Use at most {most:,} canaries to stay within {CANARY_SHARE_LIMIT:.0%} of the "
        "cohort, or more training clients",
        {
            "canaries": k,
            "training_clients": facts["training_clients"],
            "expected_canaries_per_round": per_round,
            "expected_cohort": cohort,
            "canary_share": share,
            "limit": CANARY_SHARE_LIMIT,
        },
    )


@dataclass(frozen=True)
class NoiseFactors:
    """How much noise a run's noise source adds, per unit of the fresh draws' std (``noise_multiplier * clip``):
    ``per_round`` (the root mean square over the rounds of :meth:`~fedsim.round.NoiseSource.added_std`, what a row
    publishes as ``noise_std_sum / noise_std_draw``) and ``accumulated`` (the root mean square over rounds ``t`` of
    ``std(noise summed over rounds 1..t) / sqrt(t)``: the independent noise that would leave as much noise in the
    model). Both are 1 for independent noise; correlated noise adds more per round and cancels over rounds."""

    per_round: float
    accumulated: float
    how: str


#: the seed of the probe that measures a correlated source's accumulated noise: never the run's own noise
PROBE_SEED = 0x5EED
PROBE_OFFSET = 1 << 40
#: the probe's coordinates: its estimate of the accumulated std is within a few percent
PROBE_COORDINATES = 256


def noise_factors(exp: Experiment) -> NoiseFactors:
    """The run's :class:`NoiseFactors`. A correlated source is asked on a copy (it caches its probe), and its
    accumulated factor is measured by drawing its noise for :data:`PROBE_COORDINATES` coordinates over the run's
    rounds (at most :data:`FACTOR_ROUNDS`) from another seed (:data:`PROBE_SEED`), never from the run's noise."""
    noise = exp.strategy.noise
    if not getattr(noise, "correlated", False):
        return NoiseFactors(1.0, 1.0, "independent noise")
    rounds = min(int(exp.scenario.rounds), FACTOR_ROUNDS)
    span = f"rounds 1-{rounds}" + ("" if rounds == exp.scenario.rounds else f" of {exp.scenario.rounds}")
    try:
        probe = copy.deepcopy(noise)
        per_round = [float(probe.added_std(t, 1.0)) for t in range(1, rounds + 1)]
        draws = copy.deepcopy(noise)
        # streams no run draws from: another seed, and rounds past any run's (a continuation offsets by rounds)
        draws.seed, draws.stream_offset = PROBE_SEED, PROBE_OFFSET
        total = np.zeros(PROBE_COORDINATES)
        accumulated = []
        for t in range(1, rounds + 1):
            total += np.asarray(draws.noise(t, "model", PROBE_COORDINATES, 1.0), dtype=np.float64)
            accumulated.append(float(np.mean(total**2)) / t)
    except Exception as exc:  # a registered source that cannot say: the independent values, said so
        return NoiseFactors(
            1.0,
            1.0,
            f"the independent value: {noise.name} could not give its noise ({type(exc).__name__}: {exc})",
        )
    f_round = math.sqrt(sum(x * x for x in per_round) / len(per_round))
    f_acc = math.sqrt(sum(accumulated) / len(accumulated))
    return NoiseFactors(
        f_round,
        f_acc,
        f"{noise.name} adds {f_round:.3g}x the fresh draws' std a round (noise_std_sum / noise_std_draw, root mean "
        f"square over {span}: {min(per_round):.3g} to {max(per_round):.3g}) and cancels over rounds: the model "
        f"accumulates as much noise as independent noise {f_acc:.3g}x as large, which the ratio uses",
    )


def _noise_warning(exp: Experiment, facts: dict[str, Any]) -> RunWarning | None:
    if not _private(exp):
        return None
    p = exp.scenario.privacy
    z, clip = float(exp.strategy.noise_multiplier), float(p.clip)
    d, cohort = int(facts["parameters"]), float(facts["expected_cohort"])
    if cohort <= 0 or d <= 0:
        return None
    # per coordinate of the mean: z * clip * f / cohort; its expected L2 norm over d coordinates ~ that * sqrt(d)
    factors = noise_factors(exp)
    f = factors.accumulated
    ratio = z * f * math.sqrt(d) / cohort
    if ratio <= NOISE_RATIO_LIMIT:
        return None
    norm = ratio * clip
    need = math.ceil(z * f * math.sqrt(d) / NOISE_RATIO_LIMIT)
    agnostic = exp.scenario.agnostic.enabled
    factor = "" if f == 1.0 else f" x {f:.3g}"
    return RunWarning(
        "noise",
        f"the noise dwarfs the signal: the expected L2 norm of the noise on a round's mean update is {norm:.3g}"
        f"{' (at least: agnostic FL weights the clients unequally)' if agnostic else ''}, {ratio:.3g}x the clip "
        f"{clip:g} that bounds the clipped mean's norm (z={z:.3g} x clip{factor} x sqrt(d), d={d:,} parameters, "
        f"over an expected cohort of {cohort:.4g} clients; {factors.how}); above {NOISE_RATIO_LIMIT:g}x a round's "
        f"update is mostly noise. The ratio is z{factor} x sqrt(d) / cohort, which the clip does not change (the "
        f"noise scales with it): raise the expected cohort to >= {need:,} clients (privacy.clients_per_round or "
        "sampling_rate, or more clients), lower z (privacy.noise_multiplier, for a larger epsilon; with "
        "privacy.target_epsilon: fewer rounds or a larger target), or train a smaller model",
        {
            "ratio": ratio,
            "limit": NOISE_RATIO_LIMIT,
            "noise_norm": norm,
            "clip": clip,
            "noise_multiplier": z,
            "parameters": d,
            "expected_cohort": cohort,
            "noise_factor_per_round": factors.per_round,
            "noise_factor_accumulated": factors.accumulated,
            "noise_factor_source": factors.how,
            "cohort_needed": need,
            "lower_bound": agnostic,
        },
    )


def _round_down(x: float) -> float:
    """``x`` rounded down to one significant digit (a delta to suggest)."""
    if x <= 0:
        return x
    e = math.floor(math.log10(x))
    return math.floor(x / 10**e) * 10**e


def format_warning(warning: RunWarning | dict[str, Any]) -> str:
    """One warning as a console line: ``warning (noise): ...``."""
    w = warning.to_dict() if isinstance(warning, RunWarning) else warning
    return f"warning ({w['kind']}): {w['message']}"


@contextlib.contextmanager
def printed(show: Callable[[str, bool], None]) -> Iterator[None]:
    """While inside: this module's records (:func:`log_start`) go to ``show(text, is_warning)`` instead of Python's
    logging (``fedsim run`` prints them on its console, above the progress bar)."""

    class _Show(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                show(record.getMessage(), record.levelno >= logging.WARNING)
            except Exception:  # a console that cannot print must not stop the run
                self.handleError(record)

    handler = _Show(logging.INFO)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
