"""Find, read, override and validate scenarios.

``load_scenario("quickstart", ["rounds=5", "privacy.noise_multiplier=0.8"])`` returns a validated
:class:`~fedsim.scenarios.schema.Scenario`. Every failure raises :class:`ScenarioError` whose message
names the scenario, the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedsim.validation import ScenarioError as ScenarioError  # defined below every package; exported here
from fedsim.validation import parse_value

from .schema import ERROR_AT_KEY, Scenario


def _shipped_dir() -> Path:
    return Path(str(resources.files("fedsim.scenarios")))


#: old names of shipped scenarios, still accepted
ALIASES = {"agnostic": "agnostic-domains"}


def available_scenarios() -> list[str]:
    """Names of the scenarios shipped with fedsim."""
    return sorted(p.stem for p in _shipped_dir().glob("*.toml"))


def _resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ScenarioError(f"scenario file not found: {name_or_path}")
        return path
    shipped = _shipped_dir() / f"{ALIASES.get(name_or_path, name_or_path)}.toml"
    if shipped.is_file():
        return shipped
    raise ScenarioError(
        f"unknown scenario {name_or_path!r}; available: {', '.join(available_scenarios())} "
        "(or give the path of a .toml file)"
    )


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"privacy.clip=0.5"`` -> (["privacy", "clip"], 0.5). Values are read as TOML, else as strings."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"--set expects key=value (e.g. rounds=5 or privacy.clip=0.5), got {item!r}")
    return key.split("."), parse_value(raw)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set key=value`` item to a scenario's raw data (a dict, changed in place)."""
    keys, value = parse_override(item)
    _apply(data, keys, value, item)


#: keys whose value may be a table's shorthand, and the table's key it stands for: ``privacy.mechanism = "tree"``
#: is ``[privacy.mechanism] name = "tree"``, so that ``--set privacy.mechanism.bands=4`` (or a sweep's grid key)
#: on it sets an option and keeps the name (``none``, no mechanism named, is the empty table)
SHORTHANDS: dict[tuple[str, ...], str] = {("privacy", "mechanism"): "name"}


def _apply(data: dict[str, Any], path: list[str], value: Any, item: str) -> None:
    node = data
    for depth, part in enumerate(path[:-1], start=1):
        child = node.setdefault(part, {})
        short = SHORTHANDS.get(tuple(path[:depth]))
        if short is not None and (child is None or isinstance(child, str)):
            child = node[part] = {} if child is None else {short: child}
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {item}: {part!r} is a value, not a section")
        node = child
    node[path[-1]] = value


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid scenario {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(scenario)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            model: Any = Scenario
            for p in parent:
                model = model.model_fields[str(p)].annotation
            allowed = ", ".join(model.model_fields)
            msg = f"unknown key; allowed here: {allowed}"
            near = difflib.get_close_matches(str(e["loc"][-1]), list(model.model_fields), n=1, cutoff=0.6)
            if near:
                msg = f"unknown key (did you mean {'.'.join([*map(str, parent), near[0]])}?); allowed here: {allowed}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        value = e.get("input")
        if e["type"] == ERROR_AT_KEY:  # about one key of the section (schema.error_at): shown at that key
            ctx = e.get("ctx") or {}
            loc, msg, value = f"{loc}.{ctx['key']}", ctx["message"], ctx["value"]
        shown = "" if isinstance(value, dict) or e["type"] == "extra_forbidden" else f" (got {value!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


TARGET, NOISE = "privacy.target_epsilon", "privacy.noise_multiplier"


@dataclass(frozen=True)
class Setting:
    """One value of one dotted key, and where it came from (``scenario file quickstart.toml``, ``--set``, ``sweep
    variant 'dp-fedavg'``, ``sweep grid``), for the messages that name two settings."""

    key: str
    value: Any
    origin: str

    def __str__(self) -> str:
        return f"{self.key} = {_shown(self.value)} ({self.origin})"


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return repr(value)
    return format(value, "g") if isinstance(value, float) else str(value)


def _leaves(keys: list[str], value: Any) -> list[tuple[str, Any]]:
    """``(["privacy"], {"clip": 1})`` -> ``[("privacy.clip", 1)]``: the dotted keys a value sets."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves([*keys, str(k)], v)]
    return [(".".join(keys), value)]


def override_settings(overrides: list[str], origins: list[str] | None = None) -> list[Setting]:
    """The settings ``--set`` items make (``origins[i]``: where item ``i`` came from; default ``--set``)."""
    origins = origins or ["--set"] * len(overrides)
    return [
        Setting(key, value, origin)
        for item, origin in zip(overrides, origins, strict=True)
        for key, value in _leaves(*parse_override(item))
    ]


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def noise_precedence(layers: list[list[Setting]]) -> tuple[list[str], bool]:
    """Merge ``privacy.target_epsilon`` and ``privacy.noise_multiplier`` over ``layers`` (the scenario file first,
    then each later layer: ``--set``; a sweep's ``--set`` items with its setting), or refuse them.

    - Within one layer after the file, a ``target_epsilon`` (not ``none``) beside a ``noise_multiplier`` is refused
      (:class:`ScenarioError` naming both): one of the two would be thrown away.
    - ``noise_multiplier = 0`` (the non-private baseline) with a ``target_epsilon`` from any layer is refused: a
      calibration never gives a non-private run, and a run labelled non-private must not run with noise.
    - Otherwise the later layer decides: a target from a later layer (or the same file) replaces a noise
      multiplier (it is calibrated), a noise multiplier from a later layer replaces a target (no calibration).

    Returns the rules applied, as sentences (printed where a run starts, written to ``config.toml`` and
    ``summary.json``), and whether the target is dropped (a later noise multiplier replaced it)."""
    target: tuple[Setting, int] | None = None
    noise: tuple[Setting, int] | None = None
    for i, layer in enumerate(layers):
        t = next((s for s in reversed(layer) if s.key == TARGET), None)
        n = next((s for s in reversed(layer) if s.key == NOISE), None)
        if i > 0 and t is not None and t.value is not None and n is not None:
            raise ScenarioError(
                f"{t} and {n} are set together: a target epsilon calibrates the noise multiplier, so one of the "
                "two would be thrown away. Give one of them (with privacy.noise_multiplier = 0, the non-private "
                "baseline, set privacy.target_epsilon = none)"
            )
        target = (t, i) if t is not None else target
        noise = (n, i) if n is not None else noise
    if target is None or target[0].value is None or noise is None:
        return [], False
    (t, ti), (n, ni) = target, noise
    if _is_zero(n.value):
        raise ScenarioError(
            f"{n} asks for the non-private baseline, and {t} for a noise multiplier calibrated to that epsilon: a "
            "calibration never gives a non-private run. For the baseline, set privacy.target_epsilon = none "
            f"beside it; for the target, do not set privacy.noise_multiplier = 0"
        )
    if ni > ti:
        return [
            f"{n} replaces {t}: the run uses this noise multiplier and is not calibrated to a target"
        ], True
    if ni == ti:  # both in the scenario file (as in a calibrated run's config.toml): the target decides
        return [
            f"{t} decides the noise multiplier (calibrated to it); {n} in the same file is not used"
        ], False
    return [f"{t} replaces {n}: the noise multiplier is calibrated to the target epsilon"], False


def load_scenario(
    name_or_path: str, overrides: list[str] | None = None, *, origins: list[str] | None = None
) -> Scenario:
    """The validated scenario: the file, then ``overrides`` (``--set`` items, one layer; ``origins[i]`` names where
    item ``i`` came from in messages, default ``--set``). Settings that would silently replace each other are
    refused or merged by a stated rule (:func:`noise_precedence`), kept in ``scenario.privacy.rules``."""
    path = _resolve(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"scenario {path} is not UTF-8 text, as TOML must be ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise ScenarioError(f"scenario {path} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"scenario {path} is not valid TOML: {exc}") from None
    overrides = list(overrides or [])
    if origins is not None and len(origins) != len(overrides):
        raise ValueError(f"origins: {len(origins)} for {len(overrides)} overrides")
    file_privacy = data.get("privacy") if isinstance(data.get("privacy"), dict) else {}
    file_layer = [
        Setting(f"privacy.{k}", file_privacy[k], f"scenario file {path.name}")
        for k in ("target_epsilon", "noise_multiplier")
        if k in file_privacy
    ]
    for item in overrides:
        if parse_override(item)[0] == ["privacy"]:  # the whole table replaced: the file's values are gone
            file_layer = []
        apply_override(data, item)
    settings = override_settings(overrides, origins)
    rules, drop_target = noise_precedence([file_layer, settings])
    if drop_target:
        data["privacy"]["target_epsilon"] = None
    data.setdefault("name", path.stem)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        text = format_validation_error(exc, repr(name_or_path))
        # which of the overrides the refusal is about, and where each came from (a sweep's variant, its grid)
        named = [s for s in settings if re.search(rf"\b{re.escape(s.key.rsplit('.', 1)[-1])}\b", text)]
        if named:
            text += "\n  set by: " + "; ".join(str(s) for s in named) + f"; every other value: {path.name}"
        raise ScenarioError(text) from None
    scenario.privacy.rules = rules
    return scenario


def scenario_to_toml(scenario: Scenario) -> str:
    """``scenario`` as the TOML text a run writes to ``config.toml`` (values that are ``None`` left out), which
    :func:`load_scenario` reads back (``fedsim run --resume``, :func:`fedsim.load_model`); comments above it say
    where the noise multiplier came from (its calibration to a target epsilon, the precedence rules applied)."""
    import tomli_w  # only when writing a scenario

    comments = [f"# {line}" for line in scenario.privacy.provenance(scenario.rounds)]
    text = tomli_w.dumps(scenario.model_dump(mode="json", exclude_none=True))
    return "\n".join([*comments, text]) if comments else text
