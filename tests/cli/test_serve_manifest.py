"""`kfp-finetune serve-manifest` against a real OCI registry (Debian's docker-registry): the InferenceService for
a ModelCar export, pinned to the digest the registry holds, valid against KServe's schema; a path or an adapter
alone is refused in one line."""

from __future__ import annotations

import hashlib
import json

import yaml

from kfp_finetune.cli import main
from kfp_finetune.components._shared import storage
from tests.support.kserve_schema import validator
from tests.support.oci_registry import get, oci_registry, require_registry
from tests.support.sources import write_fake_model

require_registry()


def test_serve_manifest_prints_the_inference_service_of_a_modelcar(tmp_path, capsys):
    model = write_fake_model(tmp_path / "model", family="llama", extra_bin=False)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    with oci_registry(tmp_path / "registry") as registry:
        storage.publish_directory(model, f"oci://{registry.host}/models/tiny_llama:v1")
        storage.publish_directory(adapter, f"oci://{registry.host}/models/tiny-adapter:v1")
        assert (
            main(["serve-manifest", f"oci://{registry.host}/models/tiny_llama:v1", "--namespace", "team"])
            == 0
        )
        printed = yaml.safe_load(capsys.readouterr().out)
        digest = (
            "sha256:"
            + hashlib.sha256(
                get(
                    registry,
                    "/v2/models/tiny_llama/manifests/v1",
                    "application/vnd.oci.image.manifest.v1+json",
                )
            ).hexdigest()
        )
        assert validator().validate(printed) == []
        model_spec = printed["spec"]["predictor"]["model"]
        assert model_spec["storageUri"] == f"oci://{registry.host}/models/tiny_llama@{digest}"
        assert printed["metadata"] == {
            "name": "tiny-llama", "labels": {"app.kubernetes.io/managed-by": "kfp-finetune"}, "namespace": "team",
        }  # fmt: skip
        assert model_spec["resources"]["limits"]["nvidia.com/gpu"] == "1"

        assert main(["serve-manifest", f"oci://{registry.host}/models/tiny-adapter:v1"]) == 1
        assert "export_format=merged or both" in capsys.readouterr().err
    assert main(["serve-manifest", str(model)]) == 1
    assert "KServe cannot read it by URI" in capsys.readouterr().err
    assert json.loads((model / "config.json").read_text())  # the source was only read
