"""Experiment trackers beside the run directory: TensorBoard event files and MLflow runs (``[report]``).

Each tracker gets the same scalars as ``metrics.jsonl``, one step per round (the step is the row's ``round``):
every number of a row, nested tables flattened (``generalization/a``), the values under ``non_private`` (exact
facts about clients, not covered by epsilon) prefixed as such, ``non_private/<key>`` in TensorBoard and
``non_private.<key>`` in MLflow. Strings, booleans, lists and ``None``/NaN (undefined) are not logged. An infinite
value (an epsilon no accountant can bound at this delta) is logged as +inf (-inf) where the backend keeps it:
TensorBoard does, and so does MLflow's file store; with any other MLflow store it is skipped (a SQL store would
turn it into the largest float). The resolved config is logged once (TensorBoard: the ``config`` text and the
hparams; MLflow: params ``section.key``), with the privacy status (``private``, ``randomness``, ``accountant``,
``delta``: MLflow tags ``fedsim.*``, the TensorBoard ``privacy`` text).

Trackers are off by default and cost nothing then (:func:`start_trackers` returns ``None`` and no tracker package
is imported). They never cost a run its results: a tracker that cannot start (its package is missing, a bad
tracking URI) is a ``ValueError`` before the first round; one that fails while logging is logged once as a warning
and turned off, and the run goes on (``metrics.jsonl`` holds every row whatever the trackers do).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import numbers
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fedsim.labels import NON_PRIVATE
from fedsim.report.rundir import flatten_tables
from fedsim.tracking_uri import SCHEMELESS_URIS, check_tracking_uri  # the schema checks the same form

log = logging.getLogger(__name__)

#: the folder of the run directory that holds the TensorBoard event files
TENSORBOARD_DIR = "tensorboard"
#: what the TensorBoard ``privacy`` text and the MLflow tag ``fedsim.non_private`` say about the prefixed scalars
NON_PRIVATE_NOTE = (
    "scalars under non_private are exact facts about clients (cohort and failure counts, training-client "
    "metrics and the gap computed from them, un-noised update norms, timings); epsilon does not cover them"
)
#: the row keys that are not scalars of a round (the step itself)
_NOT_SCALARS = frozenset({"round"})
#: the held-out metrics the TensorBoard hparams dashboard shows beside the config, and epsilon
_HPARAM_METRICS = ("heldout_accuracy", "heldout_loss", "epsilon")
_MLFLOW_KEY = re.compile(r"[^\w.\- /:]")


def row_scalars(row: dict[str, Any], sep: str) -> dict[str, float]:
    """The numbers of a row, keyed by their path joined with ``sep`` (``non_private<sep>cohort``): nested tables
    flattened, booleans, strings, lists, ``None`` and NaN left out; infinities kept (the caller decides)."""
    leaves = flatten_tables({k: v for k, v in row.items() if k not in _NOT_SCALARS}, sep)
    out: dict[str, float] = {}
    for key, value in leaves.items():
        if isinstance(value, bool) or type(value).__name__ == "bool_":  # a flag, not a measurement
            continue
        if isinstance(value, numbers.Real) and not math.isnan(v := float(value)):
            out[key] = v
    return out


def config_params(config: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """A scenario's ``model_dump(mode="json")`` as flat ``section.key -> value``: numbers, strings and booleans as
    they are, lists (and tables inside lists) as their JSON text; empty tables and ``None`` left out."""
    import json

    return {
        key: value if isinstance(value, bool | int | float | str) else json.dumps(value, default=str)
        for key, value in flatten_tables(config, sep).items()
        if value is not None
    }


def privacy_status(scenario: Any, private: bool | None) -> dict[str, str]:
    """The run's privacy status as tags: ``private`` (every release noised; ``None``: not known yet), the
    randomness, the accountant and delta."""
    p = scenario.privacy
    status = {
        "private": "unknown" if private is None else str(bool(private)).lower(),
        "randomness": str(p.randomness),
        "accountant": str(p.accountant),
        "delta": repr(float(p.delta)),
        "noise_multiplier": repr(float(p.noise_multiplier)),
    }
    return status


def tracking_uri(value: str) -> tuple[str, Path | None]:
    """``[report] mlflow`` (:func:`check_tracking_uri`) as a tracking URI, and the local folder when it names
    MLflow's file store: a ``file:`` URI or a path (a relative path is relative to the working directory, as MLflow
    reads it). Other URIs (``sqlite:///...``, ``http://...``) are passed to MLflow as they are."""
    try:
        value = check_tracking_uri(value)
    except ValueError as exc:
        raise ValueError(f"[report] mlflow = {value!r}: {exc}") from None
    parsed = urlparse(value)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(
                f"[report] mlflow = {value!r}: a file: URI names a folder on this machine (file:///abs/path)"
            )
        from urllib.request import url2pathname

        path = Path(url2pathname(parsed.path)).resolve()
        return path.as_uri(), path
    if len(parsed.scheme) <= 1 and value not in SCHEMELESS_URIS:  # a path (or a Windows drive letter)
        path = Path(value).expanduser().resolve()
        return path.as_uri(), path
    return value, None


def _check_file_store(path: Path, value: str) -> None:
    """A file store must be a new or empty folder, or one that already holds an MLflow store: never a file or a
    folder of other things, where MLflow would scatter its experiment folders."""
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"[report] mlflow = {value!r}: {path} is a file; give a folder for MLflow's file store"
        )
    if path.is_dir():
        entries = list(path.iterdir())
        if entries and not (
            (path / ".trash").is_dir() or any((e / "meta.yaml").is_file() for e in entries if e.is_dir())
        ):
            raise ValueError(
                f"[report] mlflow = {value!r}: {path} holds other files and no MLflow store; give a new or empty "
                "folder, or an existing MLflow file store"
            )


def _require(package: str, setting: str, install: str) -> None:
    """A ``ValueError`` that says how to install ``package`` when it is not installed."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValueError(
            f"[report] {setting} but the {package} package is not installed: pip install {install}"
        )


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path, purge_step: int | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ValueError(
                f"[report] tensorboard = true but TensorBoard cannot be imported: {exc}"
            ) from None
        self.logdir = run_dir / TENSORBOARD_DIR
        self.last_step = max(0, (purge_step or 1) - 1)
        try:
            # purge_step: a resumed run hides what the killed run wrote after its checkpoint (run again now)
            self.writer = SummaryWriter(log_dir=str(self.logdir), purge_step=purge_step)
        except Exception as exc:
            raise ValueError(
                f"[report] tensorboard = true but {self.logdir} cannot hold event files: {type(exc).__name__}: {exc}"
            ) from None

    def log_config(self, config: dict[str, Any], config_toml: str | None, status: dict[str, str]) -> None:
        if config_toml:
            self.writer.add_text("config", "```toml\n" + config_toml + "\n```", 0)
        lines = [f"- {k}: {v}" for k, v in status.items()]
        self.writer.add_text("privacy", "\n".join([*lines, "", NON_PRIVATE_NOTE]), 0)
        try:  # the hparams dashboard: the config beside the held-out metrics (optional: a failure only warns)
            from torch.utils.tensorboard.summary import hparams

            flat = {k: v for k, v in config_params(config).items() if isinstance(v, bool | int | float | str)}
            flat.update({f"privacy_status.{k}": v for k, v in status.items()})
            writer = self.writer._get_file_writer()
            for summary in hparams(flat, dict.fromkeys(_HPARAM_METRICS, 0.0)):
                writer.add_summary(summary)
        except Exception as exc:
            log.warning(
                "TensorBoard hparams were not written (%s: %s); the config text is", type(exc).__name__, exc
            )
        self.writer.flush()

    def log_row(self, step: int, row: dict[str, Any]) -> None:
        wall = time.time()
        for key, value in row_scalars(row, "/").items():  # float32, as TensorBoard reads them; inf is kept
            self.writer.add_scalar(key, value, step, walltime=wall)
        self.writer.flush()  # a killed run keeps every round it wrote
        self.last_step = step

    def close(self, status: dict[str, str], failed: bool) -> None:
        lines = [f"- {k}: {v}" for k, v in {**status, "failed": str(failed).lower()}.items()]
        # at the last round: a resumed run's purge hides the end of the run it continues
        self.writer.add_text("end", "\n".join(lines), self.last_step)
        self.writer.close()

    def abort(self) -> None:
        self.writer.close()


class _MLflow:
    name = "mlflow"

    def __init__(self, value: str, run_name: str, experiment: str) -> None:
        uri, path = tracking_uri(value)
        #: whether the store keeps +-inf (the file store does; a SQL store replaces it, a server is not known)
        self.keeps_inf = path is not None
        if path is not None:
            _check_file_store(path, value)
            # MLflow 3 refuses its file store unless asked for it: naming a file store here is asking
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except Exception as exc:
            raise ValueError(f"[report] mlflow is set but mlflow cannot be imported: {exc}") from None
        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        try:
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    experiment_id = self.client.create_experiment(experiment)
                except Exception:  # another run (a parallel sweep) created it first
                    exp = self.client.get_experiment_by_name(experiment)
                    if exp is None:
                        raise
                    experiment_id = exp.experiment_id
            else:
                experiment_id = exp.experiment_id
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        except Exception as exc:
            raise ValueError(
                f"[report] mlflow = {value!r}: MLflow could not start a run there ({uri}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        self.uri = uri
        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit
        except ImportError:
            limit = 500
        self.max_param = int(limit)

    def _key(self, key: str) -> str:
        return _MLFLOW_KEY.sub("_", key)[:250]

    def log_config(self, config: dict[str, Any], tags: dict[str, str]) -> None:
        params = [
            self._Param(self._key(k), str(v)[: self.max_param]) for k, v in config_params(config).items()
        ]
        tag_list = [self._RunTag(k, v) for k, v in tags.items()]
        self.client.log_batch(self.run_id, tags=tag_list)
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params a call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_row(self, step: int, row: dict[str, Any]) -> None:
        ts = int(time.time() * 1000)
        metrics = [
            self._Metric(self._key(k), v, ts, step)
            for k, v in row_scalars(row, ".").items()
            if self.keeps_inf or math.isfinite(v)
        ]
        for i in range(0, len(metrics), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, status: dict[str, str], failed: bool) -> None:
        self.client.log_batch(self.run_id, tags=[self._RunTag(f"fedsim.{k}", v) for k, v in status.items()])
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")

    def abort(self) -> None:
        self.client.set_terminated(self.run_id, "FAILED")


class Trackers:
    """The trackers a run's ``[report]`` turns on, fed one row per round (:meth:`log_row`), closed once
    (:meth:`close`). Built by :func:`start_trackers`."""

    def __init__(self, backends: list[Any]) -> None:
        self.backends = backends

    def log_row(self, row: dict[str, Any]) -> None:
        """Log one row at step ``row["round"]``. A tracker that fails is logged once and turned off."""
        step = int(row["round"])
        for backend in list(self.backends):
            try:
                backend.log_row(step, row)
            except Exception as exc:
                self._drop(backend, f"round {step}", exc)

    def _drop(self, backend: Any, when: str, exc: BaseException) -> None:
        self.backends.remove(backend)
        log.warning(
            "the %s tracker failed at %s (%s: %s); it is off for the rest of the run, which goes on "
            "(metrics.jsonl holds every row)",
            backend.name,
            when,
            type(exc).__name__,
            exc,
        )
        _abort(backend)

    def close(
        self,
        *,
        failed: bool = False,
        private: bool | None = None,
        stopped_by: str | None = None,
        diagnostics: bool = True,
    ) -> None:
        """End every tracker: the final privacy status (``private``: every release was noised), why the run
        stopped early (``stopped_by``: as ``summary.json`` has it, a stop by client failures is non-private, so it
        is ``non_private.stopped_by`` and only with ``diagnostics``) and whether it failed (``failed``: an error
        ended it; MLflow status FAILED). Never raises."""
        from .rows import PUBLIC_STOPS

        status = {"private": "unknown" if private is None else str(bool(private)).lower()}
        if stopped_by in PUBLIC_STOPS:
            status["stopped_by"] = str(stopped_by)
        elif stopped_by and diagnostics:
            status[f"{NON_PRIVATE}.stopped_by"] = str(stopped_by)
        for backend in list(self.backends):
            try:
                backend.close(status, failed)
            except Exception as exc:
                self._drop(backend, "the end of the run", exc)
        self.backends = []


def _abort(backend: Any) -> None:
    """End a tracker that failed, as far as it still can (an MLflow run is marked FAILED); never raises."""
    try:
        backend.abort()
    except Exception:
        pass


def check_trackers(scenario: Any) -> None:
    """What :func:`start_trackers` would refuse, checked without opening or writing anything: a tracker package
    that is not installed, a tracking URI of the wrong form, a file store that is a file or a folder of other
    things. A ``ValueError`` saying why; nothing when no tracker is on. For callers that want the refusal before
    they create a run directory or start an engine (``start_trackers`` checks the same again)."""
    report = getattr(scenario, "report", None)
    tensorboard, mlflow_uri = bool(getattr(report, "tensorboard", False)), getattr(report, "mlflow", None)
    if tensorboard:
        _require("tensorboard", "tensorboard = true", "tensorboard (or pip install 'fedsim[trackers]')")
    if mlflow_uri:
        _require("mlflow", "mlflow is set", "mlflow-skinny (or mlflow, or pip install 'fedsim[trackers]')")
        _, path = tracking_uri(str(mlflow_uri))
        if path is not None:
            _check_file_store(path, str(mlflow_uri))


def start_trackers(
    scenario: Any,
    run_dir: Path | None,
    *,
    config_toml: str | None = None,
    first_round: int = 1,
    prior_rows: list[dict[str, Any]] | None = None,
    private: bool | None = None,
) -> Trackers | None:
    """The trackers ``scenario.report`` turns on for the run in ``run_dir``, started (``None`` when none is on,
    or when the run writes no run directory). A tracker that cannot start is a ``ValueError`` saying why, and
    the ones started before it are closed.

    ``first_round`` > 1 is a resumed run: TensorBoard hides the events the killed run wrote from that round on
    (they are written again), MLflow starts a new run tagged ``fedsim.resumed_from_round`` and logs the
    ``prior_rows`` (the rows up to the checkpoint) into it first, so that it holds every row.
    """
    if run_dir is None:
        return None
    report = getattr(scenario, "report", None)
    tensorboard, mlflow_uri = bool(getattr(report, "tensorboard", False)), getattr(report, "mlflow", None)
    if not (tensorboard or mlflow_uri):
        return None
    run_dir = Path(run_dir)
    config = scenario.model_dump(mode="json", exclude_none=True)
    status = privacy_status(scenario, private)
    resumed = first_round > 1
    check_trackers(scenario)  # every package first, so that a missing one leaves nothing behind
    backends: list[Any] = []
    try:
        if mlflow_uri:  # first: a bad tracking URI is the likeliest failure
            ml = _MLflow(str(mlflow_uri), run_dir.name, str(scenario.name))
            backends.append(ml)
            tags = {f"fedsim.{k}": v for k, v in status.items()}
            tags.update(
                {
                    "fedsim.scenario": str(scenario.name),
                    "fedsim.run_dir": str(run_dir.resolve()),
                    "fedsim.non_private": NON_PRIVATE_NOTE,
                }
            )
            if resumed:
                tags["fedsim.resumed_from_round"] = str(first_round - 1)
            try:
                ml.log_config(config, tags)
                for row in (prior_rows or []) if resumed else []:
                    ml.log_row(int(row["round"]), row)
            except Exception as exc:
                raise ValueError(
                    f"[report] mlflow = {mlflow_uri!r}: MLflow could not log the run's config: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        if tensorboard:
            tb = _TensorBoard(run_dir, purge_step=first_round if resumed else None)
            backends.append(tb)
            try:
                if not resumed:  # the killed run logged them at step 0, which the purge keeps
                    tb.log_config(config, config_toml, status)
            except Exception as exc:
                raise ValueError(
                    f"[report] tensorboard = true but {tb.logdir} cannot hold event files: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
    except BaseException:
        for backend in backends:
            _abort(backend)
        raise
    return Trackers(backends)
