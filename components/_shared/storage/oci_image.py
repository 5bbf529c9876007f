"""A model folder as a KServe ModelCar image, and back: the layers, config and manifest (OCI image spec v1.1), with
no registry in sight (oci.py moves them).

KServe's ModelCar is an OCI image whose `/models` folder holds the model; KServe runs it as a sidecar that
shares `/models` with the server (`sh -c "ln -s /proc/$$/root/models /mnt/ && sleep infinity"` in KServe's
storage-initializer injector), so the image needs a shell: a base image's layers come first.

Each file of at least LAYER_MIN_BYTES has a layer of its own; the smaller ones (config, tokenizer, card,
checksums) share one. A layer is an uncompressed tar (weights do not compress) written the same way every time
(fixed owner, mode and time, PAX headers), so one file always gives one digest: a weight file that did not change
is a blob the registry already holds, and is never uploaded again. Each of our layers names its files in the
FILES_ANNOTATION (path, size, sha256), so a reader lists an image without reading its blobs.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MODELS_DIR = "models"
LAYER_MIN_BYTES = 1 << 20
FILES_ANNOTATION = "dev.kfp-finetune.files"
TITLE_ANNOTATION = "org.opencontainers.image.title"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (MANIFEST_TYPE, "application/vnd.docker.distribution.manifest.v2+json")
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_BLOCK = 512
_CHUNK = 8 << 20


@dataclass(frozen=True)
class LayerFile:
    path: str  # relative to the model folder (under /models in the image)
    size: int
    sha256: str

    def as_list(self) -> list:
        return [self.path, self.size, self.sha256]


@dataclass
class Layer:
    """One of our layers: its files, and once measured, its descriptor (digest and size of the tar)."""

    files: list[LayerFile]
    digest: str = ""
    size: int = 0

    def descriptor(self) -> dict:
        annotations = {FILES_ANNOTATION: json.dumps([f.as_list() for f in self.files], separators=(",", ":"))}
        if len(self.files) == 1:
            annotations[TITLE_ANNOTATION] = self.files[0].path
        return {"mediaType": LAYER_TYPE, "digest": self.digest, "size": self.size, "annotations": annotations}


def plan_layers(files: list[LayerFile]) -> list[Layer]:
    """A layer per large file (by path), then one for all the small ones."""
    large = sorted((f for f in files if f.size >= LAYER_MIN_BYTES), key=lambda f: f.path)
    small = sorted((f for f in files if f.size < LAYER_MIN_BYTES), key=lambda f: f.path)
    return [Layer([f]) for f in large] + ([Layer(small)] if small else [])


def files_of(descriptor: dict) -> list[LayerFile] | None:
    """The files one of our layers holds, from its annotation; None for a layer we did not write."""
    listed = (descriptor.get("annotations") or {}).get(FILES_ANNOTATION)
    if listed is None:
        return None
    try:
        return [LayerFile(str(p), int(s), str(h)) for p, s, h in json.loads(listed)]
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"layer {descriptor.get('digest')}: unreadable {FILES_ANNOTATION} annotation"
        ) from exc


def _header(name: str, size: int, folder: bool) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if folder else (tarfile.REGTYPE, 0o644)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _folders(files: list[LayerFile]) -> list[str]:
    names = {MODELS_DIR}
    for f in files:
        parts = f.path.split("/")[:-1]
        names |= {"/".join([MODELS_DIR, *parts[: i + 1]]) for i in range(len(parts))}
    return sorted(names)


def layer_chunks(src: Path, layer: Layer) -> Iterator[bytes]:
    """The layer's tar, in chunks: its folders, then each file's header, bytes and padding, then the end."""
    yield b"".join(_header(name + "/", 0, folder=True) for name in _folders(layer.files))
    for f in layer.files:
        yield _header(f"{MODELS_DIR}/{f.path}", f.size, folder=False)
        sent = 0
        with open(src / f.path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                sent += len(chunk)
                yield chunk
        if sent != f.size:
            raise ValueError(f"{f.path} changed while it was packed ({sent} bytes, expected {f.size})")
        yield b"\0" * (-f.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)


def measure(src: Path, layer: Layer) -> Layer:
    """Fill in the layer's digest and size (reads its files once)."""
    digest, size = hashlib.sha256(), 0
    for chunk in layer_chunks(src, layer):
        digest.update(chunk)
        size += len(chunk)
    layer.digest, layer.size = f"sha256:{digest.hexdigest()}", size
    return layer


def config_json(base_config: dict | None, layers: list[Layer]) -> bytes:
    """The image config: the base image's (its entrypoint, environment, platform) with our layers appended to
    its rootfs (an uncompressed layer's diff id is its digest); a bare linux/amd64 one without a base."""
    config = json.loads(json.dumps(base_config)) if base_config else {"architecture": "amd64", "os": "linux"}
    rootfs = config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
    rootfs.setdefault("type", "layers")
    rootfs["diff_ids"] = list(rootfs.get("diff_ids") or []) + [layer.digest for layer in layers]
    config.pop("history", None)  # one entry per layer where present; ours add none, so it would not line up
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def manifest_json(config: bytes, base_layers: list[dict], layers: list[Layer]) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(config), "size": len(config)},
        "layers": list(base_layers) + [layer.descriptor() for layer in layers],
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def sha256_digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class BlobStream(io.RawIOBase):
    """A readable stream that hashes what passes through it (the whole blob, for its digest)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._left, self.digest, self.size = chunks, b"", hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
            self.digest.update(self._left)
            self.size += len(self._left)
        n = min(len(buffer), len(self._left))
        buffer[:n], self._left = self._left[:n], self._left[n:]
        return n

    def drain(self) -> None:
        while self.readinto(bytearray(_CHUNK)):
            pass

    @property
    def digest_name(self) -> str:
        return f"sha256:{self.digest.hexdigest()}"


def model_files_in(blob: BlobStream) -> Iterator[tuple[str, int, BinaryIO | None]]:
    """Each entry under /models in a layer's tar stream: (path below /models, size, its bytes) for a regular file,
    (path, -1, None) for anything else but a folder. Only a file's own bytes are readable, and only until the next
    is asked for. Once the loop ends the rest of the blob is read through, so `blob.digest` is the whole blob's."""
    # "r|*": another tool's layers may be gzip- or bzip2-compressed tars.
    with tarfile.open(fileobj=io.BufferedReader(blob, _CHUNK), mode="r|*") as archive:
        for member in archive:
            name = member.name.removeprefix("./").lstrip("/")
            if not name.startswith(MODELS_DIR + "/"):
                continue
            path = name[len(MODELS_DIR) + 1 :]
            if member.isfile():
                yield path, member.size, archive.extractfile(member)
            elif not member.isdir():  # links, devices: nothing a model folder holds
                yield path, -1, None
    blob.drain()
