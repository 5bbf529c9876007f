"""register-model with the real `model-registry` client against a stand-in of the Model Registry REST API
(tests/support/model_registry_standin.py: the published OpenAPI schemas, unknown fields and wrong types refused):
the version carries the lineage and reads back; a retried step writes nothing; a taken version, a failed gate, a
missing token and a bad address are refused before anything is written; pre-flight's probe."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared import model_registry
from kfp_finetune.components._shared.contract import BaseModel, DatasetSplit, EvalMetrics, ExportedModel
from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components.register_model import register as registering
from tests.support.model_registry_standin import ModelRegistryStandin

TOKEN = "registry-token-5f0c"
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def registry(monkeypatch):
    with ModelRegistryStandin(token=TOKEN) as standin:
        monkeypatch.setenv(model_registry.TOKEN_ENV, TOKEN)
        yield standin


def _inputs(manifest_sha256: str = "c" * 64) -> dict:
    exported = ExportedModel(
        destination="oci://registry.example.com/models/tiny-llama:v1", format="merged", dtype="as trained",
        manifest_sha256=manifest_sha256, image_digest=DIGEST, base_model="org/tiny", method="lora",
        files={"model.safetensors": {"size": 10, "sha256": "d" * 64}},
    )  # fmt: skip
    metrics = EvalMetrics(values={
        "passed": 1.0, "tuned_eval_loss": 1.25, "base_eval_loss": 2.5, "eval_loss_improvement": 1.25,
        "eval_loss_improvement_ci_low": 1.0, "eval_loss_improvement_ci_high": 1.5,
    })  # fmt: skip
    base = BaseModel(
        workspace_path="models/tiny", source_uri="hf://org/tiny", commit_sha="0123abcd" * 5,
        files=[{"path": "config.json", "size": 2, "sha256": "e" * 64}],
    )  # fmt: skip
    train = DatasetSplit(
        source_uri="s3://data/train.jsonl", num_rows=120,
        files=[{"path": "train-00000.parquet", "size": 9, "sha256": "f" * 64}],
    )  # fmt: skip
    return {"exported": exported, "metrics": metrics, "base": base, "train": train}


def _register(registry, **kwargs):
    arguments = {**_inputs(), "report_uri": "minio://mlpipeline/run/evaluate/report", "run_id": "run-1",
                 "run_name": "nightly-7", **kwargs}  # fmt: skip
    return registering.register(address=registry.url, **arguments)


def _client(registry):
    from model_registry import ModelRegistry

    return ModelRegistry(registry.url, author="test", user_token=TOKEN)


def _writes(registry) -> list:
    return [r for r in registry.requests if r[0] in ("POST", "PATCH", "PUT")]


def test_the_version_carries_the_lineage_and_reads_back(registry):
    done = _register(registry)
    assert (done.state, done.model_name, done.version) == ("registered", "tiny-llama", "nightly-7")
    client = _client(registry)
    version = client.get_model_version("tiny-llama", "nightly-7")
    held = version.custom_properties
    assert held["kfp_run_id"] == "run-1" and held["base_model"] == "hf://org/tiny"
    assert held["base_model_revision"] == "0123abcd" * 5
    assert (
        held["base_model_files_sha256"] == hashlib.sha256(f"{'e' * 64}  config.json\n".encode()).hexdigest()
    )
    assert held["dataset"] == "s3://data/train.jsonl" and held["dataset_rows"] == 120
    assert held["dataset_sha256"] == hashlib.sha256(f"{'f' * 64}  train-00000.parquet\n".encode()).hexdigest()
    assert held["tuned_eval_loss"] == 1.25 and held["eval_loss_improvement_ci_low"] == 1.0
    assert held["gate_passed"] is True and held["report_uri"] == "minio://mlpipeline/run/evaluate/report"
    artifact = client.get_model_artifact("tiny-llama", "nightly-7")
    assert artifact.uri == f"oci://registry.example.com/models/tiny-llama@{DIGEST}"  # pinned to the bytes
    assert (artifact.model_format_name, artifact.model_format_version) == ("safetensors", "1")


def test_a_retried_step_writes_nothing_and_a_taken_version_is_refused(registry):
    _register(registry)
    writes = len(_writes(registry))
    assert _register(registry).state == "already registered"
    with pytest.raises(SettingError, match="registry_version.*nightly-7.*another model"):
        _register(registry, **{k: v for k, v in _inputs("9" * 64).items()})
    assert len(_writes(registry)) == writes
    second = _register(registry, version="nightly-8")
    assert second.registered_model_id == _register(registry).registered_model_id  # one model, two versions


def test_a_model_that_failed_the_gate_is_never_registered(registry):
    failed = EvalMetrics(values={"passed": 0.0, "tuned_eval_loss": 2.0})
    with pytest.raises(SettingError, match="quality gate did not pass"):
        _register(registry, metrics=failed)
    assert registry.requests == []


def test_a_missing_or_wrong_token_names_the_secret(registry, monkeypatch):
    monkeypatch.delenv(model_registry.TOKEN_ENV)
    with pytest.raises(model_registry.RegistryError, match="registry_secret") as raised:
        _register(registry)
    monkeypatch.setenv(model_registry.TOKEN_ENV, "not-the-token")
    with pytest.raises(model_registry.RegistryError, match="registry_secret") as raised:
        _register(registry)
    assert "not-the-token" not in str(raised.value) and not _writes(registry)


@pytest.mark.parametrize(
    "address", ["registry.example.com", "ftp://r.example.com", "https://u:p@r.example.com", "https://r/api/x"]
)
def test_a_bad_address_is_refused_naming_the_parameter(address):
    with pytest.raises(SettingError, match="registry_address"):
        model_registry.check_address(address)


def test_an_unreachable_registry_is_named():
    with pytest.raises(
        model_registry.RegistryError, match="cannot reach the Model Registry.*registry_address"
    ):
        model_registry.connect("http://127.0.0.1:1", author="test")


def test_preflight_probe_says_whether_the_version_is_free(registry, monkeypatch):
    assert model_registry.probe(registry.url, "tiny-llama", "nightly-7") is None
    _register(registry)
    parameter, problem = model_registry.probe(registry.url, "tiny-llama", "nightly-7")
    assert parameter == "registry_version" and "set registry_version to a new one" in problem
    assert model_registry.probe(registry.url, "tiny-llama", "nightly-8") is None
    monkeypatch.setenv(model_registry.TOKEN_ENV, "not-the-token")
    parameter, problem = model_registry.probe(registry.url, "tiny-llama", "nightly-9")
    assert parameter == "registry_address" and "registry_secret" in problem


def test_the_component_writes_its_output(registry, tmp_path):
    inputs = _inputs()
    artifact = lambda metadata, uri="": SimpleNamespace(metadata=metadata, uri=uri, path="")  # noqa: E731
    output = SimpleNamespace(path=str(tmp_path / "registered"), metadata={}, uri="")
    registering.run_component(
        address=registry.url, exported=artifact(inputs["exported"].to_metadata()),
        metrics=artifact(inputs["metrics"].to_metadata()), base_model=artifact(inputs["base"].to_metadata()),
        train_data=artifact(inputs["train"].to_metadata()), eval_report=artifact({}, "minio://b/report.html"),
        registered=output, model_name="", version="", author="kfp-finetune", description="", run_id="run-9",
        run_name="nightly-9",
    )  # fmt: skip
    assert output.metadata["state"] == "registered" and output.metadata["version"] == "nightly-9"
    assert output.uri.endswith(f"/model_versions/{output.metadata['model_version_id']}")
    assert output.metadata["properties"]["report_uri"] == "minio://b/report.html"
