"""docs/architecture.md stays true to the code: every file it names exists, every name it gives in backticks is
defined (a dotted ``fedsim.x.y`` imports and resolves), its layer table is the one the imports follow, and no
module still points to the design document it replaced (``shared/DESIGN.md``, outside the repository).

The document is read as text; nothing in it is executed. Only spans that read as code are checked: a path under one
of the repository's folders, a dotted name from ``fedsim``, a ``Class.attribute``, or an identifier that is a class
(capitalised) or has an underscore. Words, scenario keys (``engine.name``), file names of a run directory
(``ledger.json``) and calls written with their arguments are the reader's, and are not looked up.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import keyword
import re
from functools import cache
from pathlib import Path

import pytest
from test_structure import PACKAGES, _module_graph, _modules, _package_graph, _unit

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

#: a repository path: under one of these folders (a glob such as ``scenarios/*.toml`` must match something)
_PATH = re.compile(r"(?:fedsim|strategies|scenarios|tests|docs|benchmarks)/[\w./*-]*")
_DOTTED = re.compile(r"fedsim(?:\.[A-Za-z_]\w*)+")
_CLASS_ATTRIBUTE = re.compile(r"([A-Z]\w*)\.([A-Za-z_]\w*)")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
#: a call written with its arguments, ``RoundLoop.step(t)``: the name before the parenthesis is checked
_CALL = re.compile(r"([\w.]+)\(.*\)")


def _spans() -> list[str]:
    """Every inline code span of the document, without a call's arguments (``f(x, y)`` -> ``f``)."""
    spans = re.findall(r"`([^`\n]+)`", DOC.read_text())
    return [m.group(1) if (m := _CALL.fullmatch(s)) else s for s in spans]


def _sources() -> list[Path]:
    """The files whose definitions the document may name: the three packages, the seam plug-ins the tests
    register (``CauchyRound``) and the structure tests it cites by name."""
    tests = [ROOT / "tests" / name for name in ("seam_plugins.py", "noise_plugin.py", "test_structure.py")]
    return [p for folder in PACKAGES.values() for p in folder.rglob("*.py")] + tests


def _assigned(body: list[ast.stmt]) -> set[str]:
    """The names a module's or a class's own body assigns (``X = ...``, ``x: int = ...``, a dataclass field), not
    a function's locals."""
    out = set()
    for stmt in body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


@cache
def _definitions() -> tuple[frozenset[str], dict[str, set[str]], dict[str, set[str]]]:
    """What the code defines, read from its syntax: every name (functions and classes, a module's or a class's
    assigned names, an attribute a method assigns on ``self``, an identifier-like string constant such as a key
    ``non_private`` or a scenario field), each class's own attributes and its base classes' names. A function's
    local variables are not definitions."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in _sources():
        tree = ast.parse(path.read_text())
        names.update(_assigned(tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
            elif isinstance(node, ast.ClassDef):
                own = members.setdefault(node.name, set()) | _assigned(node.body)
                own.update(n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
                own.update(
                    item.attr
                    for item in ast.walk(node)
                    if isinstance(item, ast.Attribute)
                    and isinstance(item.ctx, ast.Store)
                    and isinstance(item.value, ast.Name)
                    and item.value.id == "self"
                )
                members[node.name] = own
                names.update(own | {node.name})
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                )
    return frozenset(names), members, bases


def _has_member(cls: str, attribute: str) -> bool:
    """Whether a class of that name, or one of its bases defined in the same sources, defines ``attribute``."""
    _, members, bases = _definitions()
    seen: set[str] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c in seen or c not in members:
            continue
        seen.add(c)
        if attribute in members[c]:
            return True
        todo.extend(bases.get(c, ()))
    return False


def _resolve(dotted: str) -> object:
    """The object ``fedsim.x.y`` names, part by part: a package's submodule where it has one (imported), else an
    attribute (a dataclass or pydantic field without a default counts as an attribute of its class)."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        prefix = ".".join(parts[: i + 1])
        if hasattr(obj, "__path__"):  # a package: its submodule of that name, if any, wins over an attribute
            try:
                obj = importlib.import_module(prefix)
                continue
            except ModuleNotFoundError as exc:
                if exc.name != prefix:  # the module exists but an import inside it failed: an error here
                    raise
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif part in getattr(obj, "__dataclass_fields__", {}) or part in getattr(obj, "model_fields", {}):
            obj = None  # a field, declared without a default
        else:
            raise AttributeError(f"{'.'.join(parts[:i])} has no {part!r}")
    return obj


def test_every_path_the_document_names_exists():
    paths = [s for s in _spans() if _PATH.fullmatch(s)]
    assert len(paths) > 20, "the document names the files it describes; the reader found almost none"
    missing = [p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert not missing, f"docs/architecture.md names files that do not exist: {sorted(set(missing))}"


def test_every_dotted_fedsim_name_resolves():
    dotted = sorted({s for s in _spans() if _DOTTED.fullmatch(s)})
    assert len(dotted) > 20
    wrong = {}
    for name in dotted:
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            wrong[name] = f"{type(exc).__name__}: {exc}"
    assert not wrong, f"docs/architecture.md names what the code does not define: {wrong}"


def _undefined(span: str) -> bool:
    """Whether a span that reads as a name (``Class.attribute``, a capitalised identifier, one with an underscore)
    names nothing the code defines; any other span is not looked up."""
    if m := _CLASS_ATTRIBUTE.fullmatch(span):
        return not _has_member(*m.groups())
    if not _IDENTIFIER.fullmatch(span) or not (span[0].isupper() or "_" in span.strip("_")):
        return False
    return span not in _definitions()[0] and not keyword.iskeyword(span) and not hasattr(builtins, span)


def test_every_class_attribute_and_identifier_is_defined():
    wrong = sorted({s for s in _spans() if _undefined(s)})
    assert not wrong, f"docs/architecture.md names what the code does not define: {wrong}"


def test_the_checks_find_what_is_wrong():
    """The readers above are not vacuous: a renamed method, a missing module attribute and an undefined class are
    each caught."""
    assert _has_member("DPFedAvg", "begin_round")
    assert _has_member("DPAgnosticFedAvg", "finish_round")  # inherited from DPFedAvg
    assert not _has_member("DPFedAvg", "begin") and not _has_member("NoSuchClass", "x")
    assert _resolve("fedsim.round.noise.NoiseSource.dp_release")
    assert _resolve("fedsim.round.mechanism_options.check_mechanism_options")  # the module, not the function
    with pytest.raises(AttributeError):
        _resolve("fedsim.round.noise.no_such_function")
    assert not _undefined("PrivacySettings") and not _undefined("RoundPlan.noise_share_std")
    assert _undefined("NoSuchClass") and _undefined("no_such_function") and _undefined("DPFedAvg.begin")
    assert _undefined("RoundLoop.evaluated")  # a local variable of RoundLoop.step is no attribute
    assert not _undefined("None") and not _undefined("engine.name") and not _undefined("per-layer")
    assert _CALL.fullmatch("RoundLoop.step(t)").group(1) == "RoundLoop.step"


def _layer_table() -> dict[str, int]:
    """The layer table of section 1: each package (its backticked names in the second column) -> its row."""
    text = DOC.read_text()
    section = text[text.index("\n## 1. Layers") : text.index("\n## 2. ")]
    rows: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            for package in re.findall(r"`([\w.]+)`", cells[1]):
                assert package not in rows, f"{package} is in two rows of the layer table"
                rows[package] = int(cells[0])
    assert rows, "docs/architecture.md has no layer table in section 1"
    return rows


def _import_edges() -> set[tuple[str, str]]:
    """Package -> package for every import: the package graph (``from fedsim.round import X`` is an edge to
    fedsim.round) and each module edge (``from fedsim import sweep`` is an edge to fedsim.sweep)."""
    edges = {(src, dst) for src, dsts in _package_graph().items() for dst in dsts}
    for src, dsts in _module_graph().items():
        edges.update(
            (_unit(src), _unit(dst)) for dst in dsts if _unit(src) != _unit(dst) and _unit(dst) != "fedsim"
        )
    return edges


def test_the_layer_table_names_every_package_once():
    rows = _layer_table()
    units = {_unit(m) for m in _modules()}
    assert set(rows) == units, (
        f"docs/architecture.md's layer table and the code differ: missing from the table "
        f"{sorted(units - set(rows))}, in the table but not in the code {sorted(set(rows) - units)}"
    )


def test_imports_point_to_lower_rows_of_the_layer_table():
    rows = _layer_table()
    edges = _import_edges()
    # both kinds of import are seen: a name through a package's facade, a module imported by name from its package
    assert ("fedsim.loop", "fedsim.round") in edges and ("fedsim.cli", "fedsim.sweep") in edges
    up = sorted(
        f"{src} (row {rows[src]}) imports {dst} (row {rows[dst]})"
        for src, dst in edges
        if src in rows and dst in rows and rows[dst] >= rows[src]
    )
    assert not up, (
        "imports that do not point to a lower row of the layer table in docs/architecture.md (move the code, or "
        "the row if the layering really changed):\n" + "\n".join(up)
    )


def test_nothing_cites_the_old_design_document():
    """``shared/DESIGN.md`` lived outside the repository and went stale; docs/architecture.md replaces it."""
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    files = [p for folder in PACKAGES.values() for p in folder.rglob("*.py")] + [ROOT / "README.md", *pages]
    citing = [str(p.relative_to(ROOT)) for p in files if "DESIGN.md" in p.read_text()]
    assert not citing, f"these still cite DESIGN.md; cite docs/architecture.md instead: {citing}"
