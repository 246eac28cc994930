"""The Python API: run a scenario and load the model it trained.

``fedsim.run(scenario, out)`` is ``fedsim run`` without the console: it runs a :class:`~fedsim.scenarios.Scenario`
(an object, a shipped scenario's name or a ``.toml`` path, with ``--set``-style ``overrides``), writes the run
directory and returns the :class:`~fedsim.RunResult`. ``fedsim.load_model(run_dir)`` rebuilds the run's
model from its ``config.toml`` and loads the final weights into it.

Everything heavy (torch, Ray, Flower) is imported when a function is called, so ``import fedsim`` stays instant.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from fedsim.loop import Engine, RunResult
    from fedsim.scenarios import Scenario


def run(
    scenario: Scenario | str | Path,
    out: str | Path | None = None,
    *,
    overrides: list[str] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    write: bool = True,
    runs_root: str | Path = "runs",
    engine: Engine | None = None,
) -> RunResult:
    """Run ``scenario`` end to end, as ``fedsim run`` does, and return its result.

    ``scenario``: a :class:`~fedsim.scenarios.Scenario` (e.g. from :func:`fedsim.load_scenario`, whose model,
    loss and data may be callables defined at module level in an importable module), the name of a shipped
    scenario (``fedsim scenarios`` lists them) or the path of a ``.toml`` file.
    ``out``: the run directory (it must not hold a run); default: a fresh ``<runs_root>/<time>-<name>``.
    ``overrides``: values to change, as ``fedsim run --set`` takes them (``["rounds=5", "engine.name=local"]``).
    ``on_row``: called with each round's row as it is written. ``write=False``: write no run directory.
    ``engine``: an engine object to reuse (it is not closed); default: the scenario's ``engine.name``.

    Returns a :class:`fedsim.RunResult`: ``run_dir``, the ``rows`` (one per round, as in ``metrics.jsonl``), the
    final ``weights``, the ``strategy`` after the last round (its ``ledger``), why the run stopped early if it did
    (``stopped_by``, ``stopped_reason``, ``stopped_detail``), ``timings`` and ``warnings``: what the run's settings
    do that they do not say (:func:`fedsim.run_checks.run_warnings`: a cyclic schedule that leaves clients out,
    delta >= 1/N, canaries swamping the cohort, noise dwarfing the signal), which are also logged as warnings
    (logger ``fedsim.run_checks``) before the first round.

    Raises :class:`fedsim.scenarios.ScenarioError` for a scenario that does not load or validate and
    ``ValueError`` for one that cannot run (both before anything is written).
    """
    from fedsim.engine.runner import run_scenario

    return run_scenario(
        _scenario(scenario, overrides), out, write=write, on_row=on_row, runs_root=runs_root, engine=engine
    )


def load_model(run_dir: str | Path) -> nn.Module:
    """The final model of the run in ``run_dir`` as a ``torch.nn.Module`` in eval mode, on the CPU.

    The module is built from the run's ``config.toml`` as the run built it (the model factory with its options,
    for the data's input shape and number of classes, which ``data.json`` gives; without it the data is built),
    and ``model.pt`` (a ``state_dict``) is loaded into it with ``strict=True``; a run without ``model.pt`` (written
    before fedsim wrote it) falls back to ``model.npz``. A model factory named by reference must be importable.
    """
    import numpy as np
    import torch

    from fedsim.report.rundir import MODEL_NPZ, MODEL_PT, build_module, model_shape
    from fedsim.scenarios import load_scenario
    from fedsim.training.trainer import TrainSettings, make_model

    path = Path(run_dir)
    config = path / "config.toml"
    if not config.is_file():
        raise FileNotFoundError(f"{path} is not a run directory (no config.toml)")
    pt, npz = path / MODEL_PT, path / MODEL_NPZ
    if not pt.is_file() and not npz.is_file():
        raise FileNotFoundError(
            f"{path} holds no model ({MODEL_PT} or {MODEL_NPZ}): they are written when the run ends"
        )
    scenario = load_scenario(str(config))
    shape = model_shape(path)
    if shape is None:  # data.json missing or without the shape (a deployment writes it only with diagnostics)
        from fedsim.experiment import build_data

        data = build_data(scenario)
        shape = tuple(data.input_shape), int(data.num_classes)
    settings = TrainSettings.from_scenario(scenario)

    def factory() -> nn.Module:  # as every trainer builds it (and the runner, for model.pt)
        return make_model(settings, tuple(shape[0]), int(shape[1]))

    if pt.is_file():
        module = build_module(factory)
        module.load_state_dict(torch.load(pt, map_location="cpu", weights_only=True), strict=True)
    else:
        with np.load(npz, allow_pickle=False) as z:
            module = build_module(factory, z["weights"])
    return module.eval()


def _scenario(scenario: Any, overrides: list[str] | None) -> Scenario:
    """``scenario`` as a validated :class:`Scenario` with ``overrides`` applied (a new object: the one given is
    left as it is)."""
    from fedsim.scenarios import Scenario, ScenarioError, load_scenario

    if isinstance(scenario, str | Path):
        return load_scenario(str(scenario), list(overrides or []))
    if not isinstance(scenario, Scenario):
        raise TypeError(
            f"scenario must be a fedsim.Scenario, a shipped scenario's name or a .toml path, not "
            f"{type(scenario).__name__}"
        )
    if not overrides:
        return scenario
    from pydantic import ValidationError

    from fedsim.scenarios.loader import apply_override, format_validation_error

    data = _fields(scenario)
    for item in overrides:
        apply_override(data, item)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, repr(scenario.name))) from None


def _fields(model: Any) -> Any:
    """A pydantic model's values as nested dicts, callables kept as they are (``model_dump`` would write them as
    references, and refuses one defined in ``__main__``, which the runner then refuses with its own message)."""
    from pydantic import BaseModel

    if not isinstance(model, BaseModel):
        return model
    out = {k: _fields(getattr(model, k)) for k in type(model).model_fields}
    out.update({k: _fields(v) for k, v in (model.model_extra or {}).items()})
    return out
