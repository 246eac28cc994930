"""Trackers (``[report] tensorboard``, ``[report] mlflow``): the TensorBoard event files and the MLflow store hold
the same scalars as ``metrics.jsonl``, one step per round, the non-private ones prefixed as such, with the config
and the privacy status; off by default; a tracker that cannot start is exit 2 before the first round, and one that
fails mid-run only warns. Offline: MLflow writes a local file store."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.cli import EXIT_USAGE, main
from fedsim.engine.runner import resume_run, run_scenario
from fedsim.report import trackers as trackers_mod
from fedsim.report.trackers import check_trackers, row_scalars, start_trackers, tracking_uri
from fedsim.scenarios import ScenarioError, load_scenario

TINY = ["engine.name=local", "data.num_clients=20", "engine.num_workers=1"]


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch):
    # the trackers opt in to MLflow's file store through the environment; each test starts without it
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _file_rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _expected(rows: list[dict], sep: str) -> dict[str, dict[int, float]]:
    """tag -> {round: value}: every number of metrics.jsonl's rows (nested tables joined with ``sep``), written
    independently of the trackers' own flattening. A null with ``<key>_reason: infinite`` beside it is +inf."""
    out: dict[str, dict[int, float]] = {}

    def walk(prefix: str, value, step: int, table: dict, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{sep}{k}", v, step, value, k)
        elif value is None and table.get(f"{key}_reason") == "infinite":
            out.setdefault(prefix, {})[step] = math.inf
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.setdefault(prefix, {})[step] = float(value)

    for row in rows:
        for k, v in row.items():
            if k != "round":
                walk(k, v, row["round"], row, k)
    return out


def _tensorboard(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _tb_scalars(acc: EventAccumulator) -> dict[str, dict[int, float]]:
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _mlflow_run(uri: str, experiment: str = "quickstart"):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return client, runs


def _ml_scalars(client: MlflowClient, run) -> dict[str, dict[int, float]]:
    return {
        k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)} for k in run.data.metrics
    }


def _assert_tb_equals(got: dict, want: dict) -> None:
    assert set(got) == set(want), set(got) ^ set(want)
    for tag, steps in want.items():
        # TensorBoard keeps scalars as float32 (what its readers and its Rust data server take)
        assert got[tag] == {s: float(np.float32(v)) for s, v in steps.items()}, tag


def test_tensorboard_and_mlflow_hold_the_rows_scalars_config_and_privacy_status(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    scenario = load_scenario(
        "quickstart", [*TINY, "rounds=2", "report.tensorboard=true", f"report.mlflow={uri}"]
    )
    result = run_scenario(scenario, tmp_path / "run")
    rows = _file_rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2] and len(result.rows) == 2

    acc = _tensorboard(tmp_path / "run")
    tb = _tb_scalars(acc)
    _assert_tb_equals(tb, _expected(rows, "/"))
    assert {"epsilon", "heldout_accuracy", "non_private/cohort", "non_private/train_accuracy"} <= set(tb)
    assert "generalization/population" in tb and not any(t.startswith("cohort") for t in tb)
    text = {t for t in acc.Tags()["tensors"] if t.endswith("text_summary")}
    assert {"config/text_summary", "privacy/text_summary", "end/text_summary"} <= text
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "noise_multiplier = 1.0" in config and "[report]" in config
    privacy = acc.Tensors("privacy/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "private: true" in privacy and "non_private" in privacy
    assert "_hparams_/experiment" in acc.PluginTagToContent("hparams")

    client, runs = _mlflow_run(uri)
    assert len(runs) == 1
    run = runs[0]
    ml = _ml_scalars(client, run)
    assert ml == _expected(rows, ".")  # float64: exactly the file's numbers
    assert {"non_private.cohort", "non_private.train_accuracy", "epsilon"} <= set(ml)
    params = run.data.params
    assert params["privacy.noise_multiplier"] == "1.0" and params["rounds"] == "2"
    assert params["report.tensorboard"] == "True" and params["model.hidden"] == "[32]"
    tags = run.data.tags
    assert tags["fedsim.private"] == "true" and tags["fedsim.randomness"] == "seeded"
    assert tags["fedsim.accountant"] == "pld" and "non_private" in tags["fedsim.non_private"]
    assert tags["mlflow.runName"] == "run" and Path(tags["fedsim.run_dir"]) == (tmp_path / "run").resolve()
    assert run.info.status == "FINISHED" and "fedsim.stopped_by" not in tags


def test_an_infinite_epsilon_is_logged_as_inf_and_a_relative_path_is_a_file_store(tmp_path, monkeypatch):
    """noise_multiplier = 0: epsilon is infinite (null with epsilon_reason in metrics.jsonl). TensorBoard and the
    MLflow file store both keep +inf. A relative path is a file store in the working directory."""
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario(
        "quickstart",
        [
            *TINY,
            "rounds=1",
            "privacy.noise_multiplier=0",
            "report.tensorboard=true",
            "report.mlflow=./mlruns",
        ],
    )
    run_scenario(scenario, tmp_path / "run")
    rows = _file_rows(tmp_path / "run")
    assert rows[0]["epsilon"] is None and rows[0]["epsilon_reason"] == "infinite"
    tb = _tb_scalars(_tensorboard(tmp_path / "run"))
    assert tb["epsilon"] == {1: math.inf}
    _assert_tb_equals(tb, _expected(rows, "/"))
    client, runs = _mlflow_run((tmp_path / "mlruns").as_uri())
    ml = _ml_scalars(client, runs[0])
    assert ml["epsilon"] == {1: math.inf} and ml == _expected(rows, ".")
    assert runs[0].data.tags["fedsim.private"] == "false"


def test_a_resumed_run_keeps_one_value_per_round(tmp_path):
    """A run that dies after writing round 2 (checkpoint of round 1) is resumed: TensorBoard hides what it wrote
    after the checkpoint (purge_step), so each round reads back once, as metrics.jsonl has it; MLflow marks the
    first run FAILED and starts a new one, tagged, that holds every row."""
    uri = (tmp_path / "mlruns").as_uri()
    settings = [*TINY, "rounds=3", "engine.checkpoint_every=1", "report.tensorboard=true"]
    scenario = load_scenario("quickstart", [*settings, f"report.mlflow={uri}"])

    def die_at_round_2(row):
        if row["round"] == 2:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        run_scenario(scenario, tmp_path / "run", on_row=die_at_round_2)
    assert len(_file_rows(tmp_path / "run")) == 2
    resume_run(tmp_path / "run")
    rows = _file_rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2, 3]
    _assert_tb_equals(_tb_scalars(_tensorboard(tmp_path / "run")), _expected(rows, "/"))
    client, runs = _mlflow_run(uri)
    assert [r.info.status for r in runs] == ["FAILED", "FINISHED"]
    assert runs[1].data.tags["fedsim.resumed_from_round"] == "1"
    assert _ml_scalars(client, runs[1]) == _expected(rows, ".")


def _run_cli(tmp_path: Path, *settings: str) -> tuple[int, str]:
    import contextlib
    import io

    argv = ["run", "quickstart", "--no-progress", "--out", str(tmp_path / "run")]
    for s in [*TINY, "rounds=1", *settings]:
        argv += ["--set", s]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("settings", "missing", "said"),
    [
        (
            ["report.mlflow=./mlruns"],
            "mlflow",
            "[report] mlflow is set but the mlflow package is not installed",
        ),
        (
            ["report.tensorboard=true"],
            "tensorboard",
            "[report] tensorboard = true but the tensorboard package",
        ),
        (["report.tensorboard=true", "report.mlflow=bogus://nowhere"], None, "MLflow could not start a run"),
    ],
    ids=["no-mlflow", "no-tensorboard", "bad-uri"],
)
def test_a_tracker_that_cannot_start_is_exit_2_before_the_first_round(
    tmp_path, monkeypatch, settings, missing, said
):
    monkeypatch.chdir(tmp_path)
    if missing:  # as if the package were not installed: find_spec answers None, an import raises
        monkeypatch.setitem(sys.modules, missing, None)
    rounds = []
    monkeypatch.setattr(trackers_mod.Trackers, "log_row", lambda self, row: rounds.append(row))
    code, err = _run_cli(tmp_path, *settings)
    assert code == EXIT_USAGE and err.startswith("fedsim: error: ") and said in err, err
    assert "Traceback" not in err and not rounds
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""  # no round ran; the folder can be used again
    assert not (tmp_path / "mlruns").exists()


def test_a_file_store_must_be_new_empty_or_mlflows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    code, err = _run_cli(tmp_path, "report.mlflow=./notes")
    assert code == EXIT_USAGE and "holds other files and no MLflow store" in err, err
    # the same refusal without opening anything, for a caller that checks before it starts
    with pytest.raises(ValueError, match="holds other files"):
        check_trackers(load_scenario("quickstart", ["report.mlflow=./notes"]))
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["todo.txt"]


def test_a_tracker_failing_mid_run_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    uri = (tmp_path / "mlruns").as_uri()

    def broken(self, step, row):
        raise OSError("disk full")

    monkeypatch.setattr(trackers_mod._MLflow, "log_row", broken)
    scenario = load_scenario(
        "quickstart", [*TINY, "rounds=2", "report.tensorboard=true", f"report.mlflow={uri}"]
    )
    with caplog.at_level(logging.WARNING, logger="fedsim.report.trackers"):
        result = run_scenario(scenario, tmp_path / "run")
    warnings = [r for r in caplog.records if r.name == "fedsim.report.trackers"]
    assert len(warnings) == 1 and "mlflow tracker failed at round 1" in warnings[0].getMessage()
    assert "OSError: disk full" in warnings[0].getMessage()
    rows = _file_rows(tmp_path / "run")
    assert len(result.rows) == len(rows) == 2 and (tmp_path / "run" / "summary.json").is_file()
    _assert_tb_equals(
        _tb_scalars(_tensorboard(tmp_path / "run")), _expected(rows, "/")
    )  # the other one goes on
    _, runs = _mlflow_run(uri)
    assert runs[0].info.status == "FAILED" and not runs[0].data.metrics  # turned off, and marked as such


def test_trackers_are_off_by_default_and_without_a_run_directory(tmp_path):
    default = load_scenario("quickstart")
    assert default.report.tensorboard is False and default.report.mlflow is None
    assert start_trackers(default, tmp_path) is None and check_trackers(default) is None
    on = load_scenario("quickstart", ["report.tensorboard=true", "report.mlflow=./mlruns"])
    assert start_trackers(on, None) is None  # write=False: nothing is tracked
    assert load_scenario("quickstart", ["report.mlflow="]).report.mlflow is None  # '' is off
    assert not list(tmp_path.iterdir())
    # importing the round loop imports no tracker package
    code = "import sys, fedsim.loop; print(sorted({'mlflow', 'tensorboard'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_row_scalars_keep_numbers_and_prefix_the_non_private_ones():
    row = {
        "round": 3,
        "epsilon": math.inf,
        "heldout_loss": math.nan,
        "paper_epsilon_igmm": None,
        "private": True,
        "accountant": "pld",
        "clip": np.float64(0.5),
        "domains_heldout": [{"loss": 1.0}],
        "generalization": {"a": 0.1, "status": "ok", "n_min": 40},
        "non_private": {"cohort": np.int64(4), "failed": {"timeout": 1}},
    }
    assert row_scalars(row, "/") == {
        "epsilon": math.inf,
        "clip": 0.5,
        "generalization/a": 0.1,
        "generalization/n_min": 40.0,
        "non_private/cohort": 4.0,
        "non_private/failed/timeout": 1.0,
    }
    assert "non_private.cohort" in row_scalars(row, ".")


def test_tracking_uri_reads_paths_and_file_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tracking_uri("./mlruns") == ((tmp_path / "mlruns").as_uri(), tmp_path / "mlruns")
    assert tracking_uri((tmp_path / "x").as_uri())[1] == tmp_path / "x"
    assert tracking_uri(str(tmp_path / "y"))[1] == tmp_path / "y"
    assert tracking_uri("http://localhost:5000") == ("http://localhost:5000", None)
    assert tracking_uri("databricks") == ("databricks", None)
    with pytest.raises(ValueError, match="file: URI"):
        tracking_uri("file://otherhost/mlruns")


@pytest.mark.parametrize("word", ["mlruns", "off", "yes", "loop"])
def test_a_bare_word_is_refused_when_the_scenario_loads(word):
    """It would silently become a folder of that name in the working directory: a folder is written as a path."""
    with pytest.raises(ScenarioError, match=f"report.mlflow.*'./{word}'"):
        load_scenario("quickstart", [f"report.mlflow={word}"])
