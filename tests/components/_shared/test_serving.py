"""The serving hand-off (_shared/serving.py): the InferenceService is valid against KServe's schema
(tests/support/kserve_schema.py, the API server's structural rules), pinned to the exported bytes, sized from the
weights, and refused where an export cannot be served as it is."""

from __future__ import annotations

import pytest

from kfp_finetune.components._shared import serving
from kfp_finetune.components._shared.engines import CLASSIFICATION
from tests.support.kserve_schema import validator

GIB = 1 << 30
DIGEST = "sha256:" + "a" * 64


def _model(manifest: dict) -> dict:
    return manifest["spec"]["predictor"]["model"]


@pytest.mark.parametrize(
    ("weights", "gpus"), [(1, 1), (16 * GIB, 1), (48 * GIB, 1), (49 * GIB, 2), (140 * GIB, 4), (200 * GIB, 8)]
)
def test_gpus_and_memory_follow_the_weights(weights, gpus):
    manifest = serving.inference_service("m", f"oci://r.example.com/m@{DIGEST}", weights)
    assert validator().validate(manifest) == []
    resources = _model(manifest)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == str(gpus) and resources["requests"] == resources["limits"]
    assert resources["limits"]["memory"] == f"{-(-weights // GIB) + serving.HOST_OVERHEAD_GIB}Gi"
    assert (f"--tensor-parallel-size={gpus}" in _model(manifest)["args"]) == (gpus > 1)


def test_the_schema_refuses_what_kserve_does_not_know():
    manifest = serving.inference_service("m", "s3://bucket/m", GIB, namespace="team")
    assert validator().validate(manifest) == [] and manifest["metadata"]["namespace"] == "team"
    _model(manifest)["storageURI"] = _model(manifest).pop("storageUri")
    assert validator().validate(manifest), "a misspelt field is refused"


def test_a_classifier_is_served_by_transformers_and_text_by_vllm():
    assert "--backend=vllm" in _model(serving.inference_service("m", "s3://b/m", GIB))["args"]
    args = _model(serving.inference_service("m", "s3://b/m", GIB, task=CLASSIFICATION))["args"]
    assert "--backend=huggingface" in args and "--task=sequence_classification" in args


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Llama-3.1_8B@v1", "llama-3-1-8b-v1"),
        ("8b-model", "model-8b-model"),
        ("a" * 80, "a" * serving.NAME_LIMIT),
    ],
)
def test_names_are_dns_labels_kserve_accepts(text, name):
    assert serving.service_name(text) == name


def test_the_uri_is_pinned_to_the_exported_bytes():
    assert (
        serving.storage_uri("oci://r.example.com/team/m:v1", DIGEST) == f"oci://r.example.com/team/m@{DIGEST}"
    )
    assert serving.storage_uri("hf://org/m@main", "c0ffee") == "hf://org/m@c0ffee"
    assert serving.storage_uri("s3://bucket/models/m") == "s3://bucket/models/m"


def test_a_path_or_an_adapter_alone_is_not_servable():
    with pytest.raises(serving.NotServable, match="s3://, hf:// or oci://"):
        serving.storage_uri("/mnt/models/m")
    with pytest.raises(serving.NotServable, match="export_format=merged or both"):
        serving.inference_service("m", "s3://b/m", GIB, adapter_only=True)
    with pytest.raises(serving.NotServable, match="no safetensors weights"):
        serving.inference_service("m", "s3://b/m", 0)
