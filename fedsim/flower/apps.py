"""The pieces the Flower ServerApp and ClientApp share: scenario from the run config, data, model keys.

Nothing here runs at import time (Ray workers and SuperNodes re-import the module).

Run config keys (``[tool.flwr.app.config]`` in pyproject.toml, or ``flwr run . --run-config``):
``scenario`` (a shipped name or a .toml path) and ``overrides`` (``"key=value key=value"``, the same
syntax as ``fedsim run --set``).

Node config (``flwr run`` simulation sets ``partition-id`` and ``num-partitions``; a deployed SuperNode is
started with ``--node-config "partition-id=3 num-partitions=90"``): ``partition-id`` selects which training
client of the scenario this node is.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import Any

import numpy as np

from fedsim.privacy.aggregation import unflatten


def scenario_from_run_config(run_config: dict[str, Any]):
    from fedsim.scenarios import load_scenario

    name = str(run_config.get("scenario", "quickstart"))
    overrides = shlex.split(str(run_config.get("overrides", "") or ""))
    return load_scenario(name, overrides)


@lru_cache(maxsize=4)
def _cached(name: str, overrides: str) -> tuple[Any, Any, Any]:
    from fedsim.engine.runner import build_data
    from fedsim.engine.trainer import ClientTrainer, TrainSettings

    scenario = scenario_from_run_config({"scenario": name, "overrides": overrides})
    data = build_data(scenario)
    settings = TrainSettings.from_scenario(scenario)
    return scenario, data, ClientTrainer(data, settings, device=None)


def load_for_run(run_config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(scenario, data, trainer) for this run, built once per process."""
    return _cached(str(run_config.get("scenario", "quickstart")), str(run_config.get("overrides", "") or ""))


def model_arrays(trainer: Any, flat: np.ndarray) -> dict[str, np.ndarray]:
    """The flat vector as the model's named float32 arrays (parameter order = state_dict order)."""
    like = [p.detach().cpu().numpy() for p in trainer.params]
    names = [n for n, _ in trainer.model.named_parameters()]
    return dict(zip(names, unflatten(np.asarray(flat, dtype=np.float32), like), strict=True))
