"""file:// and absolute paths — a local file or folder (e.g. a PVC mounted into the step)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger

from .checksums import hash_file
from .errors import StorageError
from .links import LocalRoot
from .listing import FileRecord, Listing, RemoteFile
from .names import is_stale_probe, probe_name, write_target
from .parallel import run_parallel
from .progress import Progress
from .uri import StorageUri

log = get_logger(__name__)

COUNTS_FILES_ON_DISK = False
WRITABLE = True
ATOMIC_CHANGES = False
OWNS_DESTINATION = False  # shared: overwrite removes only what an earlier manifest lists
_PART_MARK = ".part-"  # `.<name>.part-<id>` while a file is being written
_COPY_CHUNK = 8 << 20  # a source file is copied from the descriptor its link check opened, in large reads


def _visible_files(root: Path) -> list[Path]:
    # Hidden files are our own partial files and tools' state, not content.
    return [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]


# A local file's sha256 by (st_dev, st_ino, size, mtime_ns, ctime_ns): hashed once per process. ctime is in the key
# because a file rewritten in place with its mtime set back (os.utime) keeps the other four.
_sha256_of: dict[tuple[int, int, int, int, int], str] = {}
_sha256_lock = threading.Lock()


def _stat_key(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _checksummer(root: LocalRoot):
    """`Listing.describe` for a local source: a plain folder states no checksum, so a file's identity is its
    content, its sha256, read through the root's link check like any read of the source."""

    def one(remote: RemoteFile) -> None:
        with root.open(Path(remote.source_path)) as source:
            key = _stat_key(os.fstat(source.fileno()))
            with _sha256_lock:
                known = _sha256_of.get(key)
            if known is None:
                known = hash_file(remote.source_path, opened=source).sha256
                if _stat_key(os.fstat(source.fileno())) == key:  # not written to while it was read
                    with _sha256_lock:
                        _sha256_of[key] = known
        remote.sha256, remote.size, remote.mtime_ns = known, key[2], key[3]

    def describe(files: list[RemoteFile]) -> None:
        run_parallel(one, [f for f in files if f.sha256 is None], 8)

    return describe


def list_files(uri: StorageUri, *, repo_type: str, endpoint_url: str | None) -> Listing:
    root = Path(uri.path)
    if root.is_file():
        stat = root.stat()
        file = RemoteFile(root.name, stat.st_size, str(root), mtime_ns=stat.st_mtime_ns)
        return Listing(uri, [file], describe=_checksummer(LocalRoot(root, uri.shown)))
    if not root.is_dir():
        raise StorageError(f"{uri.shown}: no such file or directory.")
    files = []
    for path in LocalRoot(root, uri.shown).visible_files():  # refuses links that lead outside the folder
        stat = path.stat()
        files.append(
            RemoteFile(path.relative_to(root).as_posix(), stat.st_size, str(path), mtime_ns=stat.st_mtime_ns)
        )
    if not files:
        raise StorageError(
            f"{uri.shown} is an empty directory (hidden files are skipped): put the files there, or name the "
            "folder that holds them."
        )
    return Listing(uri, files, describe=_checksummer(LocalRoot(root, uri.shown)))


def fetch(listing: Listing, paths: list[str], dest: Path, *, max_workers: int, progress: Progress) -> None:
    remote = listing.by_path()
    targets = {p: write_target(dest, p, key=remote[p].source_path, source=listing.uri.shown) for p in paths}
    root = LocalRoot(Path(listing.uri.path), listing.uri.shown)

    def copy(rel: str) -> None:
        with root.open(Path(remote[rel].source_path)) as source, open(targets[rel], "wb") as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK)
        progress.file_done()

    run_parallel(copy, paths, max_workers)


# --- destinations ---------------------------------------------------------------------------------------------


@dataclass
class Destination:
    uri: StorageUri
    head: str | None = None  # a commit id: hf:// only
    # Files `put` wrote: path -> (size, mtime_ns, sha256 of the bytes copied). Reading them back compares size
    # and mtime with what was written instead of hashing the copy a second time.
    written: dict[str, tuple[int, int, str]] = field(default_factory=dict)


def is_root(uri: StorageUri) -> bool:
    """The whole disk (`/`, `//`, `file:////`, or a link to `/`): never a destination."""
    return os.path.realpath(uri.path) == "/"


def require_credentials(uri: StorageUri) -> None:
    """A local folder needs none: the step's file permissions decide."""


def probe(uri: StorageUri, *, endpoint_url: str | None) -> None:
    """The folder (or its nearest existing parent, where the export would create it) takes a file: one is
    created and removed there, which is the only test a read-only mount, a missing permission or a full quota
    cannot fool. First removes the probes killed pre-flights left there (names.is_stale_probe)."""
    import time

    path = Path(uri.path)
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        what = "is a file" if existing == path else f"lies under {existing}, which is a file"
        raise StorageError(f"destination {uri.shown} {what}, not a folder: name a folder.")
    _remove_stale_probes(existing)
    probe_file = existing / probe_name(time.time())
    try:
        probe_file.open("x").close()
        probe_file.unlink()
    except OSError as exc:
        where = "" if existing == path else f" (the export would create it in {existing})"
        raise StorageError(
            f"cannot write to {uri.shown}{where}: {exc.strerror or exc}. Mount a writable volume there, or "
            "choose another destination."
        ) from exc


def _remove_stale_probes(folder: Path) -> None:
    """Delete the probe files directly in `folder` that killed pre-flights left (older than
    names.PROBE_STALE_AFTER_SECONDS by their name); no other file, however it is named. A folder that cannot be
    read or changed is only logged: the probe that follows reports it."""
    import time

    now = time.time()
    try:
        stale = [
            e.path
            for e in os.scandir(folder)
            if e.is_file(follow_symlinks=False) and is_stale_probe(e.name, now)
        ]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):  # another pre-flight removed it first
                os.unlink(path)
                log.info("removed %s, the probe of a pre-flight that was killed", path)
    except OSError as exc:
        log.info("could not look for probes killed pre-flights left in %s (%s)", folder, exc.strerror or exc)


def destination(
    uri: StorageUri, *, endpoint_url: str | None, private: bool, base_image: str = "", commit_message: str
) -> Destination:
    root = Path(uri.path)
    for stale in root.rglob(f".*{_PART_MARK}*") if root.is_dir() else []:
        stale.unlink(missing_ok=True)  # left by an interrupted copy: cleaned on every run, not only on a put
    return Destination(uri)


def existing(dest: Destination) -> list[RemoteFile]:
    root = Path(dest.uri.path)
    if root.exists() and not root.is_dir():
        raise StorageError(f"destination {dest.uri.shown} is a file, not a folder.")
    # A plain folder states no checksum: a file this process wrote and that still has the size and mtime it
    # was written with holds what was copied; any other file is hashed (it must be read to be known).
    files = []
    for path in _visible_files(root) if root.is_dir() else []:
        rel, stat = path.relative_to(root).as_posix(), path.stat()
        written = dest.written.get(rel)
        if written and written[:2] == (stat.st_size, stat.st_mtime_ns):
            sha256 = written[2]
        else:
            sha256 = hash_file(path).sha256
        files.append(RemoteFile(rel, stat.st_size, str(path), sha256=sha256, mtime_ns=stat.st_mtime_ns))
    return files


def read_text(dest: Destination, rel: str) -> str:
    return (Path(dest.uri.path) / rel).read_text(errors="replace")


def put(
    dest: Destination, src: Path, records: list[FileRecord], remove: list[str], *, max_workers: int,
    progress: Progress,
) -> None:  # fmt: skip
    """Copy `records` in parallel, each under a temp name renamed into place, then delete `remove`."""
    root = Path(dest.uri.path)

    def copy(record: FileRecord) -> None:
        target = write_target(root, record.path, key=record.path, source=str(src))
        part = target.parent / f".{target.name}{_PART_MARK}{uuid.uuid4().hex[:8]}"
        shutil.copyfile(src / record.path, part)
        os.replace(part, target)  # readers never see a half-written file under its real name
        stat = target.stat()
        dest.written[record.path] = (stat.st_size, stat.st_mtime_ns, record.sha256)
        progress.file_done(record.size)

    run_parallel(copy, records, max_workers)
    for rel in remove:
        (root / rel).unlink(missing_ok=True)
        log.info("removed %s from %s", rel, dest.uri.shown)
