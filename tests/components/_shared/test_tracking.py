"""MLflow tracking (issue 29 item 1) against a real MLflow tracking server on 127.0.0.1: a step's settings, per-step
metrics, final metrics and files land in its run; KFP's own task run is used when KFP set one (and left for KFP to
end); no tracking without either; a server that is away is a warning, never a failed step; an address with
credentials in it is refused, naming the Secret to use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kfp_finetune.components._shared import tracking
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.metrics_file import StepMetrics
from tests.support.mlflow_server import mlflow_server

pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as address:
        yield address


@pytest.fixture(autouse=True)
def no_kfp_run(monkeypatch):
    for name in (tracking.KFP_URI, tracking.KFP_RUN):
        monkeypatch.delenv(name, raising=False)


def client(address):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=address)


STEPS = [StepMetrics(1, {"loss": 2.5, "lr": 1e-4}), StepMetrics(2, {"loss": 1.75, "lr": 2e-4}), StepMetrics(3, {"loss": 1.5, "lr": 2e-4})]  # fmt: skip


@pytest.mark.slow
def test_a_step_logs_its_settings_steps_metrics_and_files_to_a_new_run(server, tmp_path):
    table = tmp_path / "samples.jsonl"
    table.write_text('{"row": 0, "tuned_generation": "red"}\n')
    tracking.track_step(
        server, "tiny-tunes", run_name="run-1/evaluate", tags={"kfp.run_id": "run-1"},
        params={"method": "lora", "learning_rate": 2e-4}, metrics={"tuned_eval_loss": 1.25, "passed": 1.0},
        steps=STEPS, files={"samples": [table]}, texts={"reports/evaluate.html": "<h1>better</h1>"},
    )  # fmt: skip
    mlflow = client(server)
    experiment = mlflow.get_experiment_by_name("tiny-tunes")
    (run,) = mlflow.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-1/evaluate" and run.info.status == "FINISHED"
    assert run.data.tags["kfp.run_id"] == "run-1"
    assert run.data.params == {"method": "lora", "learning_rate": "0.0002"}
    assert run.data.metrics["tuned_eval_loss"] == 1.25 and run.data.metrics["passed"] == 1.0
    history = mlflow.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.5), (2, 1.75), (3, 1.5)]
    downloaded = mlflow.download_artifacts(run.info.run_id, "reports/evaluate.html", str(tmp_path / "down"))
    assert Path(downloaded).read_text() == "<h1>better</h1>"
    downloaded = mlflow.download_artifacts(run.info.run_id, "samples/samples.jsonl", str(tmp_path / "down"))
    assert Path(downloaded).read_text() == table.read_text()


@pytest.mark.slow
def test_the_run_kfp_made_for_the_task_is_used_and_left_for_kfp_to_end(server, monkeypatch):
    mlflow = client(server)
    experiment_id = mlflow.create_experiment("kfp-made")
    kfp_run = mlflow.create_run(experiment_id, run_name="pipeline/fine-tune")
    monkeypatch.setenv(tracking.KFP_URI, server)
    monkeypatch.setenv(tracking.KFP_RUN, kfp_run.info.run_id)
    # No tracking_uri given, or another one: KFP's run wins (it is the task's, under the pipeline's parent run).
    tracking.track_step(
        "", "", run_name="ignored", tags={}, params={"engine": "torchtune"}, metrics={"final_loss": 0.5}, steps=STEPS,
    )  # fmt: skip
    run = mlflow.get_run(kfp_run.info.run_id)
    assert run.data.params == {"engine": "torchtune"} and run.data.metrics["final_loss"] == 0.5
    assert run.info.status == "RUNNING"  # KFP's launcher ends it
    assert len(mlflow.search_runs([experiment_id])) == 1


def test_without_a_tracking_server_nothing_is_tracked():
    tracker = tracking.Tracker.open("", "any")
    assert not tracker.on
    tracker.log_params({"a": 1})  # no-ops, no client
    tracking.check_tracking("")


def test_a_server_that_is_away_is_a_warning_never_a_failed_step(monkeypatch, caplog):
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with caplog.at_level(logging.WARNING):
        tracking.track_step(closed, "x", run_name="r", tags={}, params={"a": 1}, metrics={"b": 2.0})
    assert any("could not start a run" in r.getMessage() and closed in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("http://alice:s3cret@mlflow:5000", ["mlflow_tracking_uri carries credentials", "mlflow_secret", "MLFLOW_TRACKING_TOKEN"]),
        ("https://mlflow:5000/?token=abc", ["mlflow_tracking_uri carries credentials", "query string"]),
        ("mlflow:5000", ["mlflow_tracking_uri='mlflow:5000'", "http:// or https://"]),
    ],
)  # fmt: skip
def test_a_bad_tracking_address_is_refused_before_any_work(uri, expected):
    with pytest.raises(ConfigError) as refused:
        tracking.check_tracking(uri)
    message = str(refused.value)
    assert all(part in message for part in expected), message
    assert "s3cret" not in message and "abc" not in message


@pytest.mark.slow
def test_pre_flight_probes_the_server_with_a_run_it_deletes(server):
    from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

    checked = run_preflight(tune_backend="local", mlflow_tracking_uri=server, mlflow_experiment="probed")
    assert "mlflow_tracking_uri" in checked
    mlflow = client(server)
    experiment = mlflow.get_experiment_by_name("probed")
    assert mlflow.search_runs([experiment.experiment_id]) == []  # the probe run is deleted

    with pytest.raises(PreflightError) as refused:
        run_preflight(tune_backend="local", mlflow_tracking_uri="http://alice:s3cret@mlflow:5000")
    assert "mlflow_tracking_uri carries credentials" in str(refused.value) and "s3cret" not in str(
        refused.value
    )


def test_pre_flight_names_a_tracking_server_that_does_not_answer(monkeypatch):
    pytest.importorskip("mlflow")
    import socket

    from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(PreflightError) as refused:
        run_preflight(tune_backend="local", mlflow_tracking_uri=closed, mlflow_experiment="x")
    message = str(refused.value)
    assert f"mlflow_tracking_uri: the MLflow server at {closed} did not take a run" in message
    assert "mlflow_secret" in message
