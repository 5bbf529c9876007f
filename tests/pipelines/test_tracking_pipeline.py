"""`finetune_pipeline` under kfp.local logging to a real MLflow tracking server on 127.0.0.1 (issue 29 item 1): the
fine-tune step's run has its settings, every training step's loss at its step and its report; evaluate's run has
the scores with their intervals, the samples table and its report. KFP's Metrics stay as they are."""

from pathlib import Path

import pytest

from kfp_finetune.pipelines.finetune import finetune_pipeline
from tests.pipelines.test_pipelines import FAST_TRAINING, run_locally
from tests.support.mlflow_server import mlflow_server

pytest.importorskip("mlflow")


@pytest.mark.slow
def test_the_pipeline_logs_training_and_evaluation_to_mlflow(tiny_llama, tiny_dataset, tmp_path):
    from mlflow import MlflowClient

    with mlflow_server(tmp_path / "mlflow-server") as address:
        task = run_locally(
            tmp_path, finetune_pipeline, model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]),
            export_destination=str(tmp_path / "exported"), mlflow_tracking_uri=address, mlflow_experiment="tiny",
            **FAST_TRAINING,
        )  # fmt: skip
        mlflow = MlflowClient(tracking_uri=address)
        experiment = mlflow.get_experiment_by_name("tiny")
        runs = {
            run.info.run_name.rsplit("/", 1)[1]: run for run in mlflow.search_runs([experiment.experiment_id])
        }
        assert sorted(runs) == ["evaluate", "fine-tune"]
        assert all(run.info.status == "FINISHED" for run in runs.values())

        tune = runs["fine-tune"]
        assert tune.data.params["engine"] == "torchtune" and tune.data.params["method"] == "lora"
        losses = mlflow.get_metric_history(tune.info.run_id, "loss")
        assert [m.step for m in losses] == list(range(1, 13))  # FAST_TRAINING: 12 steps
        assert tune.data.metrics["final_loss"] == task.outputs["train_metrics"].metadata["final_loss"]
        assert "<svg" in Path(mlflow.download_artifacts(tune.info.run_id, "reports/fine-tune.html", str(tmp_path))).read_text()  # fmt: skip

        scores = runs["evaluate"]
        evaluation = task.outputs["eval_metrics"].metadata
        for name in ("tuned_eval_loss", "base_eval_loss", "eval_loss_improvement_ci_low", "passed"):
            assert scores.data.metrics[name] == pytest.approx(evaluation[name])
        table = mlflow.download_artifacts(scores.info.run_id, "samples/samples.jsonl", str(tmp_path))
        assert len(Path(table).read_text().splitlines()) == evaluation["num_samples"]
        assert [a.path for a in mlflow.list_artifacts(scores.info.run_id, "reports")] == [
            "reports/evaluate.html"
        ]
