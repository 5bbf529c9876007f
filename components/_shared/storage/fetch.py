"""The download verb: `list_files(uri)` says what a source holds, `download(listing, paths, dest)` copies the
chosen files, verifies sizes and checksums and returns their manifest entries. Remote names are checked before
anything is written."""

from __future__ import annotations

import dataclasses
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

    Resuming: files an earlier, interrupted attempt left in `dest` are kept when they are proven, by hashing them
    in this attempt, to hold the listed content (the sha256 the journal in `dest` recorded when that attempt
    verified them, for the same source identity, or a checksum the source states); anything else there is removed
    and fetched again. When the source changed since that attempt, nothing of it is kept. Each verified file is
    journaled; every record returned was hashed in this attempt.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = listing.by_path()
    missing = [p for p in paths if p not in remote]
    if missing:
        raise StorageError(f"{listing.uri.shown}: not at the source: {', '.join(missing)}.")
    listing.settle(paths)
    scheme = scheme_module(listing.uri)
    journal = Journal(dest / PARTIAL_JOURNAL)
    records = keep_verified(listing, paths, dest, journal, max_workers)
    if records:
        log.info(
            "kept %d file(s), %s, an earlier attempt left in %s (hashed again: they hold the listed content); "
            "fetching %d file(s)",
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
                journal.add(records[rel], remote[rel])
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


class Journal:
    """What a download proved, one JSON line per verified file (path, size, sha256, the source's identity of it),
    appended as files verify. A later attempt still hashes what it keeps: the journal says which sha256 a file
    held when it matched the source (the only proof for a source that states no checksum), never that it still
    does. A torn last line (a kill mid-write) is ignored."""

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

    def recorded_sha256(self, remote: RemoteFile) -> str | None:
        """The sha256 an earlier attempt verified for exactly this remote content, if any."""
        entry = self.entries.get(remote.path)
        if (
            not remote.identified()
        ):  # the same size may be another version: nothing ties the entry to this one
            return None
        if entry and entry.get("remote") == remote.identity() and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
        return None

    def changed(self, listing: Listing) -> list[str]:
        """Listed files whose identity at the source differs from the one an earlier attempt journaled."""
        remote = listing.by_path()
        return sorted(
            rel
            for rel, entry in self.entries.items()
            if rel in remote and entry.get("remote") != remote[rel].identity()
        )

    def add(self, record: FileRecord, remote: RemoteFile) -> None:
        entry = {**record.as_dict(), "remote": remote.identity()}
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.entries[record.path] = entry

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.entries.clear()


def keep_verified(
    listing: Listing, paths: list[str], dest: Path, journal: Journal, max_workers: int
) -> dict[str, FileRecord]:
    """The files in `dest` an earlier attempt left that provably hold the listed content, each hashed now.
    Everything else in `dest` (a file cut off mid-write, a client's temp file, a file the source no longer lists,
    all of it when the source changed since) is removed; scratch the storage modules keep there (names starting
    with SCRATCH_PREFIX) is left alone, unless the source changed."""
    remote, wanted = listing.by_path(), set(paths)
    changed = journal.changed(listing)
    if changed:
        log.warning(
            "%s changed at the source since an earlier attempt fetched it (%s%s): discarding that attempt's "
            "files and fetching everything again",
            listing.uri.shown, ", ".join(changed[:5]), ", …" if len(changed) > 5 else "",
        )  # fmt: skip
        journal.clear()
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if rel.split("/", 1)[0].startswith(SCRATCH_PREFIX) and not changed:
            continue
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif changed or rel not in wanted or path.is_symlink():
            path.unlink()
    kept: dict[str, FileRecord] = {}

    def check(rel: str) -> None:
        local = write_target(dest, rel, key=remote[rel].source_path or rel, source=listing.uri.shown)
        if not local.is_file():
            return
        r = remote[rel]
        if not r.sha256 and (recorded := journal.recorded_sha256(r)):
            r = dataclasses.replace(r, sha256=recorded)
        if r.states_checksum():  # a size alone proves nothing: fetch again
            try:
                kept[rel] = verify(local, r, listing.uri.shown)
                return
            except IntegrityError as exc:
                log.info(
                    "fetching again what an earlier attempt left (changed since it was verified): %s", exc
                )
        local.unlink()

    run_parallel(check, paths, max_workers)
    return kept
