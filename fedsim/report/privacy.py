"""``fedsim privacy``: per-round epsilon by accountant, audit of the paper bounds, generalization.

Examples::

    fedsim privacy --population 1000 --clients-per-round 100 --sampling fixed \\
        --noise-multiplier 1.0 --clip 1.0 --rounds 1000 --delta 1e-5
    fedsim privacy --population 1000 --sampling-rate 0.1 --rounds 500 --delta 1e-5 --target-epsilon 3
    fedsim privacy ... --json

--json writes strict JSON: an epsilon that is infinite (no finite epsilon at this delta, e.g. PLD after many
rounds of little noise) is null, and so is an undefined one (NaN); in a per-round array the round's ``status``
beside it says which ("no finite epsilon at this delta"), and a single value in an object gets
``"<key>_reason": "infinite"`` beside it (the same convention as the run directory's files).

Also runnable as ``python -m fedsim.report.privacy``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from fedsim.privacy.accountants import (
    ACCOUNTANTS,
    CERTIFIED,
    DEFAULT_ACCOUNTANT,
    NOT_PRIVATE_NOTE,
    PAPER_BOUNDS,
    compute_curve,
    curve_methods,
    epsilon_at,
    method_kind,
    tightest,
)
from fedsim.privacy.certified import pld_checkpoints, quiet_absl
from fedsim.privacy.errors import PrivacyInputError
from fedsim.privacy.mechanism import Mechanism
from fedsim.privacy.paper.audit import audit_closed_forms
from fedsim.privacy.paper.calibration import CALIBRATION_RANGE, calibrate_noise
from fedsim.privacy.paper.generalization import statement_curve
from fedsim.privacy.schedule import (
    ScheduleAccounting,
    calibrate_schedule,
    schedule_bounds,
    schedule_epsilon_detail,
    schedule_methods,
)
from fedsim.privacy.settings import PrivacySettings
from fedsim.report.rundir import json_safe
from fedsim.round import NOISE_SOURCES
from fedsim.round.mechanism_options import MOVED_OPTIONS, check_mechanism_options, option_names
from fedsim.round.noise import default_placement
from fedsim.round.sampling import sampling_names
from fedsim.validation import NOISE_MULTIPLIER_RANGE, one_of, parse_value, target_out_of_reach

__all__ = ["add_parser", "build_parser", "main", "run"]

# mechanism/accountant field -> command-line option, for error messages
_OPTION = {
    "population": "--population",
    "sampling": "--sampling",
    "sampling_rate": "--sampling-rate",
    "clients_per_round": "--clients-per-round",
    "sampling_rate/clients_per_round": "--clients-per-round/--sampling-rate",
    "clip": "--clip",
    "noise_multiplier": "--noise-multiplier",
    "noise_placement": "--noise-placement",
    "rounds": "--rounds",
    "delta": "--delta",
    "method": "--methods",
    "target_epsilon": "--target-epsilon",
    "min_separation": "--min-separation",
    "max_participations": "--max-participations",
    "model_size": "--model-size",
}


class _MovedOption(argparse.Action):
    """A mechanism's option that was a flag of its own (``--bands 4``): refused, naming the ``--option`` it is
    now (the flag is kept, hidden, so that an old command line gets that answer rather than "unrecognized")."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} moved: give it as --option {self.dest}={values}")


def _mechanism_options_help() -> str:
    """Each registered mechanism's options, for ``--option``'s help."""
    listed = "; ".join(f"{n}: {', '.join(o)}" for n in NOISE_SOURCES if (o := option_names(n)))
    return f" ({listed})" if listed else ""


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--population", type=int, required=True, help="number of clients in the population")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--clients-per-round", type=int, help="clients per round (fixed) or expected (poisson)")
    g.add_argument("--sampling-rate", type=float, help="sampling probability q in (0, 1]")
    p.add_argument(
        "--sampling",
        "--schedule",
        dest="sampling",
        default="poisson",
        help=f"who takes part: one of {', '.join(sampling_names())} (default poisson); cyclic and min-separation "
        "are participation schedules",
    )
    p.add_argument(
        "--min-separation",
        type=int,
        default=None,
        help="cyclic: the number of groups b; min-separation: the least rounds between one client's rounds",
    )
    p.add_argument(
        "--max-participations",
        type=int,
        default=None,
        help="min-separation: the most rounds one client takes",
    )
    p.add_argument(
        "--mechanism",
        default="independent",
        help=f"the noise mechanism: one of {', '.join(NOISE_SOURCES)} (default independent)",
    )
    p.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the noise mechanism, repeatable"
        + _mechanism_options_help()
        + "; VALUE is read as --set reads it (e.g. --option bands=4; default: the mechanism's own)",
    )
    for moved in MOVED_OPTIONS:
        p.add_argument(f"--{moved}", dest=moved, action=_MovedOption, help=argparse.SUPPRESS)
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="Gaussian noise std on the sum / clip: 0 (no noise) or in [{:g}, {:g}] (required unless "
        "--target-epsilon)".format(*NOISE_MULTIPLIER_RANGE),
    )
    p.add_argument(
        "--bits",
        type=int,
        default=None,
        help="ddgauss, skellam: the secure sum's modulus 2^bits (the same as --option bits=N)",
    )
    p.add_argument(
        "--model-size",
        type=int,
        default=None,
        help="ddgauss, skellam: the number of parameters of the model update (their accounting depends on it)",
    )
    p.add_argument("--clip", type=float, default=1.0, help="L2 clip of one client's update (default 1)")
    p.add_argument(
        "--noise-placement",
        default=None,
        help="central or distributed (default central, or distributed for a mechanism that supports only it)",
    )
    p.add_argument("--rounds", type=int, required=True, help="number of rounds T")
    p.add_argument("--delta", type=float, default=1e-5, help="target delta in (0, 1) (default 1e-5)")
    p.add_argument(
        "--methods",
        nargs="+",
        default=curve_methods(),
        metavar="METHOD",
        help=f"accountants to run (default all with a curve): {', '.join(curve_methods())}",
    )
    p.add_argument(
        "--target-epsilon",
        type=float,
        default=None,
        help="calibrate: print the noise multiplier meeting this epsilon after --rounds, per method",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output: per-round arrays for every method (strict JSON: an infinite epsilon is "
        'null, with the round\'s status "no finite epsilon at this delta" in arrays and "<key>_reason": '
        '"infinite" beside a single value)',
    )
    p.set_defaults(func=run)
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``privacy`` on an argparse subparsers object (``func=run``)."""
    p = subparsers.add_parser(
        "privacy",
        help="epsilon per round by accountant, paper-bound audit, generalization statements",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return _configure(p)


def build_parser() -> argparse.ArgumentParser:
    return _configure(
        argparse.ArgumentParser(
            prog="fedsim privacy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
    )


#: a schedule's rdp curve is exact at every round up to this many rounds (one dp-accounting call each, about 2.5 ms),
#: then at checkpoints 10% apart, as for independent rounds
RDP_EVERY_ROUND = 1000


def _checkpoints(T: int) -> list[int]:
    pts = {1, T}
    k = 10
    while k < T:
        pts.add(k)
        k *= 10
    for f in (0.25, 0.5, 0.75):
        pts.add(max(1, int(round(T * f))))
    return sorted(pts)


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _fail(option: str, message: str) -> int:
    print(f"fedsim privacy: error: {option}: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the ``privacy`` subcommand; returns the exit code (2 on invalid input, no traceback)."""
    try:
        return _run(args)
    except PrivacyInputError as e:
        return _fail(_flag(e.field, args), f"{e.value!r} is invalid: {e.allowed}")


def _flag(field: str, args: argparse.Namespace) -> str:
    """The command-line option a refused field came from: ``--option bands`` for a mechanism's option (or for
    options the mechanism's class refused together, ``--option decays/output_scales``)."""
    given = {item.partition("=")[0].strip() for item in getattr(args, "options", None) or []}
    if given & set(str(field).split("/")):
        return f"--option {field}"
    return _OPTION.get(field, "--" + str(field).replace("_", "-"))


def _mechanism_options(items: list[str]) -> dict[str, object]:
    """``--option`` items (``["bands=4"]``) as the mechanism's options, each value read as ``--set`` reads it
    (:func:`fedsim.validation.parse_value`); checked against the mechanism by
    :func:`fedsim.round.mechanism_options.check_mechanism_options`, as a scenario's are."""
    options: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PrivacyInputError("option", item, "must be KEY=VALUE, e.g. --option bands=4")
        if key in options:
            raise PrivacyInputError(key, item, "is given twice")
        options[key] = parse_value(raw)
    return options


def _run(args: argparse.Namespace) -> int:
    """The curves of ``fedsim privacy``: check the arguments, calibrate the noise multiplier to
    ``--target-epsilon`` where asked, and print each accountant's epsilon over the rounds (a table, or JSON with
    ``--json``). A participation schedule or correlated noise goes to :func:`_scheduled`."""
    methods = list(dict.fromkeys(args.methods))
    settings = _privacy_settings(args, methods)
    if settings.noise_class.encodes:  # clients that encode for secure aggregation: the discrete report
        from fedsim.report.privacy_discrete import run_discrete

        return run_discrete(args, settings, _checkpoints(int(args.rounds)))
    T, delta = int(args.rounds), float(args.delta)
    mech = settings.mechanism_at(args.population)
    noise = settings.noise_source(0)
    if settings.scheduled:
        return _run_scheduled(args, mech, noise, T, delta, methods)

    calibration = None
    if args.target_epsilon is not None:
        mech, calibration = _calibrate(args, mech, T, delta, methods)

    shown = tuple(_checkpoints(T))  # the rounds the table prints: exact there
    curves = {m: compute_curve(mech, T, delta, m, exact_at=shown) for m in methods}
    cert_method = tightest(curves) or DEFAULT_ACCOUNTANT
    cert_curve = curves[cert_method] if cert_method in curves else compute_curve(mech, T, delta, cert_method)
    gen = {v: statement_curve(cert_curve.epsilon, delta, mech.population, v) for v in ("uai", "arxiv")}
    audit = audit_closed_forms(mech, T, delta) if any(m in PAPER_BOUNDS for m in methods) else {}

    if args.json:
        doc = dict(
            mechanism=dict(
                mech.to_dict(),
                q=mech.q,
                expected_cohort=mech.expected_cohort,
                neighbouring=mech.neighbouring,
                sensitivity=mech.sensitivity,
                noise_std=mech.noise_std,
            ),
            rounds=T,
            delta=delta,
            certified_method=cert_method,
            methods={m: c.to_dict() for m, c in curves.items()},
            generalization=gen,
            audit={k: {kk: _jsonable(vv) for kk, vv in v.items()} for k, v in audit.items()},
            calibration=calibration,
            target_epsilon=args.target_epsilon,
        )
        # strict JSON: NaN is null; an infinite value is null with "<key>_reason": "infinite" beside it
        json.dump(json_safe(doc), sys.stdout, indent=None, allow_nan=False, default=_jsonable)
        sys.stdout.write("\n")
        return 0

    print(_human(mech, T, delta, curves, cert_method, gen, audit, calibration, args.target_epsilon))
    return 0


def _privacy_settings(args: argparse.Namespace, methods: list[str]) -> PrivacySettings:
    """The arguments as the one privacy-settings object, checked by the rules a scenario is checked by
    (:mod:`fedsim.privacy.settings`); a :class:`PrivacyInputError` naming the first bad option. Without
    ``--noise-multiplier`` the settings hold 1 until it is calibrated to ``--target-epsilon``."""
    for m in methods:
        if m not in ACCOUNTANTS:
            raise PrivacyInputError("method", m, f"must be one of {', '.join(ACCOUNTANTS)}")
    if args.rounds is None or args.rounds < 1:
        raise PrivacyInputError("rounds", args.rounds, "must be an integer >= 1")
    if not (0 < args.delta < 1):
        raise PrivacyInputError("delta", args.delta, "must be in (0, 1)")
    if args.noise_multiplier is None and args.target_epsilon is None:
        raise PrivacyInputError("noise_multiplier", None, "required (or give --target-epsilon to calibrate)")
    noise_class = NOISE_SOURCES[one_of("mechanism", args.mechanism, tuple(NOISE_SOURCES))]
    options = _mechanism_options(args.options)
    if args.bits is not None:
        if "bits" in options:
            raise PrivacyInputError("bits", args.bits, "is given twice (--bits and --option bits)")
        options["bits"] = args.bits
    placement_name = args.noise_placement
    if placement_name is None:  # central, unless the mechanism adds its noise on the clients only
        placement_name = default_placement(noise_class)
    certified = [m for m in methods if m in CERTIFIED]
    if noise_class.encodes:  # its own report (fedsim.report.privacy_discrete): its accountants only
        asked = [m for m in methods if m not in noise_class.accountants]
        if args.methods != curve_methods() and asked:
            raise PrivacyInputError(
                "method",
                asked[0],
                f"cannot account mechanism={args.mechanism!r}; allowed: {', '.join(noise_class.accountants)}",
            )
        certified = list(noise_class.accountants)
    elif (
        noise_class.accountants is not None
    ):  # a mechanism that names its accountants: the first the user ran
        certified = [m for m in certified if m in noise_class.accountants] or list(noise_class.accountants)
    if noise_class.encodes and args.target_epsilon is not None:
        raise PrivacyInputError(
            "target_epsilon",
            args.target_epsilon,
            f"is not calibrated by fedsim privacy for mechanism={args.mechanism!r}: give --noise-multiplier (a "
            "scenario's privacy.target_epsilon calibrates it for a run)",
        )
    settings = PrivacySettings(
        sampling=args.sampling,
        sampling_rate=args.sampling_rate,
        clients_per_round=args.clients_per_round,
        clip=args.clip,
        noise_multiplier=args.noise_multiplier if args.noise_multiplier is not None else 1.0,
        noise_placement=placement_name,
        mechanism=args.mechanism,
        mechanism_options=check_mechanism_options(args.mechanism, options),
        min_separation=args.min_separation,
        max_participations=args.max_participations,
        delta=float(args.delta),
        accountant=certified[0] if certified else DEFAULT_ACCOUNTANT,
    )
    if not settings.mechanism_at(args.population).gaussian and not noise_class.encodes:
        kind = settings.noise_class.noise_kind
        raise PrivacyInputError(
            "mechanism",
            args.mechanism,
            f"draws {kind} noise: fedsim privacy computes curves for Gaussian noise; run a scenario with it (fedsim "
            f"run), whose ledger its accountants ({', '.join(settings.noise_class.accountants or ())}) account",
        )
    return settings


def _calibrate(
    args: argparse.Namespace, mech: Mechanism, T: int, delta: float, methods: list[str]
) -> tuple[Mechanism, dict[str, float | None]]:
    """The noise multiplier each method needs for ``--target-epsilon`` after ``T`` rounds, and the mechanism to
    compute the curves for: ``mech`` as given with ``--noise-multiplier``, else with the least noise a certified
    accountant certifies the target at. A target out of reach raises (:func:`target_out_of_reach`)."""
    if not (args.target_epsilon > 0 and math.isfinite(args.target_epsilon)):
        raise PrivacyInputError("target_epsilon", args.target_epsilon, "must be a positive finite number")
    calibration = {m: calibrate_noise(mech, args.target_epsilon, delta, T, m) for m in methods}
    if args.noise_multiplier is not None:
        return mech, calibration
    # the least noise a certified accountant certifies the target at (the default when none was asked for)
    picks = [m for m in methods if m in CERTIFIED] or [DEFAULT_ACCOUNTANT]
    found = {
        m: calibration[m] if m in calibration else calibrate_noise(mech, args.target_epsilon, delta, T, m)
        for m in picks
    }
    met = {m: z for m, z in found.items() if z is not None}
    if not met or min(met.values()) <= CALIBRATION_RANGE[0]:
        # not met even at the most noise searched, or already at the least: nothing to calibrate to
        by = min(met, key=met.get) if met else picks[0]
        reach = tuple(epsilon_at(mech.replace(noise_multiplier=zz), T, delta, by) for zz in CALIBRATION_RANGE)
        raise target_out_of_reach(
            "target_epsilon", args.target_epsilon, T, delta, CALIBRATION_RANGE, reach, by
        )
    return mech.replace(noise_multiplier=min(met.values())), calibration


def _run_scheduled(args, mech: Mechanism, noise, T: int, delta: float, methods: list[str]) -> int:
    with quiet_absl():
        return _scheduled(args, mech, noise, T, delta, methods)


def _scheduled(args, mech: Mechanism, noise, T: int, delta: float, methods: list[str]) -> int:
    """A participation schedule or correlated noise: the certified epsilon of the first t rounds, from the
    schedule's closed-form event (:meth:`fedsim.privacy.ScheduleAccounting.run_event`, what a run's ledger composes
    round by round); the papers' closed forms do not describe these mechanisms."""
    noise.prepare(T, *schedule_bounds(mech.scheme, mech.min_separation, mech.max_participations))
    accounting = ScheduleAccounting.for_schedule(
        noise, mech.scheme, mech.sampling_rate, mech.min_separation, mech.max_participations
    )
    certified = [m for m in methods if m in schedule_methods()]
    skipped = [m for m in methods if m not in certified]
    if not certified:
        raise PrivacyInputError(
            "method",
            methods,
            f"a schedule or correlated noise is accounted by {' or '.join(schedule_methods())} only "
            "(dp-accounting)",
        )
    calibration = None
    notes: list[str] = []
    z = mech.noise_multiplier
    if args.target_epsilon is not None:
        target = args.target_epsilon
        if not (target > 0 and math.isfinite(target)):
            raise PrivacyInputError("target_epsilon", target, "must be a positive finite number")

        calibration = {m: calibrate_schedule(accounting, T, target, delta, m, notes=notes) for m in certified}
        if args.noise_multiplier is None:
            z = max(calibration.values())  # the larger: the target holds under every certified accountant
    shown = _checkpoints(T)
    curves: dict[str, list[float | None]] = {}
    exact_at: dict[str, list[int]] = {}
    for m in certified:
        curves[m], exact_at[m] = _schedule_curve(accounting, m, T, z, delta, shown, notes)
    _, s_T, exact = (
        accounting.prefix(T) if not accounting.amplified else (0.0, accounting.column_squared, True)
    )
    doc = dict(
        mechanism=dict(mech.to_dict(), noise_multiplier=z, noise=noise.describe()),
        accounting=accounting.describe(),
        sensitivity=math.sqrt(s_T),
        sensitivity_describes="per participation (amplified)" if accounting.amplified else "the whole run",
        sensitivity_exact=exact,
        rounds=T,
        delta=delta,
        methods={m: {"epsilon": c, "exact_at": exact_at[m]} for m, c in curves.items()},
        notes=notes,
        not_applicable={m: "the papers' closed forms analyse independent rounds" for m in skipped},
        calibration=calibration,
        target_epsilon=args.target_epsilon,
    )
    if args.json:
        json.dump(json_safe(doc), sys.stdout, indent=None, allow_nan=False, default=_jsonable)
        sys.stdout.write("\n")
        return 0
    print(_scheduled_human(doc, mech, shown))
    return 0


def _schedule_curve(
    accounting: ScheduleAccounting, m: str, T: int, z: float, delta: float, shown: list[int], notes: list[str]
) -> tuple[list[float | None], list[int]]:
    """Method ``m``'s epsilon after each of rounds 1..T, and the rounds it was computed at exactly. An accountant
    cheap per round (rdp) is computed at every round (up to ``RDP_EVERY_ROUND`` rounds, then at checkpoints as for
    independent rounds); pld (a PLD per point) at the printed rounds; in between, the next one's value (an upper
    bound: epsilon grows with t). What the reader must know about that is appended to ``notes``."""
    every_round = ACCOUNTANTS[m].cheap_per_round
    if every_round:
        at = (
            list(range(1, T + 1))
            if T <= RDP_EVERY_ROUND
            else sorted({*pld_checkpoints(T, dense=10, ratio=1.1).tolist(), *shown})
        )
    else:
        at = shown
    values, fell_back = {}, []
    for t in at:
        values[t], why = schedule_epsilon_detail(accounting, t, z, delta, m)
        if why is not None:
            fell_back.append((t, why))
    curve = [values[min(p for p in at if p >= t)] for t in range(1, T + 1)]
    if every_round and T > RDP_EVERY_ROUND:
        notes.append(
            f"{m}: exact at {len(at)} checkpoint rounds; rounds in between report the next checkpoint's "
            "epsilon (an upper bound)"
        )
    if fell_back:
        notes.append(
            f"pld: answered with rdp (a valid, looser upper bound) from round {fell_back[0][0]} on: PLD "
            f"accounting is impractical there ({fell_back[-1][1]})"
        )
    return curve, list(at)


def _scheduled_human(doc: dict[str, Any], mech: Mechanism, shown: list[int]) -> str:
    """What :func:`_scheduled` prints without ``--json``: its JSON document ``doc`` as text (the mechanism, the
    calibrated noise multipliers, epsilon at the ``shown`` rounds, the notes and the methods not shown)."""
    z, T, delta = doc["mechanism"]["noise_multiplier"], doc["rounds"], doc["delta"]
    curves = {m: v["epsilon"] for m, v in doc["methods"].items()}
    skipped = list(doc["not_applicable"])
    lines = [
        f"population {mech.population}, {mech.scheme.describe(mech)}, add-remove, clip {mech.clip:g}, noise "
        f"multiplier {z:.4g}, delta {delta:g}, {T} rounds",
        f"mechanism: {doc['accounting']}",
        f"sensitivity ({doc['sensitivity_describes']}): {doc['sensitivity']:.6g} x clip"
        + ("" if doc["sensitivity_exact"] else " (an upper bound)"),
    ]
    if doc["calibration"] is not None:
        lines += ["", f"noise multiplier for epsilon <= {doc['target_epsilon']:g} after {T} rounds:"]
        lines += [f"  {m:<15} {v:.4g}" for m, v in doc["calibration"].items()]
    lines += ["", "  ".join(["round".rjust(6)] + [m.rjust(10) for m in curves])]
    for t in shown:
        lines.append("  ".join([str(t).rjust(6)] + [_cell(curves[m][t - 1]).rjust(10) for m in curves]))
    lines.append("")
    lines.append("epsilon at the given delta, certified by dp-accounting")
    lines += doc["notes"]
    if skipped:
        lines.append(f"not shown: {', '.join(skipped)} (the papers' closed forms analyse independent rounds)")
    return "\n".join(lines)


def _jsonable(v):
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    return v


def _cell(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}"


def _table_cell(e: float, status: str) -> str:
    if math.isfinite(e):
        return _cell(e)
    if "undefined" in status:
        return "undef"
    return "inf" if e > 0 else "none"


def _human(mech, T, delta, curves, cert_method, gen, audit, calibration, target) -> str:
    lines = []
    samp = mech.scheme.describe(mech)
    lines.append(
        f"population {mech.population}, {samp}, {mech.neighbouring}, clip {mech.clip:g}, "
        f"noise multiplier {mech.noise_multiplier:.4g} (std {mech.noise_std:.4g} on the sum, {mech.noise_placement}), "
        f"delta {delta:g}, {T} rounds"
    )
    if calibration is not None:
        lines.append("")
        lines.append(f"noise multiplier for epsilon <= {target:g} after {T} rounds:")
        for m, z in calibration.items():
            tag = "" if m in CERTIFIED else f"  ({method_kind(m)})"
            lines.append(f"  {m:<15} {'no statement' if z is None else f'{z:.4g}'}{tag}")
    lines.append("")
    names = list(curves)
    header = (
        ["round"]
        + [n + ("*" if n in PAPER_BOUNDS else "") for n in names]
        + ["gen (UAI, from " + cert_method + ")"]
    )
    rows = []
    for t in _checkpoints(T):
        row = [str(t)]
        for n in names:
            c = curves[n]
            e = c.epsilon[t - 1]
            row.append(_table_cell(e, str(c.status[t - 1])))
        g = gen["uai"][t - 1]
        if g["status"] == "ok":
            row.append(f"ok: P(|gap|>{g['a']:.3g})<{g['b']:.2g}")
        elif g["status"] == "vacuous":
            row.append(f"vacuous (a={g['a']:.3g})")
        else:
            row.append(f"none: needs N>={g['n_min']}" if g["n_min"] else "none")
        rows.append(row)
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    lines.append(
        "  ".join(
            h.rjust(w) if i < len(header) - 1 else h
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for r in rows:
        lines.append(
            "  ".join(
                v.rjust(w) if i < len(r) - 1 else v for i, (v, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    lines.append("")
    lines.append(
        "epsilon at the given delta; pld, rdp: certified (dp-accounting); igmm-corrected, kairouz, basic: "
        "valid closed-form bounds; * = paper bound (not a certificate); undef = the printed bound is "
        "undefined there; inf = no finite epsilon at this delta; none = no statement at this delta"
    )
    if not mech.private:  # one line for all: every method says the same
        lines.append(f"NOT PRIVATE: {NOT_PRIVATE_NOTE}")
    for n in names:
        for note in curves[n].notes if mech.private else ():
            if n not in PAPER_BOUNDS and note:
                lines.append(f"{n}: {note}")
    g_last = gen["uai"][-1]
    need = (
        f"the statement needs N >= {g_last['n_min']:,} clients"
        if g_last["n_min"]
        else "no population size gives a statement at this epsilon (too large)"
    )
    lines.append(f"generalization (UAI Thm 1) after round {T}: {g_last['status']}; {need}")
    g_ax = gen["arxiv"][-1]
    lines.append(
        f"generalization (arXiv Thm 1) after round {T}: {g_ax['status']}"
        + (f" (a={g_ax['a']:.3g}, b={g_ax['b']:.2g})" if g_ax["status"] == "ok" else "")
    )
    if audit:
        lines.append("")
        lines.append(f"audit after round {T}:")
        for m, a in audit.items():
            lines.append(f"  {m}: {a['verdict']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
