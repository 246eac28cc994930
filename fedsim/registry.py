"""The engine registry: ``engine.name`` -> what trains a scenario's cohorts.

The scenario schema (:mod:`fedsim.scenarios`) reads it to validate ``engine.name`` (:func:`check_engine_name`),
and :func:`fedsim.engine.runner.run_scenario` starts the engine it names. The schema sits below the engines, so
this module imports none of them: an entry names its target as ``"package.module:attribute"``, imported only when
the engine is resolved (importing this module imports neither Ray nor Flower).

Two kinds of engine are registered:

* an engine the round loop drives (``drives_loop=False``): the target is a factory
  ``start(scenario, data, settings) -> Engine`` (:class:`fedsim.loop.Engine`), or an object (a class) whose
  ``start`` attribute is one; :func:`fedsim.loop.run_rounds` then calls its ``train``, ``evaluate`` and ``close``;
* an engine that drives the round loop itself (``drives_loop=True``), inside a host such as Flower's ServerApp:
  the target has ``run_scenario(scenario, *, on_row, writer) -> RunResult``, which builds the experiment, runs
  every round through :func:`fedsim.loop.run_rounds` and writes the rows through ``writer``. Such a run cannot be
  given an engine object nor be resumed from a checkpoint.

A new engine is one module plus ``register_engine("name", "package.module:Factory", "what it is")`` (or the
factory itself), called before the scenario is loaded.

Code outside the engines never compares engine names (``tests/test_registry_names.py`` checks it): what the schema
and the runner need to know about an engine is a field of its entry (``drives_loop``, ``supports_round_timeout``,
``supports_canaries``), declared when it is registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedsim.labels import see_docs


@dataclass(frozen=True)
class EngineEntry:
    """One registered engine: its ``engine.name``, its ``target`` (a ``"module:attribute"`` reference, resolved on
    first use, or the object itself), a one-line ``description``, whether it ``drives_loop`` (see the module
    docstring), and what a scenario may ask of it, which the schema checks before anything is imported:

    * ``supports_round_timeout``: whether it can honour ``engine.round_timeout_s``, i.e. stop waiting for a client
      that hangs (only a client trained in another process can be given up on; an engine that trains in the
      caller's process cannot);
    * ``supports_canaries``: whether ``privacy.canaries`` can be inserted into its rounds (the round loop adds the
      canaries' updates to what the engine returns; an engine whose clients are nodes outside fedsim, such as
      Flower's, aggregates without them)."""

    name: str
    target: str | Callable[..., Any] | Any
    description: str = ""
    drives_loop: bool = False
    supports_round_timeout: bool = True
    supports_canaries: bool = True

    def resolve(self) -> Any:
        """The target object (imported now when it is a reference)."""
        if not isinstance(self.target, str):
            return self.target
        module, sep, attr = self.target.partition(":")
        if not sep or not module or not attr:
            raise ValueError(
                f"engine {self.name!r}: target {self.target!r} is not a 'package.module:attribute' reference"
            )
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj


#: ``engine.name`` -> its entry, in registration order (the shipped engines first)
ENGINES: dict[str, EngineEntry] = {}


def register_engine(
    name: str,
    target: str | Callable[..., Any] | Any,
    description: str = "",
    *,
    drives_loop: bool = False,
    supports_round_timeout: bool = True,
    supports_canaries: bool | None = None,
    replace: bool = False,
) -> EngineEntry:
    """Register an engine under ``name`` (what a scenario's ``engine.name`` then accepts); returns its entry.

    ``target``: ``"package.module:attribute"`` (imported when the engine is first used) or the object itself:
    a factory ``start(scenario, data, settings) -> Engine``, or an object whose ``start`` is one; with
    ``drives_loop=True``, an object with ``run_scenario(scenario, *, on_row, writer) -> RunResult``.
    ``supports_round_timeout`` and ``supports_canaries`` (default: unless it drives its own loop, which fedsim's
    round loop, where canaries are inserted, then does not run): what the engine can do (:class:`EngineEntry`); a scenario
    asking an engine for what it declares it cannot do is refused when it is validated.
    A name registered already is a ``ValueError`` unless ``replace=True``."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(
            f"an engine name must be a non-empty string without surrounding spaces, got {name!r}"
        )
    if isinstance(target, str) and ":" not in target:
        raise ValueError(f"engine {name!r}: target {target!r} is not a 'package.module:attribute' reference")
    if name in ENGINES and not replace:
        raise ValueError(
            f"engine {name!r} is registered already (registered: {_listed()}); "
            "pass replace=True to register it again"
        )
    # canaries are inserted by fedsim's round loop: an engine that drives its own loop does not run them unless it says so
    canaries = not drives_loop if supports_canaries is None else bool(supports_canaries)
    entry = EngineEntry(name, target, description, drives_loop, supports_round_timeout, canaries)
    ENGINES[name] = entry
    return entry


def engine_names() -> tuple[str, ...]:
    """The registered engine names, in registration order: what ``engine.name`` accepts."""
    return tuple(ENGINES)


def check_engine_name(name: Any) -> str:
    """``name`` if it is a registered engine, else a ``ValueError`` that lists the registered ones (the schema's
    check of ``engine.name``)."""
    if isinstance(name, str) and name in ENGINES:
        return name
    raise ValueError(
        f"engine.name={name!r} is not a registered engine; registered: {_listed()} "
        f"(fedsim.registry.register_engine adds one; {see_docs('engine')})"
    )


def engine_entry(name: str) -> EngineEntry:
    """The entry of engine ``name`` (a ``ValueError`` listing the registered ones if there is none)."""
    return ENGINES[check_engine_name(name)]


def resolve_engine(name: str) -> Any:
    """The target of engine ``name``, imported: its factory (or factory holder), or with ``drives_loop`` the object
    whose ``run_scenario`` runs a scenario."""
    return engine_entry(name).resolve()


def _listed() -> str:
    return ", ".join(map(repr, ENGINES))


register_engine(
    "ray",
    "fedsim.engine.ray_engine:RayEngine",
    "a pool of Ray actors, on this machine or on the Ray cluster at engine.ray_address",
)
register_engine(
    "local",
    "fedsim.engine.local_engine:LocalEngine",
    "every client in this process, one at a time",
    supports_round_timeout=False,
)
register_engine(
    "flower",
    "fedsim.engine.flower_engine:FlowerEngine",
    "Flower's Simulation Engine: the round loop runs inside Flower's ServerApp, one virtual SuperNode per client",
    drives_loop=True,
    supports_canaries=False,
)
register_engine(
    "auto",
    "fedsim.engine.auto:AutoEngine",
    "'local' or 'ray', picked by the run's needs, the machine's CPUs and a round's size (the default)",
)
