"""Error messages that point at the documentation (:data:`fedsim.labels.DOCS`, :func:`fedsim.labels.see_docs`) point
at pages and headings that exist, and the errors about the neighbouring relation and the engine choice carry them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedsim.labels import DOCS, see_docs

ROOT = Path(__file__).resolve().parents[1]
DOCS_DIR = ROOT / "docs"
_CITED = re.compile(r"docs/([\w./-]+\.md)(?:#([\w-]+))?")


def _slug(title: str) -> str:
    """A heading's anchor as MyST makes it (``myst_heading_anchors``: mdit_py_plugins.anchors' default slugify),
    from the heading's text with inline code's backticks dropped."""
    text = title.replace("`", "").strip().lower().replace(" ", "-")
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", text)


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(_slug(m.group(1)))
    return anchors


def test_the_slug_is_mysts():
    assert _slug("Pick an engine: `engine.name`") == "pick-an-engine-enginename"
    assert _slug("The neighbouring relation") == "the-neighbouring-relation"


@pytest.mark.parametrize("topic", sorted(DOCS))
def test_every_topic_names_a_page_and_heading_that_exist(topic):
    page, anchor = DOCS[topic]
    assert (DOCS_DIR / page).is_file(), f"{topic}: docs/{page} does not exist"
    if anchor:
        assert anchor in _anchors(DOCS_DIR / page), f"{topic}: docs/{page} has no heading #{anchor}"
    assert see_docs(topic) == f"see docs/{page}" + (f"#{anchor}" if anchor else "")


def test_every_docs_page_the_code_cites_exists():
    sources = [p for folder in ("fedsim", "strategies", "scenarios") for p in (ROOT / folder).rglob("*.py")]
    missing = []
    for source in sources:
        for page, anchor in _CITED.findall(source.read_text()):
            path = DOCS_DIR / page
            if not path.is_file() or (anchor and anchor not in _anchors(path)):
                missing.append(f"{source.relative_to(ROOT)}: docs/{page}" + (f"#{anchor}" if anchor else ""))
    assert not missing, "cited but missing:\n" + "\n".join(missing)


def test_a_refusal_on_the_neighbouring_relation_points_at_its_explanation():
    from fedsim.scenarios import ScenarioError, load_scenario

    with pytest.raises(ScenarioError) as err:
        load_scenario(
            "quickstart",
            [
                "privacy.canaries=2",
                "privacy.sampling=fixed",
                "privacy.sampling_rate=none",
                "privacy.clients_per_round=10",
            ],
        )
    assert "replace-one" in str(err.value) and see_docs("neighbouring") in str(err.value)


def test_an_unknown_engine_points_at_the_engine_choice():
    from fedsim.scenarios import ScenarioError, load_scenario

    with pytest.raises(ScenarioError) as err:
        load_scenario("quickstart", ["engine.name=nope"])
    assert "engine.name: must be one of" in str(err.value) and see_docs("engine") in str(err.value)
