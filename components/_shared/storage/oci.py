"""oci:// — a KServe ModelCar in an OCI registry (the CNCF distribution API): an export destination and a model
source. `oci://<registry>/<repository>[:<tag>]` (tag `latest` when none; a source may also be `@sha256:<digest>`).

The image's layout is oci_image.py's. Requests go through oras-py's registry client (its auth: a docker config's
credentials, Basic or Bearer-token registries, anonymous tokens); the blobs themselves are streamed here, in
chunks, because oras-py reads a whole blob into memory or wants it as a file (a tar of a weight file would be a
second copy of it on disk). Credentials come from a docker config (`$DOCKER_CONFIG/config.json`, or the
`.dockerconfigjson` key of a kubernetes.io/dockerconfigjson Secret mounted at `$DOCKER_CONFIG`), never from the URI.
A registry on the loopback address is spoken to over http, as docker does; every other one over https.

Publishing (publish.py) sees one tag as a folder it owns: `existing` lists the files the tagged image holds (from
its layers' annotations); `put` builds the whole image again from the staged folder, uploads only the blobs the
repository lacks, moves the tag in one manifest PUT (atomic), then pulls the manifest and every uploaded blob back
and checks their digests and each file's sha256 against the export's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.logs import get_logger

from . import oci_image
from .errors import IntegrityError, StorageError
from .listing import FileRecord, Listing, RemoteFile
from .names import write_target
from .parallel import run_parallel
from .progress import Progress
from .retry import status_code, with_retries
from .uri import StorageUri

log = get_logger(__name__)

COUNTS_FILES_ON_DISK = False
WRITABLE = True
ATOMIC_CHANGES = True  # one manifest PUT moves the tag
OWNS_DESTINATION = True  # a tag is one image: every file in it is the export's
_UPLOAD_CHUNK = 64 << 20
_ACCEPT = ", ".join((*oci_image.MANIFEST_TYPES, *oci_image.INDEX_TYPES))
_CREDENTIALS_FIX = (
    "give the step a docker config with credentials for it: a kubernetes.io/dockerconfigjson Secret named by "
    "oci_secret (mounted at $DOCKER_CONFIG)"
)


def _loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _docker_config() -> list[str]:
    folder = os.environ.get("DOCKER_CONFIG", "")
    found = [os.path.join(folder, n) for n in ("config.json", ".dockerconfigjson") if folder]
    return [p for p in found if os.path.isfile(p)]


def _registry_class():
    import oras.provider

    class Registry(oras.provider.Registry):
        """oras-py's client with its own request step: oras-py retries any error five times, up to 83 s apart
        (with_retries retries transient errors only), and answers a 401 by presenting the token it already holds
        again. A Bearer token is scoped to the repositories and actions it was asked for, so one that read a
        repository is refused a push (401 insufficient_scope: distribution registry/auth/token/
        accesscontroller.go); here a refused request gets a token for its own challenge's scope, once. A
        refusal that remains (the token server refused the credentials) is returned as the registry's answer."""

        def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
            def send(auth: dict) -> Any:
                return self.session.request(
                    method, url, data=data, json=json, headers={**(headers or {}), **auth}, stream=stream,
                    verify=self._tls_verify,
                )  # fmt: skip

            response = send(self.auth.get_auth_header() if getattr(self.auth, "token", None) else {})
            if response.status_code not in (401, 403):
                return response
            renewed, changed = self.auth.authenticate_request(response, {}, refresh=True)
            return send(renewed) if changed else response

    return Registry


@dataclass
class Repository:
    """A repository at a registry, with a client that holds its credentials."""

    uri: StorageUri
    client: object = field(repr=False)
    basic: dict[str, str] = field(
        default_factory=dict, repr=False
    )  # a Basic registry's header, sent up front

    @property
    def prefix(self) -> str:
        return f"{self.client.prefix}://{self.uri.bucket}/v2/{self.uri.repo_id}"

    def request(self, method: str, url: str, *, ok: tuple[int, ...], **kwargs):
        """One request; a status outside `ok` raises requests' HTTPError (retry.py tells transient ones)."""
        import requests

        if self.basic:  # else each request is sent twice, once to be answered 401
            kwargs["headers"] = {**self.basic, **(kwargs.get("headers") or {})}
        response = self.client.do_request(url, method, **kwargs)
        if response.status_code not in ok:
            raise requests.HTTPError(
                f"{method} {url.split('?')[0]}: HTTP {response.status_code}", response=response
            )
        return response


def open_repository(uri: StorageUri) -> Repository:
    """A client for the repository, authenticated as its registry asks (Basic or a Bearer token)."""
    import requests

    plain = _loopback(uri.bucket)
    scheme = "http" if plain else "https"
    try:
        ping = requests.get(f"{scheme}://{uri.bucket}/v2/", timeout=30)
    except requests.RequestException as exc:
        raise StorageError(f"cannot reach the registry of {uri.shown}: {type(exc).__name__}: {exc}") from exc
    challenge = ping.headers.get("Www-Authenticate", "")
    backend = "basic" if challenge.lower().startswith("basic") else "token"
    client = _registry_class()(hostname=uri.bucket, insecure=plain, auth_backend=backend)
    container = client.get_container(f"{uri.bucket}/{uri.repo_id}:{_tag_or_latest(uri)}")
    configs = _docker_config()
    client.auth.load_configs(container, configs=configs)
    if backend != "basic":
        return Repository(uri, client)
    if getattr(client.auth, "_basic_auth", None) is None:
        client.auth._basic_auth = ""  # anonymous: the registry answers 401, mapped below
    return Repository(uri, client, client.auth.get_auth_header() if client.auth._basic_auth else {})


def _tag_or_latest(uri: StorageUri) -> str:
    return uri.revision or "latest"


def error(exc: BaseException, uri: StorageUri, what: str) -> StorageError | None:
    """The registry's answer as a message naming the image and the fix."""
    import requests

    code = status_code(exc)
    if code in (401, 403):
        return StorageError(f"the registry refused to {what} {uri.shown} (HTTP {code}): {_CREDENTIALS_FIX}.")
    if code == 404:
        return StorageError(f"{uri.shown}: not found at the registry (no such repository, tag or blob).")
    if code is not None:
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            errors = exc.response.json().get("errors") or []
            detail = "; ".join(str(e.get("message") or e.get("code")) for e in errors)
        return StorageError(
            f"the registry answered HTTP {code} to {what} {uri.shown}{': ' + detail if detail else ''}."
        )
    if isinstance(exc, requests.RequestException):
        return StorageError(f"cannot {what} {uri.shown}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return None


@contextlib.contextmanager
def _mapped(uri: StorageUri, what: str) -> Iterator[None]:
    import requests

    try:
        yield
    except requests.RequestException as exc:
        raise (error(exc, uri, what) or exc) from exc


# --- reading ----------------------------------------------------------------------------------------------------


def get_manifest(repo: Repository, reference: str) -> tuple[dict, bytes, str]:
    """The image manifest for `reference` (a platform index resolved to its linux/amd64 image), its bytes and
    its media type."""
    response = with_retries(
        lambda: repo.request(
            "GET", f"{repo.prefix}/manifests/{reference}", ok=(200,), headers={"Accept": _ACCEPT}
        ),
        what=f"read the manifest of {repo.uri.shown}",
    )
    manifest = response.json()
    kind = manifest.get("mediaType") or response.headers.get("Content-Type", "")
    if kind in oci_image.INDEX_TYPES:
        chosen = _linux_amd64(manifest.get("manifests") or [])
        if chosen is None:
            raise StorageError(f"{repo.uri.shown}: the image index has no linux/amd64 image.")
        return get_manifest(repo, chosen["digest"])
    digest = oci_image.sha256_digest(response.content)
    if reference.startswith("sha256:") and digest != reference:
        raise IntegrityError(f"{repo.uri.shown}: the manifest's bytes hash to {digest}, not {reference}.")
    return manifest, response.content, kind


def _linux_amd64(entries: list[dict]) -> dict | None:
    for entry in entries:
        platform = entry.get("platform") or {}
        if platform.get("os") == "linux" and platform.get("architecture") == "amd64":
            return entry
    return None


def blob_chunks(repo: Repository, digest: str) -> Iterator[bytes]:
    response = repo.request("GET", f"{repo.prefix}/blobs/{digest}", ok=(200,), stream=True)
    with contextlib.closing(response):
        yield from response.iter_content(8 << 20)


def read_blob(repo: Repository, digest: str) -> bytes:
    data = with_retries(
        lambda: b"".join(blob_chunks(repo, digest)), what=f"read {digest} of {repo.uri.shown}"
    )
    if oci_image.sha256_digest(data) != digest:
        raise IntegrityError(
            f"{repo.uri.shown}: blob {digest} is corrupt (its bytes hash to another digest)."
        )
    return data


def _model_files(repo: Repository, manifest: dict) -> dict[str, RemoteFile]:
    """The files under /models, the last layer's copy winning as in a container's filesystem. Our layers say
    what they hold; another tool's are read through once for their file names."""
    files: dict[str, RemoteFile] = {}
    for descriptor in manifest.get("layers") or []:
        digest = descriptor["digest"]
        listed = oci_image.files_of(descriptor)
        if listed is None:
            listed = [
                oci_image.LayerFile(path, size, "")
                for path, size, _ in oci_image.model_files_in(oci_image.BlobStream(blob_chunks(repo, digest)))
                if size >= 0
            ]
        for f in listed:
            files[f.path] = RemoteFile(
                f.path,
                f.size,
                source_path=f"{digest}:{f.path}",
                sha256=f.sha256 or None,
                stated={"layer": digest},
            )
    return files


def list_files(uri: StorageUri, *, repo_type: str, endpoint_url: str | None) -> Listing:
    repo = open_repository(uri)
    with _mapped(uri, "read"):
        manifest, raw, _ = get_manifest(repo, _tag_or_latest(uri))
        files = _model_files(repo, manifest)
    if not files:
        raise StorageError(
            f"{uri.shown} holds no files under /{oci_image.MODELS_DIR}: it is not a ModelCar image."
        )
    return Listing(uri, sorted(files.values(), key=lambda f: f.path), commit_sha=oci_image.sha256_digest(raw))


def fetch(listing: Listing, paths: list[str], dest: Path, *, max_workers: int, progress: Progress) -> None:
    """Each layer holding a wanted file is streamed once; its digest is checked as it ends."""
    uri, remote = listing.uri, listing.by_path()
    targets = {p: write_target(dest, p, key=p, source=uri.shown) for p in paths}
    wanted: dict[str, set[str]] = {}
    for p in paths:
        wanted.setdefault(remote[p].stated["layer"], set()).add(p)
    repo = open_repository(uri)

    def read_layer(digest: str) -> None:
        def attempt() -> None:
            blob = oci_image.BlobStream(blob_chunks(repo, digest))
            for path, _size, handle in oci_image.model_files_in(blob):
                if path in wanted[digest] and handle is not None:
                    with open(targets[path], "wb") as target:
                        shutil.copyfileobj(handle, target, 8 << 20)
                    progress.file_done(remote[path].size or 0)
            if blob.digest_name != digest:
                raise IntegrityError(
                    f"{uri.shown}: layer {digest} is corrupt (its bytes hash to another digest)."
                )

        with_retries(attempt, what=f"download {uri.shown} layer {digest[:19]}")

    with _mapped(uri, "read"):
        run_parallel(read_layer, sorted(wanted), max_workers)


# --- publishing -------------------------------------------------------------------------------------------------


@dataclass
class Destination:
    uri: StorageUri
    repo: Repository
    base_image: str = ""
    listed: dict[str, RemoteFile] = field(default_factory=dict)
    head: str | None = None  # the pushed manifest's digest


def is_root(uri: StorageUri) -> bool:
    return False  # a repository is never a whole registry (uri.py requires one)


def require_credentials(uri: StorageUri) -> None:
    """Registries may take anonymous pushes: the registry says (probe, put) whether it does."""


def destination(
    uri: StorageUri, *, endpoint_url: str | None, private: bool, base_image: str = "", commit_message: str
) -> Destination:
    return Destination(uri, open_repository(uri), base_image=base_image)


def existing(dest: Destination) -> list[RemoteFile]:
    """The files the tag's image holds (our layers), or none when the tag does not exist yet."""
    with _mapped(dest.uri, "read"):
        try:
            manifest, raw, _ = get_manifest(dest.repo, _tag_or_latest(dest.uri))
        except Exception as exc:
            if status_code(exc) != 404:
                raise
            dest.listed = {}
            return []
        dest.head = oci_image.sha256_digest(raw)
        dest.listed = {
            f.path: RemoteFile(f.path, f.size, sha256=f.sha256, stated={"layer": d["digest"]})
            for d in manifest.get("layers") or []
            for f in oci_image.files_of(d) or []
        }
    return list(dest.listed.values())


def read_text(dest: Destination, rel: str) -> str:
    """A file of the tagged image (the earlier export's manifest), from the layer that holds it."""
    digest = dest.listed[rel].stated["layer"]

    def read() -> str:
        for path, _size, handle in oci_image.model_files_in(
            oci_image.BlobStream(blob_chunks(dest.repo, digest))
        ):
            if path == rel and handle is not None:
                return handle.read().decode("utf-8", errors="replace")
        return ""

    with _mapped(dest.uri, "read"):
        return with_retries(read, what=f"read {rel} of {dest.uri.shown}")


def probe(uri: StorageUri, *, endpoint_url: str | None) -> None:
    """The credentials may push to the repository: an upload is started and cancelled (nothing is stored)."""
    repo = open_repository(uri)
    with _mapped(uri, "push to"):
        started = with_retries(
            lambda: repo.request(
                "POST", f"{repo.prefix}/blobs/uploads/", ok=(202,), headers={"Content-Length": "0"}
            ),
            what=f"start an upload to {uri.shown}",
        )
        location = _absolute(repo, started.headers.get("Location", ""))
        with contextlib.suppress(Exception):  # an upload nobody finishes expires at the registry anyway
            repo.request("DELETE", location, ok=(204, 404))


def _absolute(repo: Repository, location: str) -> str:
    return location if location.startswith("http") else f"{repo.client.prefix}://{repo.uri.bucket}{location}"


def blob_exists(repo: Repository, digest: str) -> bool:
    response = with_retries(
        lambda: repo.request("HEAD", f"{repo.prefix}/blobs/{digest}", ok=(200, 404)),
        what=f"look for {digest}",
    )
    return response.status_code == 200


def upload_blob(repo: Repository, digest: str, chunks: Callable[[], Iterator[bytes]]) -> None:
    """Upload one blob in chunks (POST, PATCH with Content-Range, PUT with its digest); the whole upload starts
    again on a transient error."""

    def attempt() -> None:
        started = repo.request(
            "POST", f"{repo.prefix}/blobs/uploads/", ok=(202,), headers={"Content-Length": "0"}
        )
        location, offset, pending = _absolute(repo, started.headers["Location"]), 0, bytearray()

        def send(data: bytes) -> str:
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Range": f"{offset}-{offset + len(data) - 1}",
                "Content-Length": str(len(data)),
            }
            response = repo.request("PATCH", location, ok=(202,), data=bytes(data), headers=headers)
            return _absolute(repo, response.headers["Location"])

        for chunk in chunks():
            pending += chunk
            while len(pending) >= _UPLOAD_CHUNK:
                location = send(pending[:_UPLOAD_CHUNK])
                offset += _UPLOAD_CHUNK
                del pending[:_UPLOAD_CHUNK]
        if pending:
            location = send(pending)
        separator = "&" if "?" in location else "?"
        repo.request(
            "PUT", f"{location}{separator}digest={digest}", ok=(201,), headers={"Content-Length": "0"}
        )

    with_retries(attempt, what=f"upload {digest[:19]} to {repo.uri.shown}")


def put(
    dest: Destination, src: Path, records: list[FileRecord], remove: list[str], *, max_workers: int,
    progress: Progress,
) -> None:  # fmt: skip
    """Push the image of `src` to the tag: unchanged files keep their layers (the blobs are there), new layers
    are measured, and uploaded where the repository lacks them; then the manifest, then the check."""
    from . import oci_base

    sha = {r.path: r.sha256 for r in records} | {
        p: f.sha256 for p, f in dest.listed.items() if p not in {r.path for r in records} and f.sha256
    }
    files = [
        oci_image.LayerFile(
            p.relative_to(src).as_posix(), p.stat().st_size, sha[p.relative_to(src).as_posix()]
        )
        for p in sorted(src.rglob("*"))
        if p.is_file()
    ]
    layers = oci_image.plan_layers(files)
    asked = {r.path for r in records}  # what publish counts as uploaded
    with _mapped(dest.uri, "push to"):
        base_config, base_layers = oci_base.copy_base(dest.repo, dest.base_image)
        run_parallel(lambda layer: oci_image.measure(src, layer), layers, max_workers)
        uploaded = []

        def push(layer: oci_image.Layer) -> None:
            if not blob_exists(dest.repo, layer.digest):
                upload_blob(dest.repo, layer.digest, lambda: oci_image.layer_chunks(src, layer))
                uploaded.append(layer)
            else:
                log.info("%s: %s is already there (%s)", dest.uri.shown, layer.digest[:19], _shown(layer))
            for f in layer.files:
                if f.path in asked:
                    progress.file_done(f.size)

        run_parallel(push, layers, max_workers)
        config = oci_image.config_json(base_config, layers)
        config_digest = oci_image.sha256_digest(config)
        if not blob_exists(dest.repo, config_digest):
            upload_blob(dest.repo, config_digest, lambda: iter([config]))
        manifest = oci_image.manifest_json(config, base_layers, layers)
        tag = _tag_or_latest(dest.uri)
        with_retries(
            lambda: dest.repo.request(
                "PUT", f"{dest.repo.prefix}/manifests/{tag}", ok=(201,), data=manifest,
                headers={"Content-Type": oci_image.MANIFEST_TYPE},
            ),
            what=f"push the manifest of {dest.uri.shown}",
        )  # fmt: skip
        dest.head = oci_image.sha256_digest(manifest)
        log.info(
            "%s: pushed %s (%d layers, %d uploaded)", dest.uri.shown, dest.head, len(layers), len(uploaded)
        )
        _check_pushed(dest, manifest, uploaded)


def _shown(layer: oci_image.Layer) -> str:
    first = layer.files[0].path
    return first if len(layer.files) == 1 else f"{first} and {len(layer.files) - 1} more small files"


def _check_pushed(dest: Destination, manifest: bytes, uploaded: list[oci_image.Layer]) -> None:
    """Pull the tag's manifest back (it must be the one pushed) and every uploaded layer: each blob's digest, and
    each file's size and sha256 inside it, must be the export's."""
    import hashlib

    _, raw, _ = get_manifest(dest.repo, _tag_or_latest(dest.uri))
    if raw != manifest:
        raise StorageError(
            f"verification failed: {dest.uri.shown} names another manifest than the one pushed."
        )
    for layer in uploaded:
        expected = {f.path: f for f in layer.files}
        seen, blob = {}, oci_image.BlobStream(blob_chunks(dest.repo, layer.digest))
        for path, size, handle in oci_image.model_files_in(blob):
            digest = hashlib.sha256()
            while handle is not None and (chunk := handle.read(8 << 20)):
                digest.update(chunk)
            seen[path] = oci_image.LayerFile(path, size, digest.hexdigest())
        if blob.digest_name != layer.digest or seen != expected:
            raise StorageError(
                f"verification failed: layer {layer.digest} of {dest.uri.shown} ({_shown(layer)}) does not hold "
                "the export's bytes when read back."
            )
    log.info("verified %s: manifest and %d uploaded layers read back", dest.uri.shown, len(uploaded))
