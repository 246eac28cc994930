"""Registered names are switched on only where they are implemented (docs/how-to/extending.md: "nothing else in fedsim
switches on these names").

A registry (accountants, engines, noise placements, noise mechanisms) is a seam only if a name registered from
outside is treated like a shipped one. Code elsewhere that compares a name (``method == "rdp"``,
``engine.name == "flower"``, ``m in ("pld", "rdp")``) or dispatches on a literal keyed by names
(``{"pld": ..., "rdp": ...}[m]``, a ``match`` case) gives the shipped entries a behaviour a registered one cannot
have; it must ask the entry's attributes instead (``Accountant.falls_back_to``, ``EngineEntry.supports_canaries``).

Every module of fedsim, fedsim.strategies and fedsim.scenarios is parsed (not imported) and searched for such a
comparison with a name fedsim registers itself, read from the registry when the test runs. The modules that
implement a registry may name its entries: the module that holds the registry and the modules the registered entries
are made of (an accountant's curve and ledger composition, an engine's target, a mechanism's class), found from the
entries themselves. A name as a value (a default argument, a registration, a message, a docstring) is not a
comparison and is not looked at.

Engine names are also words other settings take (``vectorize = "auto"``, ``torch_threads = "auto"``, a tree's
``method = "auto"``), so an engine name counts only where the other side of the comparison reads as an engine name:
an expression ending in ``name`` or mentioning ``engine`` (``self.name``, ``scenario.engine.name``,
``engine["requested"]``). Accountant, placement and mechanism names are compared against anything.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from test_structure import ROOT, _modules  # every module of the three packages, by its import name


def _module_of(obj) -> str | None:
    """The module an entry's part is defined in: a ``"module:attribute"`` reference's module, else the object's."""
    if isinstance(obj, str):
        module, sep, _ = obj.partition(":")
        return module if sep else None
    module = inspect.getmodule(obj)
    return module.__name__ if module else None


@dataclass(frozen=True)
class Registry:
    """A registry's shipped names and the modules allowed to switch on them (the registry's own and those its
    entries are made of), read when the test runs; ``engine_like``: only count comparisons whose other side reads
    as an engine name (see the module docstring)."""

    names: frozenset[str]
    implemented_in: frozenset[str]
    engine_like: bool = False


def _shipped(home: str, parts: dict[str, list]) -> Registry:
    """``parts``: name -> the objects (or references) the entry is made of. Only fedsim's own entries count (a test
    may have registered others in this process)."""
    names, modules = set(), {home}
    for name, objs in parts.items():
        found = {m for m in map(_module_of, objs) if m}
        if found and all(m == "fedsim" or m.startswith("fedsim.") for m in found):
            names.add(name)
            modules |= found
    return Registry(frozenset(names), frozenset(modules))


def _accountants() -> Registry:
    from fedsim.privacy import accountants

    fields = ("curve", "of_ledger", "ledger_accountant", "dp_accountant")
    return _shipped(
        accountants.__name__,
        {
            n: [getattr(a, f) for f in fields if getattr(a, f, None) is not None]
            for n, a in accountants.ACCOUNTANTS.items()
        },
    )


def _engines() -> Registry:
    from fedsim import registry

    shipped = _shipped(registry.__name__, {n: [e.target] for n, e in registry.ENGINES.items()})
    return Registry(shipped.names, shipped.implemented_in, engine_like=True)


def _placements() -> Registry:
    from fedsim.round import NOISE_PLACEMENTS, noise

    return Registry(frozenset(NOISE_PLACEMENTS), frozenset({noise.__name__}))


def _mechanisms() -> Registry:
    from fedsim.round import NOISE_SOURCES, noise

    return _shipped(noise.__name__, {n: [cls] for n, cls in NOISE_SOURCES.items()})


# ------------------------------------------------------------------------------------------------ the search
def _identifiers(node: ast.AST) -> list[str]:
    """The names along an expression's chain, outermost last: ``scenario.engine.name`` -> scenario, engine, name;
    ``engine["requested"]`` -> engine, requested; ``e.get("name")`` -> e, get, name."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [*_identifiers(node.value), node.attr]
    if isinstance(node, ast.Subscript):
        key = node.slice
        tail = [key.value] if isinstance(key, ast.Constant) and isinstance(key.value, str) else []
        return [*_identifiers(node.value), *tail]
    if isinstance(node, ast.Call):
        args = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        return [*_identifiers(node.func), *args]
    return []


def _reads_as_engine_name(node: ast.AST) -> bool:
    ids = _identifiers(node)
    return bool(ids) and (ids[-1] in ("name", "engine_name") or any("engine" in i.lower() for i in ids))


def _strings(node: ast.AST) -> list[str]:
    """The string constants a comparison operand stands for: itself, or a tuple/list/set literal's elements, or
    a dict literal's keys (``x in {...}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def _switches(tree: ast.AST) -> Iterator[tuple[ast.AST, list[str], ast.AST | None]]:
    """``(node, names, other side)`` for every place the code switches on string constants: the operands of ==,
    !=, in and not in, a dict literal indexed or ``.get`` at once, a ``match`` case's value."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for one, other in ((left, right), (right, left)):
                    if _strings(one):
                        yield node, _strings(one), other
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            yield node, _strings(node.value), node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Dict)
        ):
            yield node, _strings(node.func.value), node.args[0] if node.args else None
        elif isinstance(node, ast.Match):
            for case in node.cases:
                for pattern in ast.walk(case.pattern):
                    if isinstance(pattern, ast.MatchValue):
                        yield pattern, _strings(pattern.value), node.subject


def switches_on(source: str, registry: Registry) -> list[tuple[int, str]]:
    """``(line, code)`` of every comparison in ``source`` that switches on one of the registry's names."""
    tree = ast.parse(source)
    found = []
    for node, strings, other in _switches(tree):
        if not set(strings) & registry.names:
            continue
        if registry.engine_like and not (other is not None and _reads_as_engine_name(other)):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def _sites(registry: Registry) -> list[str]:
    sites = []
    for module, path in sorted(_modules().items()):
        if module in registry.implemented_in:
            continue
        for line, code in switches_on(path.read_text(), registry):
            sites.append(f"{path.relative_to(ROOT)}:{line}: {code}")
    return sites


REGISTRIES: dict[str, Callable[[], Registry]] = {
    "accountant": _accountants,
    "engine": _engines,
    "placement": _placements,
    "mechanism": _mechanisms,
}


@pytest.mark.parametrize("kind", ["accountant", "engine", "placement", "mechanism"])
def test_registered_names_are_switched_on_only_where_implemented(kind):
    registry = REGISTRIES[kind]()
    assert registry.names, f"no {kind} names found in the registry"
    sites = _sites(registry)
    assert not sites, (
        f"{kind} names compared outside the modules that implement them ({', '.join(sorted(registry.implemented_in))})"
        f"; ask the registry entry's attributes instead:\n" + "\n".join(sites)
    )


def test_the_search_finds_each_way_of_switching_and_spares_other_settings():
    """The search itself: each form of switching on a name is found, and a word an engine shares with another
    setting is not taken for an engine name."""
    accountants = Registry(frozenset({"pld", "rdp"}), frozenset())
    engines = Registry(frozenset({"auto", "local", "flower"}), frozenset(), engine_like=True)
    code = """
if method == "rdp": pass
if "pld" != own: pass
certified = [m for m in methods if m in ("pld", "rdp")]
cls = {"pld": A, "rdp": B}[method]
other = {"pld": "rdp"}.get(method)
match method:
    case "pld": pass
if scenario.engine.name == "flower": pass
if self.name == "local": pass
if summary["engine"]["requested"] == "auto": pass
if vectorize == "auto" or requested in ("auto", "per-layer") or value == "auto": pass
"""
    lines = [line for line, _ in switches_on(code, accountants)]
    assert lines == [2, 3, 4, 5, 6, 8], lines
    lines = [line for line, _ in switches_on(code, engines)]
    assert lines == [9, 10, 11], lines
    values = (
        'def f(method="pld"):\n    register("rdp", x)\n    return ["pld"], {"rdp": 1}, "pld is certified"'
    )
    assert switches_on(values, accountants) == []


def test_the_implementing_modules_come_from_the_entries():
    assert {"fedsim.privacy.accountants", "fedsim.privacy.certified"} <= _accountants().implemented_in
    engines = _engines()
    assert {
        "fedsim.registry",
        "fedsim.engine.local_engine",
        "fedsim.engine.flower_engine",
    } <= engines.implemented_in
    assert {"local", "ray", "flower", "auto"} <= engines.names


# ------------------------------------------------------------------------- what callers ask instead of a name
@pytest.fixture
def registered_copies():
    """Register copies of shipped accountants under other names (``copy(name, of, **changes)``); removed after."""
    import dataclasses

    from fedsim.privacy.accountants import ACCOUNTANTS, register_accountant

    added = []

    def copy(name: str, of: str, **changes):
        added.append(name)
        return register_accountant(dataclasses.replace(ACCOUNTANTS[of], name=name, **changes))

    yield copy
    for name in added:
        ACCOUNTANTS.pop(name, None)


def test_an_accountant_is_treated_by_what_its_entry_declares(registered_copies):
    """A certified accountant registered under another name gets what the shipped one it copies gets: a schedule is
    accounted by it (its dp-accounting factory), the display picks it by kind and rank, and a PLD that would not
    fit in memory falls back for it as for ``pld``."""
    from fedsim.privacy import Ledger, PrivacyInputError, ScheduleAccounting
    from fedsim.privacy.accountants import DEFAULT_ACCOUNTANT, counterpart, tightest
    from fedsim.privacy.certified import quiet_absl
    from fedsim.privacy.mechanism import Mechanism
    from fedsim.privacy.schedule import schedule_epsilon, schedule_methods
    from fedsim.round import make_noise_source

    assert counterpart(DEFAULT_ACCOUNTANT) != DEFAULT_ACCOUNTANT
    assert counterpart(counterpart(DEFAULT_ACCOUNTANT)) == DEFAULT_ACCOUNTANT
    assert tightest(["basic", "igmm-corrected", "kairouz", "igmm"]) == "kairouz"
    assert tightest(["igmm", "dp-fl-thm8", "not registered"]) is None

    registered_copies("rdp-again", "rdp", rank=-1)
    registered_copies("pld-again", "pld")
    assert {"rdp-again", "pld-again"} <= set(schedule_methods())
    accounting = ScheduleAccounting(make_noise_source("tree", 0), "cyclic", 16, None)
    with quiet_absl():
        assert schedule_epsilon(accounting, 32, 2.0, 1e-6, "rdp-again") == schedule_epsilon(
            accounting, 32, 2.0, 1e-6, "rdp"
        )
    with pytest.raises(PrivacyInputError, match="to account a schedule"):
        schedule_epsilon(accounting, 32, 2.0, 1e-6, "kairouz")
    assert tightest(["pld", "rdp", "rdp-again"]) == "rdp-again"
    assert counterpart("rdp-again") == DEFAULT_ACCOUNTANT

    tiny = Mechanism(population=1000, sampling="all", noise_multiplier=0.005)  # ~4e7 PLD points a round
    ledger = Ledger()
    for t in range(1, 4):
        ledger.record(round=t, mechanism=tiny)
    with pytest.warns(RuntimeWarning, match="RDP"):
        eps = ledger.epsilon(1e-5, "pld-again")
    used, why = ledger.fell_back("pld-again")
    assert used == "rdp" and "noise multiplier 0.005" in why and eps == ledger.epsilon(1e-5, "rdp")
    assert ledger.fell_back("rdp") is None


def test_a_fallback_must_be_an_accountant_of_the_same_kind_that_always_answers(registered_copies):
    with pytest.raises(ValueError, match="falls_back_to='kairouz'"):
        registered_copies("pld-to-a-closed-form", "pld", falls_back_to="kairouz")
    with pytest.raises(ValueError, match="falls_back_to='pld'"):
        registered_copies("rdp-to-pld", "rdp", falls_back_to="pld")


def test_what_a_scenario_asks_of_an_engine_is_declared_by_its_entry():
    """The schema refuses a round timeout, or canaries, on an engine registered as unable to honour them, by what
    it declares rather than by its name."""
    from fedsim.registry import ENGINES, engine_entry, register_engine
    from fedsim.scenarios import ScenarioError, load_scenario

    assert not engine_entry("local").supports_round_timeout and not engine_entry("flower").supports_canaries
    assert all(
        engine_entry(n).supports_round_timeout and engine_entry(n).supports_canaries for n in ("ray", "auto")
    )
    name = "in-process-toy"
    register_engine(name, "tests_nowhere:Engine", supports_round_timeout=False, supports_canaries=False)
    try:
        with pytest.raises(ScenarioError, match="round_timeout_s needs"):
            load_scenario("quickstart", [f"engine.name={name}", "engine.round_timeout_s=5"])
        with pytest.raises(ScenarioError, match=f"not supported with engine.name='{name}'"):
            load_scenario("quickstart", [f"engine.name={name}", "privacy.canaries=10"])
        load_scenario("quickstart", [f"engine.name={name}"])  # what it can do is allowed
    finally:
        ENGINES.pop(name)
