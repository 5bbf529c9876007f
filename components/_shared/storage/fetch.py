"""The download verb: `list_files(uri)` says what a source holds, `download(listing, paths, dest)` copies the
chosen files, verifies sizes and checksums and returns their manifest entries. Remote names are checked before
anything is written."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger

from .checksums import verify
from .errors import IntegrityError, StorageError
from .listing import FileRecord, Listing
from .names import check_remote_name
from .parallel import run_parallel
from .progress import Progress
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
    by path. `dest` should be a temp dir the caller renames into place (workspace.atomic_dir), so an
    interrupted or failed download never looks complete.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = listing.by_path()
    missing = [p for p in paths if p not in remote]
    if missing:
        raise StorageError(f"{listing.uri.shown}: not at the source: {', '.join(missing)}.")
    scheme = scheme_module(listing.uri)
    records: dict[str, FileRecord] = {}
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
            except IntegrityError as exc:
                failed[rel] = exc

        run_parallel(check, paths, max_workers)
        if not failed:
            return [records[p] for p in sorted(records)]
        first = failed[min(failed)]
        if attempt == 2:
            raise first
        log.warning("%s; fetching %d file(s) that failed verification again", first, len(failed))
        for rel in failed:
            (dest / rel).unlink()
        paths = sorted(failed)
    raise AssertionError("unreachable")
