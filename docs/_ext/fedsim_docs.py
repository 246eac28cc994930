"""Sphinx extension: fedsim's generated reference pages.

Two directives write their tables from the code at build time, so the pages cannot drift from it:

- ``{fedsim-scenario-keys}``: every scenario key (:func:`fedsim.scenarios.schema.scenario_keys`, which raises for
  a field without a description, so the build fails naming it), one table per section of the schema;
- ``{fedsim-run-directory}``: the run directory's files and every column of a row, with what each says about
  privacy (:mod:`fedsim.report.columns`, which tests/report/test_columns.py checks against real runs).

Each renders Markdown (:func:`scenario_keys_markdown`, :func:`run_directory_markdown`: plain functions, testable
without Sphinx) and parses it as part of the page, so headings become the page's sections with MyST's anchors.
"""

from __future__ import annotations

import importlib

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: on one line (a newline would end the row), ``|`` escaped (it would end
    the cell, in a code span too), and outside code spans ``<`` (``'hf:<repo id>'`` would read as HTML) and ``*``
    (``noise_multiplier * clip`` could read as emphasis)."""
    spans = " ".join(str(text).split()).replace("|", "\\|").split("`")
    for i in range(0, len(spans), 2):  # the even pieces are outside code spans
        spans[i] = spans[i].replace("<", "\\<").replace("*", "\\*")
    return "`".join(spans)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def scenario_keys_markdown() -> list[str]:
    """The scenario keys as Markdown: the top-level keys in one table, then a section per table of the schema
    (``[privacy]``), its nested tables' keys (``privacy.secagg.*``) in it, each introduced by its description."""
    from fedsim.scenarios.schema import scenario_keys

    keys = scenario_keys()
    tables = [k for k in keys if k.table and "." not in k.key]
    header = ["key", "type", "default", "allowed", "meaning"]

    def row(k) -> list[str]:
        return [_code(k.key), k.type, _code(k.default), k.allowed, k.meaning]

    lines = ["## Top-level keys", ""]
    lines += _table(header, [row(k) for k in keys if "." not in k.key and not k.table])
    for table in tables:
        inside = [k for k in keys if k.key.startswith(table.key + ".")]
        lines += [f"## `[{table.key}]`", "", _cell(table.meaning[:1].upper() + table.meaning[1:]) + ".", ""]
        lines += _table(header, [row(k) for k in inside])
    return lines


def run_directory_markdown() -> list[str]:
    """The run directory as Markdown: its files, the kinds of value, the columns of a row and of its
    ``non_private``."""
    from fedsim.labels import NON_PRIVATE
    from fedsim.report.columns import KINDS, NON_PRIVATE_COLUMNS, ROW_COLUMNS, RUN_FILES

    every = "every run"
    lines = ["## Files", ""]
    lines += _table(
        ["file", "holds", "written"],
        [[_code(name), f.meaning, f.when or every] for name, f in RUN_FILES.items()],
    )
    lines += ["## What a value says about privacy", ""]
    lines += _table(["kind", "meaning"], [[k, m] for k, m in KINDS.items()])
    columns = ["column", "kind", "meaning", "present"]
    lines += ["## Columns of a row", ""]
    lines += _table(
        columns, [[_code(n), c.kind, c.meaning, c.when or "every row"] for n, c in ROW_COLUMNS.items()]
    )
    lines += [f"## Columns under `{NON_PRIVATE}`", ""]
    lines += _table(
        columns,
        [[_code(n), c.kind, c.meaning, c.when or "every row"] for n, c in NON_PRIVATE_COLUMNS.items()],
    )
    return lines


class _GeneratedMarkdown(SphinxDirective):
    """A directive whose content is Markdown made by ``generate`` and parsed in place (headings included)."""

    has_content = False
    #: the modules the tables are read from: the page is rebuilt when one changes
    sources: tuple[str, ...] = ()

    @staticmethod
    def generate() -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        for module in self.sources:
            self.env.note_dependency(importlib.import_module(module).__file__)
        container = nodes.container()
        source = f"<{self.name}>"
        self.state.nested_parse(
            StringList(self.generate(), source=source), self.content_offset, container, match_titles=True
        )
        return container.children


class ScenarioKeys(_GeneratedMarkdown):
    generate = staticmethod(scenario_keys_markdown)
    sources = ("fedsim.scenarios.schema",)


class RunDirectory(_GeneratedMarkdown):
    generate = staticmethod(run_directory_markdown)
    sources = ("fedsim.report.columns",)


def setup(app):
    app.add_directive("fedsim-scenario-keys", ScenarioKeys)
    app.add_directive("fedsim-run-directory", RunDirectory)
    return {"version": "1", "parallel_read_safe": True}
