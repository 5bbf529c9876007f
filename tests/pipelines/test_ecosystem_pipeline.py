"""`finetune_pipeline` under kfp.local into the model ecosystem (issue 29): it logs to a real MLflow tracking server
on 127.0.0.1 — the fine-tune step's run has its settings, every training step's loss at its step and its report;
evaluate's run has the scores with their intervals, the samples table and its report; KFP's Metrics stay as they
are — and exports a KServe ModelCar to a real OCI registry (Debian's docker-registry) whose layers hold exactly the
export's checksums — and registers it in the Kubeflow Model Registry (a stand-in of its REST API) with its
lineage. A model the gate stops pushes and registers nothing, and `run-local` keeps it."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from kfp_finetune.pipelines.finetune import finetune_pipeline
from tests.pipelines.test_pipelines import FAST_TRAINING, run_locally
from tests.support.mlflow_server import mlflow_server
from tests.support.model_registry_standin import ModelRegistryStandin
from tests.support.oci_registry import get, oci_registry, push_image, require_registry

pytest.importorskip("mlflow")
require_registry()

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MLFLOW_PASSWORD = "plantedMLFLOWpassword0123456789"


def _image_files(registry, repository: str, tag: str) -> dict[str, bytes]:
    """Every file under /models in the tagged image, read from its blobs with tarfile."""
    manifest = json.loads(get(registry, f"/v2/{repository}/manifests/{tag}", MANIFEST))
    found = {}
    for layer in manifest["layers"]:
        blob = get(registry, f"/v2/{repository}/blobs/{layer['digest']}")
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.startswith("models/"):
                    found[member.name[len("models/") :]] = archive.extractfile(member).read()
    return found


@pytest.mark.slow
def test_the_pipeline_logs_to_mlflow_exports_a_modelcar_and_registers_it(
    tiny_llama, tiny_dataset, tmp_path, monkeypatch, capfd
):
    from mlflow import MlflowClient
    from model_registry import ModelRegistry

    # The MLflow server asks for a user and password (its basic-auth app); the steps get them as the Secret named by
    # mlflow_secret gives them, and no output may hold the password.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)
    with (
        mlflow_server(tmp_path / "mlflow-server", auth=("admin", MLFLOW_PASSWORD)) as address,
        oci_registry(tmp_path / "registry") as registry, ModelRegistryStandin() as models,
    ):  # fmt: skip
        push_image(registry, "base/shell", "1", [{"bin/sh": b"a shell"}])
        task = run_locally(
            tmp_path, finetune_pipeline, model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]),
            export_destination=f"oci://{registry.host}/models/tiny:v1",
            export_oci_base_image=f"{registry.host}/base/shell:1", registry_address=models.url,
            mlflow_tracking_uri=address, mlflow_experiment="tiny", **FAST_TRAINING,
        )  # fmt: skip
        in_image = _image_files(registry, "models/tiny", "v1")
        listed = {
            path: digest
            for digest, _, path in (
                line.partition("  ") for line in in_image.pop("checksums.sha256").decode().splitlines()
            )
            if not digest.startswith("#")
        }
        assert {path: hashlib.sha256(data).hexdigest() for path, data in in_image.items()} == listed
        assert "model-00001-of-00001.safetensors" in listed and "README.md" in listed

        # Registered behind the gate, pinned to the pushed image, with its lineage.
        image = (
            "sha256:" + hashlib.sha256(get(registry, "/v2/models/tiny/manifests/v1", MANIFEST)).hexdigest()
        )
        catalog = ModelRegistry(models.url, author="test", user_token="unused")
        (version,) = list(catalog.get_model_versions("tiny"))
        lineage = version.custom_properties
        artifact = catalog.get_model_artifact("tiny", version.name)
        assert (
            artifact.uri == f"oci://{registry.host}/models/tiny@{image}" and lineage["image_digest"] == image
        )
        evaluation = task.outputs["eval_metrics"].metadata
        assert lineage["tuned_eval_loss"] == pytest.approx(evaluation["tuned_eval_loss"])
        assert lineage["eval_loss_improvement_ci_low"] == pytest.approx(
            evaluation["eval_loss_improvement_ci_low"]
        )
        assert lineage["base_model"] == str(tiny_llama) and lineage["dataset_sha256"]
        assert lineage["kfp_run_name"] == version.name
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

    # The password reached no output: the step logs, KFP's artifacts and outputs, the MLflow server's stores.
    printed = capfd.readouterr()
    outputs = {"step logs": (printed.out + printed.err).encode()}
    for root in (tmp_path / "pipeline_root", tmp_path / "mlflow-server" / "artifacts"):
        outputs |= {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    outputs["mlflow store"] = (tmp_path / "mlflow-server" / "mlflow.db").read_bytes()
    assert "mlflow" in printed.err.lower() or "mlflow" in printed.out.lower()
    assert not [name for name, data in outputs.items() if MLFLOW_PASSWORD.encode() in data]


@pytest.mark.slow
def test_a_model_the_gate_stops_is_kept_and_pushes_and_registers_nothing(
    tiny_llama, tiny_dataset, tmp_path, monkeypatch, capfd
):
    """Through the README's `kfp-finetune run-local`: the tuned model and the reports are kept in --output even
    though the gate stops the export."""
    from kfp_finetune.cli import main

    monkeypatch.chdir(tmp_path)
    with oci_registry(tmp_path / "registry") as registry, ModelRegistryStandin() as models:
        push_image(registry, "base/shell", "1", [{"bin/sh": b"a shell"}])
        puts_before = registry.requests("PUT", ".")
        params = {
            "model_uri": tiny_llama, "data_uri": tiny_dataset["train.jsonl"],
            "export_destination": f"oci://{registry.host}/models/tiny:v1",
            "export_oci_base_image": f"{registry.host}/base/shell:1", "eval_thresholds": "{exact_match: 0.99}",
            "registry_address": models.url, **FAST_TRAINING, "tune_max_steps_per_epoch": 2,
        }  # fmt: skip
        argv = [arg for key, value in params.items() for arg in ("--param", f"{key}={value}")]
        assert main(["run-local", "finetune-pipeline", *argv, "--output", "kept"]) == 0
        assert "quality gate: failed" in capfd.readouterr().out
        assert registry.requests("PUT", ".") == puts_before  # no blob, no manifest
        assert not [r for r in models.requests if r[0] != "GET"], "pre-flight only read the Model Registry"
        assert json.loads(get(registry, "/v2/_catalog"))["repositories"] == ["base/shell"]
    kept = tmp_path / "kept"
    assert (kept / "tuned-model" / "torchtune-finetune" / "merged" / "config.json").is_file()
    assert (kept / "tuned-model" / "torchtune-finetune" / "adapter" / "adapter_config.json").is_file()
    assert {p.name for p in (kept / "reports").iterdir()} == {"train_report.html", "eval_report.html"}
