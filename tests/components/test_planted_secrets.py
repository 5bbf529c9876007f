"""Planted credentials reach no output (issue 24 item 9). Pre-flight, both initializers and export run as KFP
runs them (kfp.local, each step in its own process) with planted HF_TOKEN / AWS_* values in the environment
(as the Secrets put them there), against the hub stand-in (whose LFS files come through a signed CDN URL, made
to fail once so the retry warning names it) and moto's S3 server behind the fault proxy (SlowDown bursts):
a scan of every output — the step logs, the artifacts and executor outputs KFP keeps, the workspace's manifests,
the exported model card, manifest and metadata at every destination — finds none of them. The export to an OCI
registry (a real one behind htpasswd auth) reads the registry's password from a docker config, as the Secret
named by oci_secret gives it; neither the password nor its base64 `auth` reaches an output or the image. The
registration in the Model Registry (its stand-in, requiring a bearer token) leaves the token in no output and in
nothing the registry stores."""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import base64
import json
import re

import boto3
import pytest
from kfp import dsl, local
from kfp.dsl import Input, Metrics, Model, Output

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.export.component import export
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.preflight.component import preflight
from kfp_finetune.components.register_model.component import register_model
from tests.support.fault_proxy import FaultProxy
from tests.support.hub_standin import HubStandin
from tests.support.model_registry_standin import ModelRegistryStandin
from tests.support.oci_registry import oci_registry, push_image
from tests.support.sources import hub_env, moto_s3

PLANTED = {
    "HF_TOKEN": "hf_plantedTOKEN0123456789abcdef",
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDKEYID0001",
    "AWS_SECRET_ACCESS_KEY": "plantedAWSsecret/0123456789abcdefXYZ",
    "AWS_SESSION_TOKEN": "plantedSESSIONtoken0123456789",
}
# The registry's credentials, as the docker config of the Secret named by oci_secret holds them (the base64 `auth`
# of user:password is scanned for too).
REGISTRY_USER, REGISTRY_PASSWORD = "planted-pusher", "plantedREGISTRYpass0123456789"
# The Model Registry's bearer token (the Secret named by registry_secret).
MODEL_REGISTRY_TOKEN = "plantedMODELREGISTRYtoken0123456789"
REGISTRY_AUTH = base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
# The signature and expiry of the stand-in's signed CDN URLs (tests/support/hub_standin.py).
SIGNED = ("Signature=standin", "Expires=4102444800")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dsl.component(install_kfp_package=False)
def tuned_as_base(workspace_path: str, base_model: Input[Model], model: Output[Model]):
    """Stands in for torchtune-finetune (not under test here): the base model as a full fine-tune's merged output."""
    import os
    import shutil

    source = os.path.join(workspace_path, base_model.metadata["workspace_path"])
    shutil.copytree(source, os.path.join(workspace_path, "runs", "r1", "merged"))
    model.metadata.update(
        merged_path="runs/r1/merged", run_dir="runs/r1", method="full", base_model=base_model.metadata["repo_id"],
        base_model_revision=base_model.metadata["commit_sha"],
    )  # fmt: skip


@dsl.component(install_kfp_package=False)
def passing_metrics(metrics: Output[Metrics]):
    """Stands in for evaluate (not under test here): a gate that passed."""
    metrics.metadata.update(passed=1.0, tuned_eval_loss=1.0, base_eval_loss=2.0)


@dsl.pipeline(name="planted-secrets")
def planted_secrets(
    workspace: str,
    model_uri: str,
    data_uri: str,
    hub_destination: str,
    s3_destination: str,
    s3_endpoint_url: str,
    oci_destination: str,
    oci_base_image: str,
    registry_address: str,
):
    checked = preflight(
        export_destination=s3_destination, model_uri=model_uri, data_uri=data_uri, s3_endpoint_url=s3_endpoint_url,
        tune_backend="local", tune_device="cpu", tune_gpus_per_node=0,
    )  # fmt: skip
    base = model_initialize(source_uri=model_uri, workspace_path=workspace, task_id="model").after(checked)
    data = dataset_initialize(
        source_uri=data_uri, workspace_path=workspace, base_model=base.outputs["model"],
        s3_endpoint_url=s3_endpoint_url, task_id="data",
    )  # fmt: skip
    tuned = tuned_as_base(workspace_path=workspace, base_model=base.outputs["model"])
    for destination, task in ((hub_destination, "hub"), (s3_destination, "s3"), (oci_destination, "oci")):
        exported = export(
            workspace_path=workspace, model=tuned.outputs["model"], destination=destination,
            s3_endpoint_url=s3_endpoint_url, oci_base_image=oci_base_image, task_id=task,
        )  # fmt: skip
    register_model(
        exported=exported.outputs["exported"], metrics=passing_metrics().outputs["metrics"],
        base_model=base.outputs["model"], train_data=data.outputs["train"], address=registry_address,
        run_name="planted", run_id="planted-run",
    )  # fmt: skip


@pytest.fixture
def planted_run(tiny_llama, tiny_dataset, tmp_path, monkeypatch, capfd):
    """The pipeline run once with planted credentials; what it printed and where it wrote."""
    with (
        HubStandin() as hub, moto_s3() as endpoint, FaultProxy(endpoint) as proxy,
        oci_registry(tmp_path / "registry", auth=(REGISTRY_USER, REGISTRY_PASSWORD)) as registry,
        ModelRegistryStandin(token=MODEL_REGISTRY_TOKEN) as models,
    ):  # fmt: skip
        monkeypatch.setenv("MODEL_REGISTRY_TOKEN", MODEL_REGISTRY_TOKEN)
        for key, value in {**hub_env(hub.endpoint, tmp_path), **PLANTED}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("DOCKER_CONFIG", str(registry.docker_config(tmp_path / "docker")))
        push_image(registry, "base/shell", "1", [{"bin/sh": b"a shell"}])
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("KFP_FINETUNE_RETRIES", "3")
        hub.add_token(PLANTED["HF_TOKEN"], "acme")
        hub.add_repo("org/tiny", tiny_llama, gated=True, tokens=(PLANTED["HF_TOKEN"],))
        hub.fail_once(
            "model.safetensors", "500"
        )  # the CDN fails once: the retry warning names its signed URL
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="planted")
        client.upload_file(str(tiny_dataset["train.jsonl"]), "planted", "data/train.jsonl")
        proxy.fail_next(3, method="GET")  # S3 throttles: botocore retries (its own attempts are not logged)
        local.init(
            runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "pipeline_root"),
            workspace_root=str(tmp_path / "kfp-workspace"),
        )  # fmt: skip
        planted_secrets(
            workspace=str(tmp_path / "workspace"), model_uri="hf://org/tiny", data_uri="s3://planted/data/train.jsonl",
            hub_destination="hf://acme/tuned", s3_destination="s3://planted/tuned", s3_endpoint_url=proxy.url,
            oci_destination=f"oci://{registry.host}/acme/tuned:v1", oci_base_image=f"{registry.host}/base/shell:1",
            registry_address=models.url,
        )  # fmt: skip
        exported = {
            f"s3://planted/{o['Key']}": client.get_object(Bucket="planted", Key=o["Key"])["Body"].read()
            for o in client.list_objects_v2(Bucket="planted", Prefix="tuned/")["Contents"]
        }
        exported |= {f"hub {path}": path.read_bytes() for path in hub._storage.rglob("*") if path.is_file()}
        # Every blob and manifest the registry stores: the ModelCar's layers (model card, checksums) and config.
        exported |= {f"registry {path}": path.read_bytes() for path in (tmp_path / "registry" / "data").rglob("*")
                     if path.is_file()}  # fmt: skip
        assert registry.requests("PUT", "/manifests/v1"), "the oci export ran"
        assert [r for r in models.requests if r[0] == "POST"], "the model was registered"
        # What the Model Registry stored (every object as it would answer it).
        exported |= {"model registry": json.dumps([models.registered_models, models.model_versions,
                                                   models.artifacts]).encode()}  # fmt: skip
        requests = list(hub.requests) + list(proxy.requests)
    printed = capfd.readouterr()
    return _ANSI.sub("", printed.out + printed.err), exported, requests


def _leaks(name: str, data: bytes) -> list[str]:
    planted = (*PLANTED.values(), *SIGNED, REGISTRY_PASSWORD, REGISTRY_AUTH, MODEL_REGISTRY_TOKEN)
    return [f"{value[:12]}… in {name}" for value in planted if value.encode() in data]


@pytest.mark.slow
def test_no_planted_credential_or_signed_url_reaches_any_output(planted_run, tmp_path):
    log, exported, requests = planted_run
    # Every path that could echo was taken: the signed CDN URL failed once and was retried, S3 throttled.
    assert any(path.startswith("/cdn-lfs/") and status == 500 for _, path, status in requests)
    assert any(status == 503 for _, _, status in requests)
    assert "/cdn-lfs/" in log and "?<redacted>" in log, "the retry warning named the URL, redacted"
    assert "hf://acme/tuned" in log and "s3://planted/tuned" in log, "both exports ran"
    assert any(name.endswith("README.md") for name in exported) and any(
        name.endswith("checksums.sha256") for name in exported
    )
    outputs = {"step logs": log.encode(), **exported}
    for root in (
        tmp_path / "pipeline_root",
        tmp_path / "workspace",
    ):  # KFP's artifacts and outputs; manifests
        outputs |= {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        outputs |= {f"the name {p}": str(p).encode() for p in root.rglob("*")}
    assert any(json.loads(data).get("source_uri") == "hf://org/tiny" for name, data in outputs.items()
               if name.endswith("manifest.json"))  # fmt: skip
    assert not [leak for name, data in outputs.items() for leak in _leaks(name, data)]
