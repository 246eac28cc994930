"""fedsim: federated learning with client-level differential privacy.

The Python API (:mod:`fedsim.api`): ``fedsim.run(scenario, out, overrides=[...])`` runs a scenario and returns its
:class:`~fedsim.RunResult`; ``fedsim.load_model(run_dir)`` gives a run's final model as a ``torch.nn.Module``;
``fedsim.load_scenario(name_or_path, overrides)`` and ``fedsim.Scenario`` describe an experiment. They are imported
on first use, so ``import fedsim`` (and the ``fedsim`` command's ``--help``) stays instant.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing is not imported for it: `import fedsim` stays instant
if TYPE_CHECKING:
    from typing import Any

    from fedsim.api import load_model, run
    from fedsim.loop import RunResult
    from fedsim.scenarios import Scenario, load_scenario

#: the public names, and the module each is imported from on first use
_LAZY = {
    "run": "fedsim.api",
    "load_model": "fedsim.api",
    "load_scenario": "fedsim.scenarios",
    "Scenario": "fedsim.scenarios",
    "RunResult": "fedsim.loop",
}

__all__ = ["RunResult", "Scenario", "__version__", "load_model", "load_scenario", "run"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
