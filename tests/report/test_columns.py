"""fedsim.report.columns is the truth about a run directory: real runs hold no column and no file it does not
declare, and every column it declares for every row is in every row.

The reference page docs/reference/run-directory.md is generated from the same declaration, so these tests are what
keeps the page true. Three small runs cover the columns most settings add: the default run (written, so its files
are checked too), one with adaptive clipping, the membership attack, an evaluation sample and canaries, and agnostic
FL over domains. Each is 2 rounds on a small population, in process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fedsim
from fedsim.labels import NON_PRIVATE
from fedsim.report.columns import (
    KINDS,
    NON_PRIVATE_COLUMNS,
    NON_PRIVATE_KIND,
    ROW_COLUMNS,
    RUN_FILES,
    Column,
    documented,
)

SMALL = ["rounds=2", "engine.name=local"]
#: settings that add columns to a row; population 60 holds 6 held-out clients, so an evaluation sample of 3 is one
VARIANT = [
    "data.num_clients=60",
    "privacy.adaptive_clip=true",
    "report.membership_attack=true",
    "engine.eval_clients=3",
    "privacy.canaries=2",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The rows of each run by name (the default run's as written to metrics.jsonl), and its run directory."""
    out = tmp_path_factory.mktemp("columns") / "quickstart"
    fedsim.run("quickstart", out, overrides=[*SMALL, "data.num_clients=30"], write=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    variant = fedsim.run("quickstart", write=False, overrides=[*SMALL, *VARIANT]).rows
    agnostic = fedsim.run("agnostic-domains", write=False, overrides=[*SMALL, "data.num_clients=200"]).rows
    return {"rows": {"quickstart": rows, "variant": variant, "agnostic": agnostic}, "run_dir": out}


def _keys(rows: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Every top-level key and every key under non_private, over ``rows``."""
    top = {k for row in rows for k in row}
    under = {k for row in rows for k in row.get(NON_PRIVATE, {})}
    return top, under


def test_every_key_of_every_row_is_documented(runs):
    for name, rows in runs["rows"].items():
        top, under = _keys(rows)
        assert not {k for k in top if documented(k, ROW_COLUMNS) is None}, name
        assert not {k for k in under if documented(k, NON_PRIVATE_COLUMNS) is None}, name


def test_columns_said_to_be_in_every_row_are(runs):
    always = {k for k, c in ROW_COLUMNS.items() if c.when is None}
    always_under = {k for k, c in NON_PRIVATE_COLUMNS.items() if c.when is None}
    for name, rows in runs["rows"].items():
        for row in rows:
            assert not always - set(row), (name, row["round"])
            assert not always_under - set(row[NON_PRIVATE]), (name, row["round"])


def test_every_documented_column_appears_or_says_when(runs):
    top, under = set(), set()
    for rows in runs["rows"].values():
        t, u = _keys(rows)
        top |= t
        under |= u
    assert not {k for k, c in ROW_COLUMNS.items() if k not in top and c.when is None}
    assert not {k for k, c in NON_PRIVATE_COLUMNS.items() if k not in under and c.when is None}
    # the variants exercise the columns they are there for
    assert {"next_clip", "unclipped_fraction_noised", "empirical_privacy", "heldout_clients_evaluated"} <= top
    assert {"lambda_used", "domain_loss_noised", "domains_heldout"} <= top
    assert {"attack", "train_clients_evaluated", "domains_train"} <= under


def test_kinds_follow_where_a_column_is():
    """A column under non_private is non-private, and no top-level column is (but non_private itself)."""
    assert all(c.kind in KINDS for c in [*ROW_COLUMNS.values(), *NON_PRIVATE_COLUMNS.values()])
    assert {k for k, c in ROW_COLUMNS.items() if c.kind == NON_PRIVATE_KIND} == {NON_PRIVATE}
    assert all(c.kind == NON_PRIVATE_KIND for c in NON_PRIVATE_COLUMNS.values())
    assert all(c.meaning.strip() for c in [*ROW_COLUMNS.values(), *NON_PRIVATE_COLUMNS.values()])


def test_a_reason_beside_a_documented_column_is_documented():
    """An infinite value is written null with ``<key>_reason`` beside it (json_safe): that key is its column's."""
    reason = documented("paper_epsilon_igmm_reason", ROW_COLUMNS)
    assert isinstance(reason, Column) and reason.kind == ROW_COLUMNS["paper_epsilon_igmm"].kind
    assert documented("no_such_column_reason", ROW_COLUMNS) is None
    assert documented("no_such_column", ROW_COLUMNS) is None


def test_the_run_directory_holds_the_documented_files(runs):
    run_dir: Path = runs["run_dir"]
    written = {
        p.relative_to(run_dir).as_posix() + ("/" if p.is_dir() else "")
        for p in [*run_dir.iterdir(), *(run_dir / "plots").iterdir()]
        if p.name != "plots"
    }
    assert not written - set(RUN_FILES)
    assert not {name for name, f in RUN_FILES.items() if f.when is None} - written
