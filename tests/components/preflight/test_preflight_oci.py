"""Pre-flight with oci:// against a real registry behind htpasswd auth (Debian's docker-registry,
tests/support/oci_registry.py): the credentials may push (an upload started and cancelled), the base image is
readable, a ModelCar model is resolved from its config and tokenizer alone; every problem names its parameter and
the Secret, and no credential is echoed."""

from __future__ import annotations

import json

import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage import oci_image
from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight
from tests.support.oci_registry import get, oci_registry, push_image, require_registry

require_registry()

LOCAL = {"tune_backend": "local"}
USER, PASSWORD = "pusher", "preflight-pw-77e1"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    with oci_registry(tmp_path / "registry", auth=(USER, PASSWORD)) as running:
        push_image(running, "base/shell", "1", [{"bin/sh": b"a shell"}])
        monkeypatch.setenv("DOCKER_CONFIG", str(running.docker_config(tmp_path / "docker")))
        yield running


def test_a_pushable_repository_and_a_readable_base_image_pass_leaving_nothing(registry):
    done = run_preflight(
        export_destination=f"oci://{registry.host}/models/tuned:v1",
        export_oci_base_image=f"{registry.host}/base/shell:1", **LOCAL,
    )  # fmt: skip
    assert done == ["export_destination", "export_oci_base_image"]
    assert json.loads(get(registry, "/v2/_catalog"))["repositories"] == ["base/shell"]


def test_problems_name_the_parameter_and_the_secret(registry, tmp_path, monkeypatch):
    with pytest.raises(PreflightError) as raised:
        run_preflight(
            export_destination=f"oci://{registry.host}/models/tuned:v1",
            export_oci_base_image=f"{registry.host}/base/missing:1", **LOCAL,
        )  # fmt: skip
    assert "export_oci_base_image" in str(raised.value) and "not found" in str(raised.value)
    monkeypatch.setenv(
        "DOCKER_CONFIG", str(registry.docker_config(tmp_path / "wrong", USER, "not-the-password"))
    )
    with pytest.raises(PreflightError) as raised:
        run_preflight(export_destination=f"oci://{registry.host}/models/tuned:v1", **LOCAL)
    message = str(raised.value)
    assert "export_destination" in message and "oci_secret" in message
    assert "not-the-password" not in message and PASSWORD not in message


@pytest.mark.slow
def test_a_modelcar_model_is_resolved_from_its_config_and_tokenizer_alone(registry, tiny_llama, monkeypatch):
    monkeypatch.setattr(oci_image, "LAYER_MIN_BYTES", 1)  # the tiny model's weights get layers of their own
    storage.publish_directory(tiny_llama, f"oci://{registry.host}/models/base:v1")
    weights = [r for r in registry.requests("GET", r"/blobs/sha256:") if r.endswith(" 200")]
    assert run_preflight(model_uri=f"oci://{registry.host}/models/base:v1", **LOCAL) == ["model_uri", "model"]
    read = [r for r in registry.requests("GET", r"/blobs/sha256:") if r.endswith(" 200")][len(weights) :]
    layers = json.loads(
        get(registry, "/v2/models/base/manifests/v1", "application/vnd.oci.image.manifest.v1+json")
    )
    weight_layers = {
        layer["digest"] for layer in layers["layers"]
        if layer["annotations"].get("org.opencontainers.image.title", "").endswith(".safetensors")
    }  # fmt: skip
    assert weight_layers and not [r for r in read if any(d in r for d in weight_layers)], read
