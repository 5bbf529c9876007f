"""Checksums: the one hashing helper (sha256 + size + mtime, and for small files the MD5 an S3 ETag states and
the git blob id the hub states, all in one read), and the checks of a copied file against what its source states.

Every file hashed goes through `hash_file`, which counts the bytes it read per file (`hashed`): a test or a
benchmark reads that count to prove each byte is hashed once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kfp_finetune.components._shared.logs import get_logger

from .errors import IntegrityError
from .listing import FileRecord, RemoteFile
from .parallel import run_parallel

log = get_logger(__name__)

# Up to this size a file also gets its MD5 (what S3 states as the ETag of a single-part upload, which is what
# s3.py sends up to its 64 MiB multipart threshold) and git blob id (what the hub states for a non-LFS file,
# at most 10 MB), in the same read: reading back such a copy then needs no second pass over the local bytes.
SMALL_FILE = 64 << 20

hashed: Counter[tuple[int, int]] = Counter()  # (st_dev, st_ino) -> bytes hashed: hard links count as one file
_hashed_lock = threading.Lock()


@dataclass(frozen=True)
class FileHash:
    size: int
    mtime_ns: int
    sha256: str
    md5: str | None = None
    git_blob_sha1: str | None = None

    def as_dict(self) -> dict:
        """For artifact metadata: mtime_ns as a string, as KFP keeps metadata numbers as doubles (inexact
        beyond 2**53, and a nanosecond timestamp is ~2**60)."""
        data = {k: v for k, v in vars(self).items() if v is not None}
        return {**data, "mtime_ns": str(self.mtime_ns)}

    @classmethod
    def from_dict(cls, data: dict) -> FileHash | None:
        """A record as `as_dict` wrote it, or None when it lacks what a reuse needs (older metadata)."""
        try:
            size, mtime_ns, sha256 = data["size"], int(data["mtime_ns"]), data["sha256"]
        except (KeyError, TypeError, ValueError):
            return None
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if not isinstance(size, int) or not isinstance(sha256, str):
            return None
        return cls(size, mtime_ns, sha256, data.get("md5"), data.get("git_blob_sha1"))

    def matches(self, path: Path) -> bool:
        """True while `path` still has the size and mtime this hash was taken at (so it still holds it)."""
        stat = path.stat()
        return stat.st_size == self.size and stat.st_mtime_ns == self.mtime_ns


def hash_file(
    path: str | os.PathLike,
    *,
    all_digests: bool = False,
    chunk_size: int = 1 << 20,
    opened: BinaryIO | None = None,
) -> FileHash:
    """Read `path` once: its sha256, size and mtime_ns (and MD5 + git blob id when small or `all_digests`).
    `opened`: `path` already opened for reading (e.g. through a local source's link check): read from it."""
    path = Path(path)
    stat = os.fstat(opened.fileno()) if opened else path.stat()
    small = all_digests or stat.st_size <= SMALL_FILE
    digests = [hashlib.sha256()]
    if small:
        blob = hashlib.sha1(usedforsecurity=False)
        blob.update(f"blob {stat.st_size}\0".encode())
        digests += [hashlib.md5(usedforsecurity=False), blob]
    read = 0
    with contextlib.nullcontext(opened) if opened else open(path, "rb") as f:
        while block := f.read(chunk_size):
            read += len(block)
            for digest in digests:
                digest.update(block)
    with _hashed_lock:
        hashed[(stat.st_dev, stat.st_ino)] += read
    log.debug("hashed %s (%d bytes)", path, read)
    hexes = [d.hexdigest() for d in digests] + [None, None]
    return FileHash(stat.st_size, stat.st_mtime_ns, hexes[0], hexes[1], hexes[2])


def hash_files(paths: list[Path], *, max_workers: int = 8) -> dict[Path, FileHash]:
    """`hash_file` of every path, up to `max_workers` at once (hashlib releases the GIL on large blocks)."""
    results: dict[Path, FileHash] = {}

    def one(path: Path) -> None:
        results[path] = hash_file(path)

    run_parallel(one, paths, max_workers)
    return {p: results[p] for p in paths}


def git_blob_sha1(path: Path) -> str:
    return hash_file(path, all_digests=True).git_blob_sha1  # type: ignore[return-value]


def md5_file(path: Path) -> str:
    return hash_file(path, all_digests=True).md5  # type: ignore[return-value]


def verify(local: Path, remote: RemoteFile, source: str) -> FileRecord:
    """Check size and every checksum the source stated; return the manifest entry. Raises IntegrityError naming
    the file, the check and the expected and actual values."""
    size = local.stat().st_size
    if remote.size is not None and size != remote.size:
        raise IntegrityError(
            f"{source}: {remote.path} has {size} bytes, the source says {remote.size} (a truncated transfer)."
        )
    local_hash = hash_file(local, all_digests=bool(remote.md5 or remote.git_blob_sha1))
    checks = [
        ("sha256", remote.sha256, lambda: local_hash.sha256),
        ("MD5 (the S3 ETag)", remote.md5, lambda: local_hash.md5),
        ("git blob id", remote.git_blob_sha1, lambda: local_hash.git_blob_sha1),
    ]
    for name, expected, compute in checks:
        if expected and (actual := compute()) != expected:
            raise IntegrityError(
                f"{source}: {remote.path} is corrupt: {name} {actual} does not match the source's {expected}."
            )
    return FileRecord(remote.path, size, local_hash.sha256)


def same_content(local: Path, record: FileRecord, remote: RemoteFile) -> bool:
    """True when `remote` provably holds `record`'s bytes: same size and every checksum the destination states
    matches (an S3 object's sha256 metadata and, for single-part uploads, its server-computed MD5 ETag; the
    hub's LFS sha256 or git blob id). The record's own MD5 / git blob id are used when it has them (taken in
    the one hashing pass); only a record without them makes this read the local file again."""
    checks = [
        (remote.sha256, lambda: record.sha256),
        (remote.md5, lambda: record.md5 or md5_file(local)),
        (remote.git_blob_sha1, lambda: record.git_blob_sha1 or git_blob_sha1(local)),
    ]
    stated = [(value, compute) for value, compute in checks if value]
    # Nothing to compare means different: never assume content is there.
    return (
        remote.size == record.size and bool(stated) and all(value == compute() for value, compute in stated)
    )


def ledger_path(folder: Path) -> Path:
    """The ledger of what damaged_files last proved of `folder`, beside it."""
    return folder.parent / f".{folder.name}.verified.json"


def _stat_key(stat: os.stat_result) -> list[int]:
    # ctime too: a file rewritten in place with its size kept and its mtime set back (os.utime) changes only that.
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def damaged_files(folder: Path, records: list[dict], *, max_workers: int = 8) -> list[str]:
    """The manifest entries (`path`, `size`, `sha256`) that `folder` no longer holds: missing, resized, or other
    bytes. A file is hashed only when its inode, size, mtime or ctime differ from the last time it was proven
    (a small ledger beside the folder, `.<name>.verified.json`), so a reused copy is read once per change."""
    ledger_file = ledger_path(folder)
    try:
        ledger = json.loads(ledger_file.read_text())
    except (OSError, ValueError):
        ledger = {}
    proven: dict[str, dict] = {}
    to_hash: dict[Path, dict] = {}
    damaged = []
    for record in records:
        path = folder / record["path"]
        try:
            stat = path.stat()
        except OSError:
            damaged.append(record["path"])
            continue
        if stat.st_size != record["size"]:
            damaged.append(record["path"])
        elif ledger.get(record["path"]) == {"sha256": record["sha256"], "stat": _stat_key(stat)}:
            proven[record["path"]] = ledger[record["path"]]
        else:
            to_hash[path] = record
    for path, taken in hash_files(list(to_hash), max_workers=max_workers).items():
        record = to_hash[path]
        if taken.sha256 == record["sha256"]:
            proven[record["path"]] = {"sha256": taken.sha256, "stat": _stat_key(path.stat())}
        else:
            log.warning("%s holds other bytes than its manifest records (sha256 %s, recorded %s)", path,
                        taken.sha256, record["sha256"])  # fmt: skip
            damaged.append(record["path"])
    tmp = ledger_file.parent / f"{ledger_file.name}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(proven, sort_keys=True))
    os.replace(tmp, ledger_file)
    return sorted(damaged)
