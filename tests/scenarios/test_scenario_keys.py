"""scenario_keys lists every key of the schema with text read off its field, and refuses a field without a
description: docs/reference/scenario-keys.md is generated from it, so the page lists what the schema accepts."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from fedsim.privacy.accountants import certified_methods
from fedsim.round import NOISE_SOURCES, sampling_names
from fedsim.round.mechanism_options import option_names
from fedsim.scenarios import schema
from fedsim.scenarios.schema import Scenario, scenario_keys

DOCS_EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field of the schema by its dotted key, nested tables' fields too."""
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        nested = [a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type)]
        for model_ in (a for a in nested if issubclass(a, BaseModel)):
            out |= _fields(model_, f"{prefix}{name}.")
    return out


def test_every_field_is_listed_once_with_a_meaning():
    keys = [k.key for k in scenario_keys()]
    assert len(keys) == len(set(keys))
    assert _fields(Scenario) <= set(keys)
    assert all(k.meaning for k in scenario_keys())


def test_mechanism_options_and_table_options_are_listed():
    keys = {k.key: k for k in scenario_keys()}
    for name in NOISE_SOURCES:
        for option in option_names(name):
            assert f"`{name}`" in keys[f"privacy.mechanism.{option}"].allowed
    assert "model.<option>" in keys
    # defaults that differ between the mechanisms taking an option are each given
    assert "(`ddgauss`)" in keys["privacy.mechanism.k_stddevs"].default


def test_cells_come_from_the_fields():
    keys = {k.key: k for k in scenario_keys()}
    threshold = keys["privacy.secagg.threshold"]
    assert (threshold.type, threshold.default, threshold.allowed) == ("a number", "0.6", "in (0.5, 1]")
    assert keys["data.heldout_fraction"].allowed == "in [0, 1)"
    assert keys["privacy.randomness"].allowed == "one of `seeded`, `os-entropy`"
    assert keys["engine.torch_threads"].allowed == "a whole number in [1, 1024]; or one of `auto`"
    assert keys["privacy.target_epsilon"].default == ""  # not set
    assert keys["privacy"].table and keys["privacy.secagg"].table and not keys["privacy.clip"].table
    # the registries' names as registered now
    assert keys["privacy.sampling"].allowed == "a registered name: " + ", ".join(
        f"`{n}`" for n in sampling_names()
    )
    assert keys["privacy.accountant"].allowed.endswith(", ".join(f"`{n}`" for n in certified_methods()))


def test_a_field_without_a_description_fails():
    class Section(schema._Section):
        described: int = Field(1, description="has one")
        bare: int = 2

    with pytest.raises(ValueError, match=r"'t\.bare' has no description"):
        scenario_keys(Section, "t.")


def test_the_reference_page_has_a_row_per_key():
    sys.path.insert(0, str(DOCS_EXT))
    try:
        import fedsim_docs
    finally:
        sys.path.remove(str(DOCS_EXT))
    page = "\n".join(fedsim_docs.scenario_keys_markdown())
    assert all(f"| `{k.key}` |" in page for k in scenario_keys() if not k.table or "." in k.key)
    assert all(f"## `[{k.key}]`" in page for k in scenario_keys() if k.table and "." not in k.key)
    assert "\\<repo id>" in page  # escaped, or MyST would read it as HTML
