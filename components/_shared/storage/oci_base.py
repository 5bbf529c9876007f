"""The ModelCar's base image (oci.py): its layers are copied into the export's repository once — mounted from
its repository where it lives at the same registry, else streamed through — and its config carries the image's
platform, environment and entrypoint. A base image is named as docker does: `busybox:1.37` is Docker Hub's
`library/busybox`."""

from __future__ import annotations

import json

from kfp_finetune.components._shared.logs import get_logger

from . import oci
from .errors import StorageError
from .retry import with_retries
from .uri import StorageUri

log = get_logger(__name__)

_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


def parse_image(image: str) -> StorageUri:
    """An image reference (`[registry/]repository[:tag|@digest]`) as an oci:// URI; Docker Hub when the first
    part names no host."""
    name, at, digest = image.strip().partition("@")
    first, slash, rest = name.partition("/")
    host_named = slash and ("." in first or ":" in first or first == "localhost")
    host, path = (first, rest) if host_named else ("registry-1.docker.io", name)
    if host in _DOCKER_HUB:
        host = "registry-1.docker.io"
        path = path if "/" in path else f"library/{path}"
    repository, colon, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    if not repository or (at and not digest):
        raise ValueError(f"export_oci_base_image {image!r} is not an image reference, e.g. busybox:1.37")
    reference = digest if at else (tag or "latest")
    return StorageUri("oci", f"oci://{host}/{repository}:{reference}", bucket=host, repo_id=repository,
                      revision=reference)  # fmt: skip


def read_base(image: str) -> tuple[oci.Repository, dict, dict]:
    """The base image's repository, manifest and config (its digest checked)."""
    uri = parse_image(image)
    base = oci.open_repository(uri)
    try:
        manifest, _, _ = oci.get_manifest(base, uri.revision)
        config = json.loads(oci.read_blob(base, manifest["config"]["digest"]))
    except StorageError:
        raise
    except Exception as exc:
        raise (oci.error(exc, uri, "read the base image") or exc) from exc
    return base, manifest, config


def check_base_image(image: str) -> None:
    """Pre-flight: raise ValueError / StorageError unless `image` can be read."""
    read_base(image)


def copy_base(dest: oci.Repository, image: str) -> tuple[dict | None, list[dict]]:
    """The base image's config and layer descriptors, its layers made present in `dest`'s repository; (None, [])
    without a base image."""
    if not image:
        return None, []
    base, manifest, config = read_base(image)
    uri = base.uri
    layers = list(manifest.get("layers") or [])
    same_registry = uri.bucket == dest.uri.bucket
    for layer in layers:
        digest = layer["digest"]
        if oci.blob_exists(dest, digest):
            continue
        if same_registry and _mounted(dest, uri.repo_id, digest):
            continue
        log.info("%s: copying base layer %s from %s", dest.uri.shown, digest[:19], uri.shown)
        oci.upload_blob(dest, digest, lambda digest=digest: oci.blob_chunks(base, digest))
    return config, layers


def _mounted(dest: oci.Repository, repository: str, digest: str) -> bool:
    """A cross-repository mount (the registry links the blob; 202 means it declined and opened an upload)."""
    response = with_retries(
        lambda: dest.request(
            "POST", f"{dest.prefix}/blobs/uploads/?mount={digest}&from={repository}", ok=(201, 202),
            headers={"Content-Length": "0"},
        ),
        what=f"mount {digest[:19]} into {dest.uri.shown}",
    )  # fmt: skip
    return response.status_code == 201
