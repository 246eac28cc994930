"""Scenario schema, loader and the shipped TOML scenarios (installed as ``fedsim.scenarios``)."""

from .loader import ScenarioError, available_scenarios, load_scenario, parse_override, scenario_to_toml
from .schema import Scenario

__all__ = [
    "Scenario",
    "ScenarioError",
    "available_scenarios",
    "load_scenario",
    "parse_override",
    "scenario_to_toml",
]
