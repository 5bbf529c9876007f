"""The download verb: `list_files(uri)` says what a source holds, `download(listing, paths, dest)` copies the
chosen files, verifies sizes and checksums and returns their manifest entries. Remote names are checked before
anything is written."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import PARTIAL_JOURNAL, SCRATCH_PREFIX

from .checksums import verify
from .errors import IntegrityError, StorageError
from .listing import FileRecord, Listing, RemoteFile
from .names import check_remote_name, write_target
from .parallel import run_parallel
from .progress import Progress, human
from .schemes import scheme_module
from .uri import StorageUri, parse_uri

log = get_logger(__name__)


def list_files(
    uri: str | StorageUri, *, repo_type: str = "model", endpoint_url: str | None = None
) -> Listing:
    """List the files at a source. `repo_type` ("model"/"dataset") applies to hf://, `endpoint_url` to s3://.

    Raises ValueError for a malformed URI and StorageError (naming the source) when it cannot be read or names
    a file that would land outside a destination (HostileName).
    """
    uri = parse_uri(uri)
    # One line per HTTP request (httpx2, used by huggingface_hub) would drown the step log's progress lines.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    listing = scheme_module(uri).list_files(uri, repo_type=repo_type, endpoint_url=endpoint_url)
    for remote in listing.files:
        check_remote_name(remote.path, key=remote.source_path or remote.path, source=uri.shown)
    return listing


def download(
    listing: Listing, paths: list[str], dest: str | os.PathLike, *, max_workers: int = 8
) -> list[FileRecord]:
    """Copy `paths` (relative, as listed) from the source into `dest`, in parallel, with retries and progress.

    Every file is verified against the listing (size, and sha256 / MD5 ETag / git blob id where the source
    states one); files that fail are fetched once more (damage in transit rarely repeats), then an
    IntegrityError names the file and the expected and actual checksum. Returns the manifest entries, sorted
    by path. `dest` should be a folder the caller renames into place only when complete (workspace.partial_dir),
    so an interrupted or failed download never looks complete.

    Resuming: files an earlier, interrupted attempt left in `dest` are kept when they are proven to hold the
    listed content (a journal entry in `dest` whose size and mtime still match, else verify() against a checksum
    the source states); anything else there is removed and fetched again. Each verified file is journaled.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = listing.by_path()
    missing = [p for p in paths if p not in remote]
    if missing:
        raise StorageError(f"{listing.uri.shown}: not at the source: {', '.join(missing)}.")
    scheme = scheme_module(listing.uri)
    journal = Journal(dest / PARTIAL_JOURNAL)
    records = keep_verified(listing, paths, dest, journal, max_workers)
    if records:
        log.info(
            "kept %d file(s), %s, verified by an earlier attempt in %s; fetching %d file(s)",
            len(records), human(sum(r.size for r in records.values())), dest.name, len(paths) - len(records),
        )  # fmt: skip
    paths = [p for p in paths if p not in records]
    if not paths:
        return [records[p] for p in sorted(records)]
    for attempt in (1, 2):
        with Progress(
            what=f"fetch {listing.uri.shown}",
            total_files=len(paths),
            total_bytes=sum(remote[p].size or 0 for p in paths),
            measure_dir=dest,
            count_on_disk=scheme.COUNTS_FILES_ON_DISK,
        ) as progress:
            try:
                scheme.fetch(listing, paths, dest, max_workers=max_workers, progress=progress)
            except IntegrityError as exc:  # a check the client makes while reading (size, CRC)
                if attempt == 2:
                    raise
                log.warning("%s; fetching again", exc)
                continue
        failed: dict[str, IntegrityError] = {}

        def check(rel: str, failed=failed) -> None:
            try:
                records[rel] = verify(dest / rel, remote[rel], listing.uri.shown)
                journal.add(records[rel], dest / rel, remote[rel])
            except IntegrityError as exc:
                failed[rel] = exc

        run_parallel(check, paths, max_workers)
        if not failed:
            return [records[p] for p in sorted(records)]
        first = failed[min(failed)]
        for rel in failed:  # never kept for a later attempt
            (dest / rel).unlink()
        if attempt == 2:
            raise first
        log.warning("%s; fetching %d file(s) that failed verification again", first, len(failed))
        paths = sorted(failed)
    raise AssertionError("unreachable")


def _identity(remote: RemoteFile) -> list:
    """What the source says about a file: a journal entry counts only for this exact remote content."""
    return [remote.size, remote.sha256, remote.md5, remote.git_blob_sha1, remote.mtime_ns]


class Journal:
    """What a download proved, one JSON line per verified file (path, size, sha256, mtime_ns, the remote's
    identity), appended as files verify, so a resumed attempt need not hash them again. A torn last line (a kill
    mid-write) is ignored."""

    def __init__(self, path: Path) -> None:
        self.path, self._lock = path, threading.Lock()
        self.entries: dict[str, dict] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                self.entries[entry["path"]] = entry
            except (ValueError, TypeError, KeyError):
                continue

    def proves(self, rel: str, local: Path, remote: RemoteFile) -> FileRecord | None:
        entry, stat = self.entries.get(rel), local.stat()
        if (
            entry
            and entry.get("remote") == _identity(remote)
            and entry.get("size") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
        ):
            return FileRecord(rel, stat.st_size, entry["sha256"])
        return None

    def add(self, record: FileRecord, local: Path, remote: RemoteFile) -> None:
        entry = {**record.as_dict(), "mtime_ns": local.stat().st_mtime_ns, "remote": _identity(remote)}
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.entries[record.path] = entry


def keep_verified(
    listing: Listing, paths: list[str], dest: Path, journal: Journal, max_workers: int
) -> dict[str, FileRecord]:
    """The files in `dest` an earlier attempt left that provably hold the listed content. Everything else in
    `dest` (a file cut off mid-write, a client's temp file, a file the source no longer lists) is removed;
    scratch the storage modules keep there (names starting with SCRATCH_PREFIX) is left alone."""
    remote, wanted = listing.by_path(), set(paths)
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if rel.split("/", 1)[0].startswith(SCRATCH_PREFIX):
            continue
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif rel not in wanted or path.is_symlink():
            path.unlink()
    kept: dict[str, FileRecord] = {}

    def check(rel: str) -> None:
        local = write_target(dest, rel, key=remote[rel].source_path or rel, source=listing.uri.shown)
        if not local.is_file():
            return
        if record := journal.proves(rel, local, remote[rel]):
            kept[rel] = record
            return
        r = remote[rel]
        if r.sha256 or r.md5 or r.git_blob_sha1:  # a size alone proves nothing: fetch again
            try:
                kept[rel] = verify(local, r, listing.uri.shown)
                journal.add(kept[rel], local, r)
                return
            except IntegrityError as exc:
                log.info("fetching again what an earlier attempt left: %s", exc)
        local.unlink()

    run_parallel(check, paths, max_workers)
    return kept
