"""The pieces the Flower ServerApp and ClientApp share: scenario from the run config, data, model keys.

Nothing here runs at import time (Ray workers and SuperNodes re-import the module).

Run config keys (``[tool.flwr.app.config]`` in pyproject.toml, or ``flwr run . --run-config``):
``scenario`` (a shipped name or a .toml path) and ``overrides`` (``"key=value key=value"``, the same
syntax as ``fedsim run --set``).

Node config (``flwr run`` simulation sets ``partition-id`` and ``num-partitions``; a deployed SuperNode is
started with ``--node-config "partition-id=3 num-partitions=90"``): ``partition-id`` selects which training
client of the scenario this node is.

``flwr.simulation.run_simulation`` hands the apps an *empty* run config. When the run config has no
``scenario``, the environment variables ``FEDSIM_SCENARIO`` and ``FEDSIM_OVERRIDES`` are used instead (Ray
workers inherit the driver's environment), then the defaults (``quickstart``, no overrides).
"""

from __future__ import annotations

import os
import shlex
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from fedsim.experiment import build_data
from fedsim.round import unflatten
from fedsim.scenarios import load_scenario
from fedsim.training.trainer import ClientTrainer, TrainSettings

ENV_SCENARIO = "FEDSIM_SCENARIO"
ENV_OVERRIDES = "FEDSIM_OVERRIDES"
DEFAULT_SCENARIO = "quickstart"


def scenario_source(run_config: dict[str, Any]) -> tuple[str, str]:
    """(scenario name or path, overrides string) from the run config, else from the environment."""
    if run_config.get("scenario"):
        return str(run_config["scenario"]), str(run_config.get("overrides", "") or "")
    name = os.environ.get(ENV_SCENARIO, "") or DEFAULT_SCENARIO
    overrides = str(run_config.get("overrides", "") or "") or os.environ.get(ENV_OVERRIDES, "")
    return name, overrides


def scenario_from_run_config(run_config: dict[str, Any]):
    name, overrides = scenario_source(run_config)
    return load_scenario(name, shlex.split(overrides))


@lru_cache(maxsize=4)
def _cached(name: str, overrides: str) -> tuple[Any, Any, Any]:
    scenario = scenario_from_run_config({"scenario": name, "overrides": overrides})
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    return scenario, data, ClientTrainer(data, settings, device=None)


def load_for_run(run_config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(scenario, data, trainer) for this run, built once per process."""
    return _cached(*scenario_source(run_config))


def model_arrays(trainer: Any, flat: np.ndarray) -> dict[str, np.ndarray]:
    """The flat vector as the model's named float32 arrays (parameter order = state_dict order)."""
    like = [p.detach().cpu().numpy() for p in trainer.params]
    names = [n for n, _ in trainer.model.named_parameters()]
    return dict(zip(names, unflatten(np.asarray(flat, dtype=np.float32), like), strict=True))


def model_record(trainer: Any, flat: np.ndarray) -> ArrayRecord:
    """:func:`model_arrays` as the ArrayRecord the ServerApp sends (and the layout replies must match)."""
    return ArrayRecord(
        array_dict={k: Array(np.ascontiguousarray(v)) for k, v in model_arrays(trainer, flat).items()}
    )
