"""The architecture, checked: packages import downward only, the schema's choices come from the registries, and
the same bad value gets the same message from a scenario and from the library."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "fedsim": ROOT / "fedsim",
    "fedsim.strategies": ROOT / "strategies",
    "fedsim.scenarios": ROOT / "scenarios",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            name = ".".join((pkg, *rel)).removesuffix(".__init__")
            mods[name] = path
    return mods


def _unit(module: str) -> str:
    """The package a module belongs to: ``fedsim.X`` (top-level modules such as fedsim.loop are their own unit)."""
    return ".".join(module.split(".")[:2])


def _imports(name: str, path: Path, *, names: bool = False) -> set[str]:
    """The fedsim modules and packages ``name`` imports; with ``names``, also ``pkg.name`` for every
    ``from pkg import name`` (which is a module where ``name`` is one: :func:`_module_graph` keeps those)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    parts = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):  # every import, also inside functions and TYPE_CHECKING blocks
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            if names:
                out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m == "fedsim" or m.startswith("fedsim.")}


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in _modules().items():
        src = _unit(name)
        for target in _imports(name, path):
            dst = _unit(target)
            if dst != src and dst != "fedsim":
                graph.setdefault(src, set()).add(dst)
    return graph


def test_packages_import_each_other_in_no_circle():
    graph = _package_graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend([*stack[stack.index(nxt) :], node, nxt] if nxt in stack else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, [*stack, node]):
                return True
        state[node] = 2
        return False

    for n in sorted(graph):
        if state.get(n) is None and visit(n, []):
            break
    assert not cycle, f"import circle between packages: {' -> '.join(cycle)}"


def test_the_layers_point_down():
    graph = _package_graph()
    low = {
        "fedsim.validation",
        "fedsim.round",
        "fedsim.secagg",
        "fedsim.privacy",
        "fedsim.data",
        "fedsim.models",
        "fedsim.training",
    }
    for pkg in low:
        up = graph.get(pkg, set()) & {
            "fedsim.loop",
            "fedsim.engine",
            "fedsim.apps",
            "fedsim.cli",
            "fedsim.experiment",
            "fedsim.strategies",
        }
        assert not up, f"{pkg} imports the layers above it: {sorted(up)}"
    assert "fedsim.strategies" not in graph.get("fedsim.flower", set())


def _module_graph() -> dict[str, set[str]]:
    """Each module -> the modules it imports, by any import statement (inside functions too: a lazy import hides a
    circle from the interpreter until the function runs, not from the design). An import is an edge to the module
    it names, ``from pkg import name`` to ``pkg.name`` where that is a module, else to the longest enclosing one.
    A package's ``__init__`` is a facade that re-exports its modules: importing through it is no edge (as in
    ``shared/tools/import_cycles.py``), or every module that reads a name from its own package would close a
    circle with the facade that imports it."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = graph.setdefault(name, set())
        for imported in _imports(name, path, names=True):
            while imported not in mods and "." in imported:
                imported = imported.rpartition(".")[0]
            if imported in mods and imported != name and mods[imported].name != "__init__.py":
                targets.add(imported)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per back edge of a depth-first walk (``a -> b -> a``), each found once; none: the graph is a
    DAG."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    found: dict[frozenset[str], list[str]] = {}

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circle = [*path[path.index(nxt) :], nxt]
                found.setdefault(frozenset(circle), circle)
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return list(found.values())


def test_modules_import_each_other_in_no_circle():
    """No two modules of fedsim, fedsim.strategies or fedsim.scenarios import each other, directly or through
    others: a piece that two modules share lives below both (a label in fedsim.labels, the interface a dataset
    implements in fedsim.data.population, the rule registry in fedsim.training.layer_registry)."""
    graph = _module_graph()
    # the graph sees what the interpreter sees late: an import inside a function (rundir draws the plots), and a
    # module imported by name from its package
    assert "fedsim.report.plots" in graph["fedsim.report.rundir"]
    assert "fedsim.data.synthetic" in graph["fedsim.data.federated"]
    circles = _cycles(graph)
    assert not circles, "import circles between modules:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_a_cycle_is_found_and_named():
    """The walk the test above relies on names a circle through three modules and one between two, each once."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: what runs in a deployment without the report package (matplotlib, the run directory, trackers): the
#: strategies (on the ServerApp, and in any program that uses them as a library), the deployed ClientApp and the
#: scenario schema (validating a scenario must not import what reports a run)
_BELOW_THE_REPORT = ("fedsim.strategies", "fedsim.apps.client_app", "fedsim.scenarios.schema")


def test_strategies_client_app_and_schema_do_not_import_the_report():
    modules = {
        name: path
        for name, path in _modules().items()
        if any(name == low or name.startswith(low + ".") for low in _BELOW_THE_REPORT)
    }
    assert set(_BELOW_THE_REPORT) <= set(modules), sorted(modules)  # each still exists where this test looks
    wrong = {
        name: sorted(
            m
            for m in _imports(name, path, names=True)
            if m == "fedsim.report" or m.startswith("fedsim.report.")
        )
        for name, path in modules.items()
    }
    wrong = {name: found for name, found in wrong.items() if found}
    assert not wrong, (
        "these import the report package; the labels are in fedsim.labels, client_means in "
        f"fedsim.training.evaluation, check_tracking_uri in fedsim.tracking_uri: {wrong}"
    )


def _choices(model, field: str | None) -> tuple:
    annotation = model if field is None else model.model_fields[field].annotation
    args = typing.get_args(annotation)
    if len(args) == 2 and type(None) in args:  # Optional[Literal[...]]
        args = typing.get_args(next(a for a in args if a is not type(None)))
    return args


def test_schema_choices_are_the_registries():
    from fedsim.data import DATASETS, PARTITIONERS
    from fedsim.models import MODELS
    from fedsim.privacy import ACCOUNTANTS
    from fedsim.registry import ENGINES
    from fedsim.round import NOISE_PLACEMENTS, NOISE_SOURCES, RANDOMNESS, SAMPLERS
    from fedsim.round.noise import default_placement
    from fedsim.scenarios import schema
    from fedsim.strategies import SERVER_OPTIMIZERS
    from fedsim.training.vectorized import VECTORIZE

    for name in DATASETS:  # a free-form field (it also takes hf: and data functions): its message lists them
        schema.DataConfig(dataset=name)
    with pytest.raises(ValueError, match=", ".join(map(repr, DATASETS))):
        schema.DataConfig(dataset="nope")
    assert _choices(schema.DataConfig, "partitioner") == PARTITIONERS
    assert _choices(schema.ModelConfig, "name") == MODELS
    assert (
        _choices(typing.get_args(schema.EngineConfig.model_fields["vectorize"].annotation)[0], None)
        == VECTORIZE
    )
    assert _choices(schema.PrivacyConfig, "noise_placement") == NOISE_PLACEMENTS
    assert _choices(schema.PrivacyConfig, "randomness") == RANDOMNESS
    assert _choices(schema.ServerConfig, "optimizer") == SERVER_OPTIMIZERS
    # registries that mechanisms written outside fedsim extend: read when a scenario is validated, so every name
    # registered then is accepted and anything else is refused with the registered names
    certified = sorted(n for n, a in ACCOUNTANTS.items() if a.kind == "certified")
    cohort = {"sampling_rate": 0.5}  # what poisson needs; "all" takes a rate of 1 only
    for section, field, names, extra in [
        (schema.PrivacyConfig, "sampling", list(SAMPLERS), {}),
        (schema.PrivacyConfig, "mechanism", list(NOISE_SOURCES), cohort),
        (schema.PrivacyConfig, "accountant", certified, cohort),
        (schema.EngineConfig, "name", list(ENGINES), {}),
    ]:
        for name in names:
            if field == "sampling":  # each scheme's own description of its cohort
                extra = {
                    "all": {},
                    "cyclic": {"min_separation": 2},
                    "min-separation": {"min_separation": 2, "sampling_rate": 0.5},
                }.get(name, {"clients_per_round": 1})
            if field == "mechanism":
                extra = dict(cohort)
            if field == "mechanism" and NOISE_SOURCES[name].correlated:  # needs a participation schedule
                extra = {"sampling": "cyclic", "min_separation": 2}
            if (
                field == "mechanism" and NOISE_SOURCES[name].accountants
            ):  # one it declares it can be accounted by
                extra = {**extra, "accountant": NOISE_SOURCES[name].accountants[0]}
            if field == "mechanism":  # clients that must add the noise: its placement
                extra = {**extra, "noise_placement": default_placement(NOISE_SOURCES[name])}
            value = section(**{field: name}, **extra)
            got = value.mechanism_name if field == "mechanism" else getattr(value, field)
            assert got == name
        with pytest.raises(ValueError, match=", ".join(names)):
            section(**{field: "nope"}, **(cohort if field == "mechanism" else extra))


@pytest.mark.parametrize(
    "overrides, api",
    [
        (
            ["privacy.sampling=poisson", "privacy.clients_per_round=5"],
            dict(sampling="poisson", sampling_rate=0.2, clients_per_round=5),
        ),
        (["privacy.sampling=all", "privacy.sampling_rate=0.5"], dict(sampling="all", sampling_rate=0.5)),
    ],
)
def test_a_bad_cohort_gets_the_same_message_from_a_scenario_and_the_library(overrides, api):
    from fedsim.privacy import Mechanism, PrivacyInputError
    from fedsim.scenarios import ScenarioError, load_scenario
    from fedsim.strategies import DPFedAvg

    with pytest.raises(ScenarioError) as scenario_error:
        load_scenario("quickstart", overrides)
    with pytest.raises(PrivacyInputError) as strategy_error:
        DPFedAvg(**api)
    with pytest.raises(PrivacyInputError) as mechanism_error:
        Mechanism(population=100, **api)
    assert str(strategy_error.value) == str(mechanism_error.value)
    assert str(strategy_error.value) in str(scenario_error.value)


def test_training_and_engines_know_no_model():
    """The user's model is the contract: nothing that trains imports the shipped models or names their classes."""
    for module, path in _modules().items():
        if _unit(module) in (
            "fedsim.training",
            "fedsim.engine",
            "fedsim.round",
            "fedsim.loop",
            "fedsim.apps",
        ):
            assert not any(m.startswith("fedsim.models") for m in _imports(module, path)), module
            text = path.read_text()
            for name in ("MLP", "CNN1D", "LogReg", "cnn2d", "models.registry"):
                assert name not in text, (module, name)
