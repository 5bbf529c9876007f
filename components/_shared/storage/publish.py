"""The publish verb (export steps): make a destination hold exactly a folder — resumable, verified by reading
sizes and checksums back, a no-op when the content is already there, and refusing to replace different content
unless asked. The algorithm is the same for every scheme; the scheme modules only list, put and remove."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import sha256_file

from .checksums import same_content
from .errors import DestinationConflict, StorageError
from .listing import FileRecord, RemoteFile
from .progress import Progress
from .schemes import scheme_module
from .uri import StorageUri, parse_uri

log = get_logger(__name__)


@dataclass
class PublishResult:
    """What `publish_directory` did. `state`: created (destination was empty), resumed (it held part of this
    content, e.g. from an interrupted run), unchanged (it already held exactly this content) or replaced
    (overwrite=True replaced different content)."""

    uri: str
    state: str
    records: list[FileRecord]
    uploaded: list[str]
    deleted: list[str]
    commit_sha: str | None = None  # hf:// only: the commit holding the files

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.records)


def require_credentials(uri: str | StorageUri) -> None:
    """Fail before any transfer when the environment has no credentials for writing to `uri`."""
    uri = parse_uri(uri)
    scheme = scheme_module(uri)
    if scheme.WRITABLE:
        scheme.require_credentials(uri)


@dataclass
class _Plan:
    state: str
    upload: list[FileRecord]
    delete: list[str]  # destination files not in the source (overwrite only)
    changed: list[str]  # files whose destination copy differs (overwrite only)


def _plan(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], uri: StorageUri, overwrite: bool
) -> _Plan:
    by_path = {f.path: f for f in remote}
    ours = {r.path for r in records}
    missing = [r for r in records if r.path not in by_path]
    changed = [r for r in records if r.path in by_path and not same_content(src / r.path, r, by_path[r.path])]
    foreign = sorted(p for p in by_path if p not in ours)
    if changed or foreign:
        if not overwrite:
            details = [f"{p} (different content)" for p in (r.path for r in changed)]
            details += [f"{p} (not part of this export)" for p in foreign]
            shown = "; ".join(details[:10]) + (f"; and {len(details) - 10} more" if len(details) > 10 else "")
            raise DestinationConflict(
                f"{uri.shown} already holds different content: {shown}. Nothing was written. Choose another "
                "destination, or set overwrite=True to replace it."
            )
        log.info("%s: replacing %d changed and removing %d other files (overwrite)", uri.shown, len(changed),
                 len(foreign))  # fmt: skip
        return _Plan("replaced", missing + changed, foreign, [r.path for r in changed])
    if not remote:
        return _Plan("created", records, [], [])
    if not missing:
        log.info("%s already holds these %d files with the same content: nothing to upload", uri.shown,
                 len(records))  # fmt: skip
        return _Plan("unchanged", [], [], [])
    log.info("%s holds %d of %d files already (an earlier, interrupted upload): sending the other %d",
             uri.shown, len(records) - len(missing), len(records), len(missing))  # fmt: skip
    return _Plan("resumed", missing, [], [])


def _verify_published(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], uri: StorageUri
) -> None:
    by_path = {f.path: f for f in remote}
    for record in records:
        found = by_path.get(record.path)
        if found is None:
            raise StorageError(
                f"verification failed: {record.path} is missing at {uri.shown} after the upload."
            )
        if not same_content(src / record.path, record, found):
            raise StorageError(
                f"verification failed: {record.path} at {uri.shown} has {found.size} bytes / other checksum "
                f"than the {record.size} bytes uploaded."
            )
    extra = sorted(set(by_path) - {r.path for r in records})
    if extra:
        raise StorageError(
            f"verification failed: {uri.shown} holds files that are not in the export: {extra[:5]}"
        )
    log.info("verified %d files at %s (sizes and checksums read back)", len(records), uri.shown)


def publish_directory(
    src: str | os.PathLike,
    uri: str | StorageUri,
    *,
    overwrite: bool = False,
    marker: str | None = None,
    endpoint_url: str | None = None,
    private: bool = True,
    commit_message: str = "Upload with kfp-finetune",
    max_workers: int = 8,
) -> PublishResult:
    """Make `uri` hold exactly the files under `src`: an s3:// prefix, a local folder or an hf:// model repo
    (optionally a folder in it, @branch). Resumable, verified and conflict-aware:

    - files already at the destination with the same content are not transferred again, so a rerun after an
      interruption only sends what is missing, and rerunning a finished export transfers nothing;
    - a destination holding different content (changed files, or files that are not in `src`) is refused with
      DestinationConflict before anything is written, unless `overwrite`: then changed files are replaced and
      the others deleted (the hub's .gitattributes is kept);
    - s3:// and local: `marker` (a path in `src`, e.g. a checksum manifest) is written last, so its presence
      means the copy is complete; local files appear atomically (temp name, then rename). hf:// writes one
      commit, which is atomic; LFS objects uploaded by an interrupted run are not sent again.
    - afterwards every file is read back (sizes and the checksums the destination states: sha256, MD5 ETag or
      git blob id) and compared with `src`; when that fails the marker is removed again, so a copy that does
      not hold `src` never looks complete.

    hf:// repos are created when missing, private unless `private=False`. Credentials come from the
    environment only (HF_TOKEN, AWS_*); missing ones fail before any transfer.
    """
    src = Path(src)
    uri = parse_uri(uri)
    scheme = scheme_module(uri)
    if not scheme.WRITABLE:
        raise ValueError(f"cannot publish to {uri.shown!r}: use an s3://, hf:// or local path destination")
    dest = scheme.destination(uri, endpoint_url=endpoint_url, private=private, commit_message=commit_message)
    scheme.require_credentials(uri)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise StorageError(f"nothing to publish: {src} holds no files")
    records = [FileRecord(p.relative_to(src).as_posix(), p.stat().st_size, sha256_file(p)) for p in files]
    if marker is not None and marker not in {r.path for r in records}:
        raise ValueError(f"marker {marker!r} is not a file in {src}")
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    plan = _plan(src, records, scheme.existing(dest), uri, overwrite)
    if plan.upload or plan.delete:
        content = [r for r in plan.upload if r.path != marker]
        last = [r for r in plan.upload if r.path == marker]
        total = sum(r.size for r in plan.upload)
        with Progress(
            what=f"upload to {uri.shown}", total_files=len(plan.upload), total_bytes=total
        ) as progress:
            options = {"max_workers": max_workers, "progress": progress}
            if scheme.ATOMIC_CHANGES:  # one commit: never seen half-replaced, the marker needs no order
                scheme.put(dest, src, plan.upload, plan.delete, **options)
            else:
                # Overwriting: remove the old completion marker first, so a half-replaced copy never looks
                # complete; write it again last.
                if marker and marker in plan.changed:
                    scheme.put(dest, src, [], [marker], **options)
                scheme.put(dest, src, content, plan.delete, **options)
                if last:
                    scheme.put(dest, src, last, [], **options)
    try:
        _verify_published(src, records, scheme.existing(dest), uri)
    except StorageError:
        # A copy that failed verification never looks complete: its marker goes again.
        if marker is not None and not scheme.ATOMIC_CHANGES:
            with Progress(what=f"remove {marker} from {uri.shown}", total_files=0, total_bytes=0) as progress:
                scheme.put(dest, src, [], [marker], max_workers=max_workers, progress=progress)
        raise
    uploaded = [r.path for r in plan.upload]
    return PublishResult(uri.shown, plan.state, records, uploaded, plan.delete, dest.head)
