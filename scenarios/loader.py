"""Find, read, override and validate scenarios.

``load_scenario("quickstart", ["rounds=5", "privacy.noise_multiplier=0.8"])`` returns a validated
:class:`~fedsim.scenarios.schema.Scenario`. Every failure raises :class:`ScenarioError` whose message
names the scenario, the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .schema import Scenario


class ScenarioError(ValueError):
    """A scenario could not be found, parsed or validated."""


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
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string such as poisson or mnist1d
    if raw.lower() in ("none", "null"):
        value = None
    return key.split("."), value


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set key=value`` item to a scenario's raw data (a dict, changed in place)."""
    keys, value = parse_override(item)
    _apply(data, keys, value, item)


def _apply(data: dict[str, Any], path: list[str], value: Any, item: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
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
        shown = "" if isinstance(value, dict) or e["type"] == "extra_forbidden" else f" (got {value!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
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
    for item in overrides or []:
        apply_override(data, item)
    data.setdefault("name", path.stem)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, repr(name_or_path))) from None


def scenario_to_toml(scenario: Scenario) -> str:
    import tomli_w  # only when writing a scenario

    return tomli_w.dumps(scenario.model_dump(mode="json", exclude_none=True))
