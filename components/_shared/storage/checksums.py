"""Checksums: git blob ids, MD5 (S3 ETags), and the checks of a copied file against what its source states."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kfp_finetune.components._shared.workspace import sha256_file

from .errors import IntegrityError
from .listing import FileRecord, RemoteFile


def git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify(local: Path, remote: RemoteFile, source: str) -> FileRecord:
    """Check size and every checksum the source stated; return the manifest entry. Raises IntegrityError naming
    the file, the check and the expected and actual values."""
    size = local.stat().st_size
    if remote.size is not None and size != remote.size:
        raise IntegrityError(
            f"{source}: {remote.path} has {size} bytes, the source says {remote.size} (a truncated transfer)."
        )
    sha256 = sha256_file(local)
    checks = [
        ("sha256", remote.sha256, lambda: sha256),
        ("MD5 (the S3 ETag)", remote.md5, lambda: md5_file(local)),
        ("git blob id", remote.git_blob_sha1, lambda: git_blob_sha1(local)),
    ]
    for name, expected, compute in checks:
        if expected and (actual := compute()) != expected:
            raise IntegrityError(
                f"{source}: {remote.path} is corrupt: {name} {actual} does not match the source's {expected}."
            )
    return FileRecord(remote.path, size, sha256)


def same_content(local: Path, record: FileRecord, remote: RemoteFile) -> bool:
    """True when `remote` provably holds `record`'s bytes: same size and every checksum the destination states
    matches (an S3 object's sha256 metadata and, for single-part uploads, its server-computed MD5 ETag)."""
    checks = [
        (remote.sha256, lambda: record.sha256),
        (remote.md5, lambda: md5_file(local)),
        (remote.git_blob_sha1, lambda: git_blob_sha1(local)),
    ]
    stated = [(value, compute) for value, compute in checks if value]
    # Nothing to compare means different: never assume content is there.
    return (
        remote.size == record.size and bool(stated) and all(value == compute() for value, compute in stated)
    )
