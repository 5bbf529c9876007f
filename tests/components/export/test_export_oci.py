"""export to oci:// and model-initialize from it, against a real registry (Debian's docker-registry behind htpasswd
auth, tests/support/oci_registry.py): the ModelCar holds exactly the files checksums.sha256 lists, under /models,
on the base image; its digest is in the output's metadata; model-initialize brings the same bytes back."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kfp_finetune.components.export import export
from kfp_finetune.components.export.export import ExportError, export_model
from kfp_finetune.components.model_initialize.initialize import initialize_model
from tests.support.kserve_schema import validator
from tests.support.oci_registry import get, oci_registry, push_image, require_registry
from tests.support.sources import write_fake_model

require_registry()

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    with oci_registry(tmp_path / "registry", auth=("exporter", "pw-9c1e")) as running:
        push_image(running, "base/shell", "1", [{"bin/sh": b"a shell"}])
        monkeypatch.setenv("DOCKER_CONFIG", str(running.docker_config(tmp_path / "docker")))
        yield running


@pytest.fixture
def tuned(tmp_path):
    """A workspace with a merged model, as a full fine-tune leaves it (no run folder needed to export it)."""
    workspace = tmp_path / "workspace"
    write_fake_model(workspace / "runs" / "r1" / "merged", family="llama", shards=2, extra_bin=False)
    metadata = {
        "workspace_path": "runs/r1/merged", "merged_path": "runs/r1/merged", "adapter_path": "", "run_dir": "",
        "base_model": "org/tiny-llama", "base_model_revision": "0123abcd", "method": "full", "final_loss": 1.5,
    }  # fmt: skip
    return SimpleNamespace(workspace=workspace, metadata=metadata)


def _export(tuned, destination: str, **kwargs):
    out = SimpleNamespace(path=str(tuned.workspace.parent / "exported-artifact"), metadata={}, uri="")
    serving = SimpleNamespace(path=str(tuned.workspace.parent / "serving" / "isvc.yaml"), metadata={}, uri="")
    result = export_model(
        workspace=tuned.workspace, model_metadata=tuned.metadata, destination=destination, output=out,
        run_name="nightly", run_id="run-1", serving_output=serving, **kwargs,
    )  # fmt: skip
    out.serving = serving
    return result, out


def test_export_pushes_a_modelcar_that_model_initialize_reads_back(registry, tuned, tmp_path, monkeypatch):
    target = f"oci://{registry.host}/models/tuned:v1"
    result, out = _export(tuned, target, oci_base_image=f"{registry.host}/base/shell:1")
    assert result.state == "created" and out.uri == target
    digest = out.metadata["image_digest"]
    manifest_bytes = get(registry, "/v2/models/tuned/manifests/v1", MANIFEST)
    assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == digest
    # The serving hand-off: an InferenceService for this very image, valid against KServe's schema.
    manifest = yaml.safe_load(Path(out.serving.path).read_text())
    assert validator().validate(manifest) == []
    assert (
        manifest["spec"]["predictor"]["model"]["storageUri"] == f"oci://{registry.host}/models/tuned@{digest}"
    )
    assert out.serving.metadata == {"servable": True, "name": "tuned", "storage_uri": f"oci://{registry.host}/models/tuned@{digest}", "gpus": 1}  # fmt: skip
    in_image = {}
    for layer in json.loads(manifest_bytes)["layers"]:
        blob = get(registry, f"/v2/models/tuned/blobs/{layer['digest']}")
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
            for member in archive.getmembers():
                if member.isfile():
                    in_image[member.name] = hashlib.sha256(archive.extractfile(member).read()).hexdigest()
    assert in_image.pop("bin/sh") == hashlib.sha256(b"a shell").hexdigest()
    checksums = in_image.pop("models/checksums.sha256")
    assert checksums == out.metadata["manifest_sha256"]
    listed = {f"models/{path}": entry["sha256"] for path, entry in out.metadata["files"].items()}
    assert in_image == {k: v for k, v in listed.items() if k != "models/checksums.sha256"}

    # The step retried later: its checksums.sha256 would name another time, so the image keeps the first one's
    # (read back from the image) and nothing is pushed.
    monkeypatch.setattr(
        export, "_identity", lambda *_: "run nightly (id run-1), task export, at 2031-01-01T00:00:00Z"
    )
    again, _ = _export(tuned, target, oci_base_image=f"{registry.host}/base/shell:1")
    assert again.state == "unchanged" and again.uploaded == []

    fetched = initialize_model(target, str(tmp_path / "ws2"), base_model_id="org/tuned")
    assert fetched.manifest["commit_sha"] == digest
    for entry in fetched.manifest["files"]:
        assert entry["sha256"] == out.metadata["files"][entry["path"]]["sha256"]


@pytest.mark.parametrize(
    ("destination", "base", "match"),
    [
        ("oci://r.example.com/models/x@sha256:" + "a" * 64, "busybox:1.37", "an export pushes to a tag"),
        ("oci://r.example.com/models/x:v1", "busybox@", "export_oci_base_image 'busybox@' is not an image"),
    ],
)
def test_bad_oci_requests_are_refused_before_anything_is_pushed(tuned, destination, base, match):
    with pytest.raises(ExportError, match=match):
        _export(tuned, destination, oci_base_image=base)
