"""oci:// against a real registry (Debian's docker-registry, tests/support/oci_registry.py), each test behind
htpasswd Basic auth and again behind Bearer tokens from a token server that grants only the scope asked for (as
Docker Hub, GHCR, Quay and Harbor do): a folder published as a KServe ModelCar on a base image, read back with
plain HTTP and tarfile (not the code under test); unchanged layers never uploaded again; credentials from a docker
config only; a ModelCar as a source, ours and another tool's; corrupted blobs caught."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile

import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage import oci, oci_image
from tests.support.oci_registry import Registry, get, oci_registry, push_image, require_registry

require_registry()

USER, PASSWORD = "pusher", "registry-pass-4b1d9e"
BASE = {"bin/sh": b"#!a shell\n", "bin/sleep": b"a sleep\n"}


@pytest.fixture(scope="module", params=["basic", "bearer"])
def registry(request, tmp_path_factory) -> Registry:
    bearer = request.param == "bearer"
    with oci_registry(tmp_path_factory.mktemp("registry"), auth=(USER, PASSWORD), bearer=bearer) as running:
        push_image(running, "base/shell", "1", [BASE], platform_index=True)
        yield running


@pytest.fixture
def logged_in(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.docker_config(tmp_path / "docker")))
    return registry


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "model-00001-of-00002.safetensors").write_bytes(os.urandom(oci_image.LAYER_MIN_BYTES + 7))
    (folder / "model-00002-of-00002.safetensors").write_bytes(os.urandom(2 * oci_image.LAYER_MIN_BYTES))
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "tokenizer" / "tokenizer.json").write_text('{"vocab": {}}')
    return folder


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(registry: Registry, repository: str, reference: str) -> dict:
    return json.loads(get(registry, f"/v2/{repository}/manifests/{reference}", oci_image.MANIFEST_TYPE))


def _image_files(registry: Registry, manifest: dict) -> dict[str, bytes]:
    """Every regular file of the image, each layer applied in order, read with tarfile from the registry."""
    files = {}
    for layer in manifest["layers"]:
        blob = get(registry, f"/v2/models/tiny/blobs/{layer['digest']}")
        assert "sha256:" + _sha(blob) == layer["digest"]
        data = gzip.decompress(blob) if layer["mediaType"].endswith("+gzip") else blob
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive.getmembers():
                if member.isfile():
                    files[member.name] = archive.extractfile(member).read()
    return files


def _uploads(registry: Registry) -> int:
    """Blob uploads finished (the PUT that closes one), from the registry's access log."""
    return len([r for r in registry.requests("PUT", r"/blobs/uploads/.*digest=") if r.endswith(" 201")])


def test_a_folder_becomes_a_modelcar_on_the_base_image(logged_in, model, monkeypatch):
    registry = logged_in
    # Several PATCHes per weight file, each with its Content-Range.
    monkeypatch.setattr(oci, "_UPLOAD_CHUNK", 512 << 10)
    published = storage.publish_directory(
        model, f"oci://{registry.host}/models/tiny:v1", base_image=f"{registry.host}/base/shell:1"
    )
    assert published.state == "created"
    patches = [r for r in registry.requests("PATCH", "/v2/models/tiny/blobs/uploads/") if r.endswith(" 202")]
    # 1 MiB + 7 bytes in 3 chunks, 2 MiB in at least 4, the small files' layer.
    assert len(patches) >= 3 + 4 + 1
    manifest = _manifest(registry, "models/tiny", "v1")
    assert (
        "sha256:" + _sha(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
        == published.commit_sha
    )
    base = _manifest(registry, "base/shell", "1-amd64")  # the index's linux/amd64 image, not its arm64 one
    assert manifest["layers"][: len(base["layers"])] == base["layers"]
    ours = manifest["layers"][len(base["layers"]) :]
    # One layer per large file, then one for the small ones.
    assert [json.loads(layer["annotations"][oci_image.FILES_ANNOTATION])[0][0] for layer in ours] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
    ]  # fmt: skip
    files = _image_files(registry, manifest)
    expected = {
        f"models/{p.relative_to(model).as_posix()}": p.read_bytes() for p in model.rglob("*") if p.is_file()
    }
    assert {k: _sha(v) for k, v in files.items() if k.startswith("models/")} == {
        k: _sha(v) for k, v in expected.items()
    }
    assert files["bin/sh"] == BASE["bin/sh"] and "bin/arm64" not in files
    config = json.loads(get(registry, f"/v2/models/tiny/blobs/{manifest['config']['digest']}"))
    base_config = json.loads(get(registry, f"/v2/base/shell/blobs/{base['config']['digest']}"))
    assert config["config"] == base_config["config"] and config["architecture"] == "amd64"
    assert config["rootfs"]["diff_ids"] == base_config["rootfs"]["diff_ids"] + [
        layer["digest"] for layer in ours
    ]


def _scopes(scopes: list[str]) -> dict[str, set[str]]:
    """`repository:<name>:<actions>` scopes by repository (the registry lists actions in no fixed order)."""
    return {s.split(":")[1]: set(s.split(":")[2].split(",")) for s in scopes}


@pytest.mark.parametrize("registry", ["bearer"], indirect=True)
def test_each_request_gets_a_token_of_its_own_scope(logged_in, model):
    """The tag is read first (a pull token), which the registry refuses a push; the base image's layers are
    mounted from their repository, which needs that repository's pull scope in the same token."""
    registry = logged_in
    storage.publish_directory(
        model, f"oci://{registry.host}/models/scoped:v1", base_image=f"{registry.host}/base/shell:1"
    )
    assert [
        r for r in registry.requests("POST", r"/v2/models/scoped/blobs/uploads/\?.*mount=") if " 201" in r
    ]
    asked = [_scopes(scopes) for user, scopes in registry.token_server.requests if user == USER]
    assert {"models/scoped": {"pull"}} in asked, asked
    assert {"models/scoped": {"pull", "push"}, "base/shell": {"pull"}} in asked, asked


def test_unchanged_layers_are_never_uploaded_again(logged_in, model):
    registry = logged_in
    target = f"oci://{registry.host}/models/tiny:dedupe-1"
    storage.publish_directory(model, target)
    before = _uploads(registry)
    assert storage.publish_directory(model, target).state == "unchanged"
    assert storage.publish_directory(model, f"oci://{registry.host}/models/tiny:dedupe-2").state == "created"
    assert _uploads(registry) == before  # same files, another tag: every blob was there

    (model / "config.json").write_text('{"model_type": "llama", "changed": true}')
    with pytest.raises(storage.DestinationConflict, match="export_overwrite"):
        storage.publish_directory(model, target)
    assert storage.publish_directory(model, target, overwrite=True).state == "replaced"
    assert _uploads(registry) == before + 2  # the small files' layer and the config, not the weights
    listing = storage.list_files(target)
    assert listing.by_path()["config.json"].sha256 == _sha((model / "config.json").read_bytes())


def test_a_modelcar_is_a_model_source(logged_in, model, tmp_path):
    registry = logged_in
    storage.publish_directory(model, f"oci://{registry.host}/models/tiny:source")
    listing = storage.list_files(f"oci://{registry.host}/models/tiny:source")
    assert sorted(f.path for f in listing.files) == sorted(
        p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()
    )
    wanted = ["config.json", "model-00002-of-00002.safetensors", "tokenizer/tokenizer.json"]
    records = storage.download(listing, wanted, tmp_path / "fetched")
    for record in records:
        assert (tmp_path / "fetched" / record.path).read_bytes() == (model / record.path).read_bytes()
    assert not (tmp_path / "fetched" / "model-00001-of-00002.safetensors").exists()


def test_another_tools_modelcar_is_read_whole(logged_in, tmp_path):
    """Gzip layers with no file list, a file replaced by a later layer (the last one wins, as in a container)."""
    registry = logged_in
    first = {"models/config.json": b'{"old": 1}', "models/weights.bin": b"w" * 5000, "etc/hostname": b"x"}
    push_image(registry, "models/tiny", "foreign", [BASE, first, {"models/config.json": b'{"new": 2}'}])
    listing = storage.list_files(f"oci://{registry.host}/models/tiny:foreign")
    assert sorted(f.path for f in listing.files) == ["config.json", "weights.bin"]
    storage.download(listing, ["config.json", "weights.bin"], tmp_path / "fetched")
    assert (tmp_path / "fetched" / "config.json").read_bytes() == b'{"new": 2}'
    assert (tmp_path / "fetched" / "weights.bin").read_bytes() == b"w" * 5000


def test_a_corrupted_blob_is_caught(logged_in, model, tmp_path):
    registry = logged_in
    storage.publish_directory(model, f"oci://{registry.host}/models/tiny:corrupt")
    layer = next(
        d for d in _manifest(registry, "models/tiny", "corrupt")["layers"]
        if d["annotations"].get(oci_image.TITLE_ANNOTATION) == "model-00002-of-00002.safetensors"
    )  # fmt: skip
    blob = registry.blob_file(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[4096] ^= 0xFF  # inside the weights: the tar still reads, the bytes are wrong
    blob.write_bytes(bytes(data))
    listing = storage.list_files(f"oci://{registry.host}/models/tiny:corrupt")
    with pytest.raises(storage.IntegrityError, match="model-00002-of-00002.safetensors|corrupt"):
        storage.download(listing, ["model-00002-of-00002.safetensors"], tmp_path / "fetched")


@pytest.mark.parametrize("credentials", ["none", "wrong"])
def test_missing_or_wrong_credentials_name_the_secret(registry, model, tmp_path, monkeypatch, credentials):
    if credentials == "wrong":
        monkeypatch.setenv("DOCKER_CONFIG", str(registry.docker_config(tmp_path / "docker", USER, "not-it")))
    else:
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-such-folder"))
    target = f"oci://{registry.host}/models/tiny:denied"
    for action in (
        lambda: storage.probe_destination(target),
        lambda: storage.publish_directory(model, target),
        lambda: storage.list_files(f"oci://{registry.host}/base/shell:1"),
    ):
        with pytest.raises(storage.StorageError, match="oci_secret") as raised:
            action()
        assert "not-it" not in str(raised.value) and PASSWORD not in str(raised.value)


def test_probe_leaves_nothing_and_an_unreachable_registry_is_named(logged_in, tmp_path):
    registry = logged_in
    storage.probe_destination(f"oci://{registry.host}/models/probed:v1")
    tags = get(registry, "/v2/_catalog")
    assert b"models/probed" not in tags  # an upload cancelled: no repository, no blob
    with pytest.raises(storage.StorageError, match="cannot reach the registry"):
        storage.probe_destination("oci://127.0.0.1:1/models/tiny:v1")


@pytest.mark.parametrize(
    "uri",
    [
        "oci://registry.example.com",
        "oci://registry.example.com/Upper/Case:v1",
        "oci://user:pass@registry.example.com/models/x:v1",
        "oci://registry.example.com/models/x:v1?token=abc",
        "oci://registry.example.com/models/x:bad tag",
    ],
)
def test_bad_oci_uris_are_refused(uri):
    with pytest.raises(ValueError, match="oci://<registry>/<repository>") as raised:
        storage.parse_uri(uri)
    assert "pass@" not in str(raised.value) and "abc" not in str(raised.value)


def test_oci_uri_and_image_references_parse():
    uri = storage.parse_uri("oci://registry.example.com:5000/team/models/llama:v1.2")
    assert (uri.bucket, uri.repo_id, uri.revision) == (
        "registry.example.com:5000",
        "team/models/llama",
        "v1.2",
    )
    digest = "sha256:" + "a" * 64
    assert storage.parse_uri(f"oci://r.example.com/m@{digest}").revision == digest
    assert storage.parse_uri("oci://r.example.com/m").revision is None
    hub = storage.parse_image("busybox:1.37")
    assert (hub.bucket, hub.repo_id, hub.revision) == ("registry-1.docker.io", "library/busybox", "1.37")
    local = storage.parse_image("localhost:5000/base/shell")
    assert (local.bucket, local.repo_id, local.revision) == ("localhost:5000", "base/shell", "latest")
    with pytest.raises(ValueError, match="export_oci_base_image"):
        storage.parse_image("busybox@")
