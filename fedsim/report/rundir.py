"""The run directory: resolved config, one JSON row per round, the ledger, the summary.

Rows are appended and flushed as each round ends, so an interrupted run keeps every finished round.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .provenance import provenance

log = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    """JSON without NaN/inf (written as null) and with numpy scalars as Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _row_line(row: dict[str, Any]) -> str:
    """One row of ``metrics.jsonl``."""
    return json.dumps(_clean(row)) + "\n"


def new_run_dir(name: str, out: str | Path | None, root: str | Path = "runs") -> Path:
    """``out`` if given (it must not already hold a run), else a fresh ``runs/<timestamp>-<name>``."""
    if out is not None:
        path = Path(out)
        metrics = path / "metrics.jsonl"
        if metrics.exists() and metrics.stat().st_size > 0:  # an empty one is a run that failed to start
            raise ValueError(f"--out {path} already holds a run (metrics.jsonl); choose another folder")
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{name}"
    path, i = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{i}")
        i += 1
    path.mkdir(parents=True)
    return path


class RunWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._metrics = open(path / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        config = path / "config.toml"
        #: the run's config.toml as written (checkpoints carry its digest)
        self.config_toml: str | None = config.read_text() if config.is_file() else None

    def begin(self, config_toml: str) -> None:
        """What a run directory holds before its first round: ``provenance.json`` (the code and library
        versions that ran) and ``config.toml`` (the resolved scenario)."""
        self.write_json("provenance.json", provenance())
        self.write_text("config.toml", config_toml)
        self.config_toml = config_toml

    def write_json(self, name: str, obj: Any) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n")
        tmp.replace(target)
        return target

    def write_plots(self) -> list[Path]:
        """``plots/*.png`` from what is written (:func:`fedsim.report.plots.run_plots`). A plot that fails is logged
        and skipped: it must never cost a run its results."""
        from .plots import run_plots  # matplotlib only when plots are drawn

        try:
            return run_plots(self.path, from_ledger=False)
        except Exception as exc:
            log.warning(
                "plots for %s were not drawn: %s: %s (fedsim report %s draws them again)",
                self.path,
                type(exc).__name__,
                exc,
                self.path,
            )
            return []

    def write_weights(self, name: str, weights: Any) -> Path:
        """The model as a flat float64 vector (``np.load(path)["weights"]``), written atomically."""
        target = self.path / name
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, weights=np.asarray(weights, dtype=np.float64))
        tmp.replace(target)
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        target.write_text(text)
        return target

    def append_row(self, row: dict[str, Any]) -> None:
        self._metrics.write(_row_line(row))
        self._metrics.flush()

    def replace_rows(self, rows: list[dict[str, Any]]) -> None:
        """Make ``metrics.jsonl`` exactly ``rows`` (atomically: a resumed run drops the rows after its
        checkpoint); later rows are appended after them."""
        self._metrics.close()
        target = self.path / "metrics.jsonl"
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("".join(_row_line(r) for r in rows), encoding="utf-8")
        tmp.replace(target)
        self._metrics = open(target, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    with open(Path(path) / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
