"""A real OCI registry on 127.0.0.1: Debian's `docker-registry` package (the CNCF distribution registry, 2.8),
started per test module with a filesystem store, optionally behind htpasswd Basic auth (bcrypt hashes, as the
registry's htpasswd access controller reads them: distribution registry/auth/htpasswd) or Bearer tokens from a
token server (tests/support/oci_token_server.py; distribution registry/auth/token). Ready when /v2/ answers
(polled, not slept on). Its access log is what the tests count requests in.

`push_image` pushes an image with plain HTTP requests as the OCI distribution spec describes them (POST then a
monolithic PUT per blob, then the manifest), independently of the code under test: a gzip-compressed base image
with a platform index (as Docker Hub serves busybox), or another tool's ModelCar whose layers carry no file list.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.oci_token_server import TokenServer, token_server
from tests.support.servers import free_port, running

STARTUP_SECONDS = 60


@dataclass
class Registry:
    host: str  # 127.0.0.1:<port>
    folder: Path
    auth: tuple[str, str] | None
    token_server: TokenServer | None = None

    def log_lines(self) -> list[str]:
        return (self.folder / "registry.log").read_text(errors="replace").splitlines()

    def requests(self, method: str, path_pattern: str) -> list[str]:
        """The access log's requests of `method` whose path matches `path_pattern` (a regex)."""
        found = []
        for line in self.log_lines():
            match = re.search(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d+)', line)
            if match and match[1] == method and re.search(path_pattern, match[2]):
                found.append(f"{match[1]} {match[2]} {match[3]}")
        return found

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.removeprefix("sha256:")
        return self.folder / "data/docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def docker_config(self, folder: Path, user: str | None = None, password: str | None = None) -> Path:
        """A folder holding a docker config.json with these credentials (default: the registry's), as the
        kubernetes.io/dockerconfigjson Secret mounted at DOCKER_CONFIG gives it (key `.dockerconfigjson`)."""
        user, password = (user, password) if user else self.auth
        folder.mkdir(parents=True, exist_ok=True)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        (folder / ".dockerconfigjson").write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        return folder

    def basic(self) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(":".join(self.auth).encode()).decode()}

    def headers(self) -> dict[str, str]:
        if not self.auth or self.token_server:  # a Bearer registry: _request asks for a token when challenged
            return {}
        return self.basic()


def require_registry() -> str:
    path = shutil.which("docker-registry")
    if path is None:
        pytest.skip(  # the test modules call this as they load: without it their whole module is skipped
            "Debian's docker-registry is not installed (.ci/run installs it: apt-get install docker-registry)",
            allow_module_level=True,
        )
    return path


@contextmanager
def oci_registry(
    folder: Path, auth: tuple[str, str] | None = None, bearer: bool = False
) -> Iterator[Registry]:
    """The registry; with `auth`, behind htpasswd Basic auth, or with `bearer` too behind a token server that
    gives those credentials tokens."""
    if bearer:
        with (
            token_server(folder / "token-server", *auth) as tokens,
            _registry(folder, auth, tokens) as registry,
        ):
            yield registry
    else:
        with _registry(folder, auth, None) as registry:
            yield registry


@contextmanager
def _registry(folder: Path, auth: tuple[str, str] | None, tokens: TokenServer | None) -> Iterator[Registry]:
    binary = require_registry()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(folder / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-upload-state-secret"},
    }
    if tokens:
        config["auth"] = tokens.registry_auth()
    elif auth:
        import bcrypt

        hashed = bcrypt.hashpw(auth[1].encode(), bcrypt.gensalt(rounds=4)).decode()
        (folder / "htpasswd").write_text(f"{auth[0]}:{hashed}\n")
        config["auth"] = {"htpasswd": {"realm": "kfp-finetune-tests", "path": str(folder / "htpasswd")}}
    (folder / "config.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
    registry = Registry(f"127.0.0.1:{port}", folder, auth, tokens)

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=2).close()
        except urllib.error.HTTPError as answer:
            return answer.code == 401  # up, and asking for credentials
        return True

    command = [binary, "serve", str(folder / "config.yml")]
    with running(command, folder / "registry.log", answers, "docker-registry", STARTUP_SECONDS):
        yield registry


# --- pushing images independently of the code under test -------------------------------------------------------


def _request(registry: Registry, method: str, url: str, data: bytes = b"", headers: dict | None = None):
    url = url if url.startswith("http") else f"http://{registry.host}{url}"
    try:
        return urllib.request.urlopen(
            _built(method, url, data, {**registry.headers(), **(headers or {})}), timeout=30
        )
    except urllib.error.HTTPError as refused:
        challenge = refused.headers.get("Www-Authenticate", "")
        if refused.code != 401 or not challenge.startswith("Bearer "):
            raise
    # The token flow (distribution docs/spec/auth/token.md): a token for the challenge's scope, then again.
    asked = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    query = urllib.parse.urlencode({k: asked[k] for k in ("service", "scope") if k in asked})
    realm = _built("GET", f"{asked['realm']}?{query}", b"", registry.basic())
    with urllib.request.urlopen(realm, timeout=30) as answer:
        token = json.load(answer)["token"]
    return urllib.request.urlopen(
        _built(method, url, data, {**(headers or {}), "Authorization": f"Bearer {token}"}), timeout=30
    )


def _built(method: str, url: str, data: bytes, headers: dict) -> urllib.request.Request:
    return urllib.request.Request(url, data=data or None, method=method, headers=headers)


def push_blob(registry: Registry, repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _request(registry, "POST", f"/v2/{repository}/blobs/uploads/") as started:
        location = started.headers["Location"]
    separator = "&" if "?" in location else "?"
    _request(registry, "PUT", f"{location}{separator}digest={digest}", data,
             {"Content-Type": "application/octet-stream"}).close()  # fmt: skip
    return digest


def push_manifest(
    registry: Registry, repository: str, reference: str, manifest: dict, media_type: str
) -> str:
    data = json.dumps(manifest).encode()
    _request(
        registry, "PUT", f"/v2/{repository}/manifests/{reference}", data, {"Content-Type": media_type}
    ).close()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def get(registry: Registry, path: str, accept: str = "") -> bytes:
    with _request(registry, "GET", path, headers={"Accept": accept} if accept else {}) as answer:
        return answer.read()


def tar_layer(files: dict[str, bytes], compress: bool) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), mtime=0) if compress else buffer.getvalue()


def _push_manifest_of(
    registry: Registry, repository: str, reference: str, layers: list[dict[str, bytes]], compress: bool,
    config: dict,
) -> tuple[dict, str, int]:  # fmt: skip
    blobs = [tar_layer(files, compress) for files in layers]
    diff_ids = ["sha256:" + hashlib.sha256(gzip.decompress(b) if compress else b).hexdigest() for b in blobs]
    config_data = json.dumps({**config, "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    layer_type = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": push_blob(registry, repository, config_data), "size": len(config_data)},
        "layers": [{"mediaType": layer_type, "digest": push_blob(registry, repository, b), "size": len(b)}
                   for b in blobs],
    }  # fmt: skip
    digest = push_manifest(registry, repository, reference, manifest, MANIFEST_TYPE)
    return manifest, digest, len(json.dumps(manifest).encode())


MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def push_image(
    registry: Registry, repository: str, tag: str, layers: list[dict[str, bytes]], *, compress: bool = True,
    config: dict | None = None, platform_index: bool = False,
) -> dict:  # fmt: skip
    """Push an image of these layers (each a {path in the image: bytes}); returns its manifest. With
    `platform_index`, the tag names an index listing an arm64 image first (other bytes) and then this one as
    linux/amd64, as Docker Hub serves busybox."""
    config = {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]}, **(config or {})}
    if not platform_index:
        return _push_manifest_of(registry, repository, tag, layers, compress, config)[0]
    arm = [{**layers[0], "bin/arm64": b"an arm64 build"}, *layers[1:]]
    _, arm_digest, arm_size = _push_manifest_of(
        registry, repository, f"{tag}-arm64", arm, compress, {**config, "architecture": "arm64"}
    )
    manifest, digest, size = _push_manifest_of(registry, repository, f"{tag}-amd64", layers, compress, config)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": MANIFEST_TYPE, "digest": arm_digest, "size": arm_size,
             "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": MANIFEST_TYPE, "digest": digest, "size": size,
             "platform": {"architecture": "amd64", "os": "linux"}},
        ],
    }  # fmt: skip
    push_manifest(registry, repository, tag, index, "application/vnd.oci.image.index.v1+json")
    return manifest
