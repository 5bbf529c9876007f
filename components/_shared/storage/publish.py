"""The publish verb (export steps): make a destination hold exactly a folder — resumable, verified by reading
sizes and checksums back, a no-op when the content is already there, and refusing to replace different content
unless asked. The algorithm is the same for every scheme; the scheme modules only list, put and remove."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger

from .checksums import FileHash, hash_files, same_content
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
    kept: list[str] = field(default_factory=list)  # files at the destination no export wrote: left alone
    commit_sha: str | None = None  # hf://: the commit holding the files; oci://: the image manifest's digest

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
    delete: list[str]  # files an earlier export wrote that are not in this one (overwrite only)
    changed: list[str]  # files whose destination copy differs (overwrite only)
    kept: list[str]  # files this export never wrote (a user's notes, other models): never touched


def refuse_root(uri: StorageUri) -> None:
    """A whole disk or bucket is never a destination (a hub repo root is: the repo is ours)."""
    if scheme_module(uri).is_root(uri):
        raise StorageError(
            f"cannot publish to {uri.shown!r}: that is the root of a disk or bucket; name a folder, e.g. "
            "s3://bucket/models/<name> or /data/models/<name>."
        )


MANIFEST_MARK = "# kfp-finetune export"  # a manifest's first line: written by publish_directory's caller
_INCOMPLETE = " (incomplete: being written, or interrupted)"
_CLAIM = "# owns: "  # an incomplete manifest's lines: files the publish in progress may have written


def manifest_text(entries: dict[str, str], identity: str) -> str:
    """A manifest in sha256sum format (`<sha256>  <path>` lines, path -> sha256 from `entries`) whose first line
    marks it as written by an export and names that export (`identity`: run, task, time). `sha256sum -c` skips
    `#` lines; a checksums file a user wrote (`sha256sum * > checksums.sha256`) has no such line and is never
    taken for ours."""
    return f"{MANIFEST_MARK}: {identity}\n" + "".join(f"{entries[p]}  {p}\n" for p in sorted(entries))


def _entries(text: str) -> set[tuple[str, str]]:
    """The (sha256, path) lines of a sha256sum-format manifest."""
    entries = set()
    for line in text.splitlines():
        digest, sep, path = line.partition("  ")
        if sep and len(digest) == 64 and path:
            entries.add((digest, path))
    return entries


@dataclass
class _Earlier:
    """What earlier exports left at the destination, as the manifest there tells."""

    owned: set[str]  # files they wrote: those their manifest lists (every file where the destination is ours)
    manifest: str | None = None  # that manifest's text, when an export wrote it
    complete: bool = False  # False: written first by an export that may not have finished (it lists claims)


def _earlier(scheme, dest, remote: list[RemoteFile], manifest: str | None) -> _Earlier:
    present = {f.path for f in remote}
    text = scheme.read_text(dest, manifest) if manifest in present else None
    if text is None or not text.startswith(MANIFEST_MARK):  # none, or a user's own checksums file
        return _Earlier(present if scheme.OWNS_DESTINATION else set())
    claims = {line.removeprefix(_CLAIM) for line in text.splitlines() if line.startswith(_CLAIM)}
    owned = {path for _, path in _entries(text)} | claims | {manifest}
    complete = not text.split("\n", 1)[0].endswith(_INCOMPLETE)
    return _Earlier(present if scheme.OWNS_DESTINATION else owned & present, text, complete)


def _claim(src: Path, manifest: str, records: list[FileRecord], earlier: _Earlier) -> str:
    """The manifest written before anything else: this export's identity marked incomplete, and every file
    the earlier export or this one writes, so an interruption at any point leaves them owned (the next run
    replaces or removes them) and never looks complete (`sha256sum -c` finds no checksum in it)."""
    first = (src / manifest).read_text().split("\n", 1)[0]
    paths = sorted(earlier.owned | {r.path for r in records})
    return first + _INCOMPLETE + "\n" + "".join(f"{_CLAIM}{p}\n" for p in paths)


def _plan(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], earlier: _Earlier, manifest: str | None,
    uri: StorageUri, overwrite: bool,
) -> _Plan:  # fmt: skip
    by_path = {f.path: f for f in remote}
    ours = {r.path for r in records}
    # An incomplete manifest is no content: the finished one replaces it, whatever `overwrite` says.
    unfinished = manifest if earlier.manifest is not None and not earlier.complete else None
    missing = [r for r in records if r.path not in by_path or r.path == unfinished]
    changed = [
        r for r in records
        if r.path in by_path and r.path != unfinished and not same_content(src / r.path, r, by_path[r.path])
    ]  # fmt: skip
    # Same content or not: a file no export wrote is never listed in our manifest (a later overwrite would
    # delete it as ours).
    foreign = [
        r.path for r in records if r.path in by_path and r.path != unfinished and r.path not in earlier.owned
    ]
    if foreign:
        shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
        raise DestinationConflict(
            f"{uri.shown} already holds {shown}, not written by an export (no {manifest} "
            "an export wrote there lists them): an export never replaces such files, even with "
            "export_overwrite=true. Nothing was written. Move them away, or export to another folder (e.g. a "
            "subfolder of this one)."
            + (
                f" (A {manifest} whose first line is not {MANIFEST_MARK!r} may be an older kfp-finetune export's: "
                "delete that export's files once.)"
                if manifest in foreign
                else ""
            )
        )
    stale = sorted(p for p in by_path if p not in ours and p in earlier.owned)
    kept = sorted(p for p in by_path if p not in ours and p not in earlier.owned)
    if kept:
        log.info("%s: leaving %d files that no export wrote there (e.g. %s)", uri.shown, len(kept),
                 ", ".join(kept[:3]))  # fmt: skip
    if changed or stale:
        if not overwrite:
            details = [f"{p} (different content)" for p in (r.path for r in changed)]
            details += [f"{p} (not part of this export)" for p in stale]
            shown = "; ".join(details[:10]) + (f"; and {len(details) - 10} more" if len(details) > 10 else "")
            raise DestinationConflict(
                f"{uri.shown} already holds different content from an earlier export: {shown}. Nothing was "
                "written. Choose another destination, or set export_overwrite=true to replace it."
            )
        log.info("%s: replacing %d changed and removing %d files of the earlier export (overwrite)", uri.shown,
                 len(changed), len(stale))  # fmt: skip
        return _Plan("replaced", missing + changed, stale, [r.path for r in changed], kept)
    if not ours & set(by_path):
        return _Plan("created", records, [], [], kept)
    if not missing:
        log.info("%s already holds these %d files with the same content: nothing to upload", uri.shown,
                 len(records))  # fmt: skip
        return _Plan("unchanged", [], [], [], kept)
    log.info("%s holds %d of %d files already (an earlier, interrupted upload): sending the other %d",
             uri.shown, len(records) - len(missing), len(records), len(missing))  # fmt: skip
    return _Plan("resumed", missing, [], [], kept)


def _verify_published(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], kept: list[str], uri: StorageUri
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
    extra = sorted(set(by_path) - {r.path for r in records} - set(kept))
    if extra:
        raise StorageError(
            f"verification failed: {uri.shown} holds files that are not in the export: {extra[:5]}"
        )
    log.info("verified %d files at %s (sizes and checksums read back)", len(records), uri.shown)


def _records(src: Path, files: list[Path], hashes: dict[str, FileHash], max_workers: int) -> list[FileRecord]:
    known = {p: hashes.get(p.relative_to(src).as_posix()) for p in files}
    known = {p: h for p, h in known.items() if h is not None and h.matches(p)}
    known |= hash_files([p for p in files if p not in known], max_workers=max_workers)
    return [
        FileRecord(p.relative_to(src).as_posix(), h.size, h.sha256, h.md5, h.git_blob_sha1)
        for p, h in ((p, known[p]) for p in files)
    ]


def publish_directory(
    src: str | os.PathLike,
    uri: str | StorageUri,
    *,
    overwrite: bool = False,
    manifest: str | None = None,
    endpoint_url: str | None = None,
    private: bool = True,
    base_image: str = "",
    commit_message: str = "Upload with kfp-finetune",
    max_workers: int = 8,
    hashes: dict[str, FileHash] | None = None,
) -> PublishResult:
    """Make `uri` hold the files under `src`: an s3:// prefix, a local folder or an hf:// model repo
    (optionally a folder in it, @branch). Resumable, verified, conflict-aware, and touching only what it owns:

    - files already at the destination with the same content are not transferred again, so a rerun after an
      interruption only sends what is missing, and rerunning a finished export transfers nothing;
    - `manifest` (a path in `src` written by `manifest_text`: a first line naming the export, then sha256sum
      lines for the other files) is what the publish owns. Only a manifest with that first line counts: a
      user's own checksums file at the destination owns nothing. s3:// and local write an incomplete manifest
      first (claiming the earlier export's files and this one's, with no checksum line) and the finished one
      last, so its presence means the copy is complete and an interruption leaves every file it touched owned;
      a destination whose finished manifest lists this content with another first line keeps it (and `src`'s
      copy takes its text): the files are the earlier export's;
    - a destination holding different content (changed files, or files an earlier publish wrote that are not
      in `src`) is refused with DestinationConflict before anything is written, unless `overwrite`: then
      changed files are replaced and the earlier publish's other files deleted. Files no publish wrote (a
      user's notes in a shared folder, other models under the same prefix) are never touched, and one with a
      name this publish would write (a user's README.md, config.json or checksums file) is refused whatever
      `overwrite` says, naming it. In an hf:// repo (ours) every file counts as written by us (the hub's
      .gitattributes is kept);
    - the root of a disk or bucket is refused (`/`, `//`, `s3://bucket`); an hf:// repo root is fine;
    - local files appear atomically (temp name, then rename; temp files an interrupted run left are removed
      by the next). hf:// writes one commit, which is atomic; LFS objects uploaded by an interrupted run are
      not sent again.
    - afterwards every file is read back (sizes and the checksums the destination states: sha256, MD5 ETag or
      git blob id) and compared with `src`; when that fails the manifest becomes the incomplete one again, so
      a copy that does not hold `src` never looks complete.

    `hashes` (path in `src` -> FileHash, e.g. what training recorded) are used for every file whose size and
    mtime still match; only the other files are hashed (in parallel, once).

    An oci:// tag is one image (oci.py): `base_image`'s layers, then the files under /models.
    hf:// repos are created when missing, private unless `private=False`. Credentials come from the
    environment only (HF_TOKEN, AWS_*); missing ones fail before any transfer.
    """
    src = Path(src)
    uri = parse_uri(uri)
    scheme = scheme_module(uri)
    if not scheme.WRITABLE:
        raise ValueError(
            f"cannot publish to {uri.shown!r}: use an s3://, hf://, oci:// or local path destination"
        )
    refuse_root(uri)
    dest = scheme.destination(
        uri, endpoint_url=endpoint_url, private=private, base_image=base_image, commit_message=commit_message
    )
    scheme.require_credentials(uri)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise StorageError(f"nothing to publish: {src} holds no files")
    records = _records(src, files, hashes or {}, max_workers)
    if manifest is not None and manifest not in {r.path for r in records}:
        raise ValueError(f"manifest {manifest!r} is not a file in {src}")
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    remote = scheme.existing(dest)
    earlier = _earlier(scheme, dest, remote, manifest)
    if manifest is not None:
        records = _keep_identity(src, manifest, records, earlier)
    plan = _plan(src, records, remote, earlier, manifest, uri, overwrite)
    options = {"max_workers": max_workers}
    with tempfile.TemporaryDirectory() as claim_dir:
        claim = Path(claim_dir)
        if plan.upload or plan.delete:
            content = [r for r in plan.upload if r.path != manifest]
            last = [r for r in plan.upload if r.path == manifest]
            # First the claim (an incomplete manifest naming every file of the earlier export and this one):
            # an interruption from here on leaves them ours, so the next run replaces or removes them, and a
            # half-written copy never looks complete. Then the earlier export's other files go, the content
            # comes, and the finished manifest is written last.
            first = []
            if manifest is not None and not scheme.ATOMIC_CHANGES and (content or plan.delete):
                first = [_write_claim(claim, src, manifest, records, earlier)]
            with Progress(
                what=f"upload to {uri.shown}",
                total_files=len(plan.upload) + len(first),
                total_bytes=sum(r.size for r in plan.upload + first),
            ) as progress:
                options["progress"] = progress
                if scheme.ATOMIC_CHANGES:  # one commit: never seen half-replaced, the manifest needs no order
                    scheme.put(dest, src, plan.upload, plan.delete, **options)
                else:
                    if first:
                        scheme.put(dest, claim, first, [], **options)
                    if plan.delete:
                        scheme.put(dest, src, [], plan.delete, **options)
                    scheme.put(dest, src, content, [], **options)
                    if last:
                        scheme.put(dest, src, last, [], **options)
        try:
            _verify_published(src, records, scheme.existing(dest), plan.kept, uri)
        except StorageError:
            # A copy that failed verification never looks complete: its manifest becomes the claim again.
            if manifest is not None and not scheme.ATOMIC_CHANGES:
                record = _write_claim(claim, src, manifest, records, earlier)
                with Progress(
                    what=f"mark {uri.shown} incomplete", total_files=1, total_bytes=record.size
                ) as progress:
                    scheme.put(dest, claim, [record], [], max_workers=max_workers, progress=progress)
            raise
    uploaded = [r.path for r in plan.upload]
    return PublishResult(uri.shown, plan.state, records, uploaded, plan.delete, plan.kept, dest.head)


def _keep_identity(
    src: Path, manifest: str, records: list[FileRecord], earlier: _Earlier
) -> list[FileRecord]:
    """When the destination's finished manifest lists exactly these files with these checksums, it stays as it
    is, naming the export that wrote them: `src`'s manifest takes its text (so nothing differs, nothing is sent)."""
    staged = (src / manifest).read_text()
    if not staged.startswith(MANIFEST_MARK):
        raise ValueError(f"manifest {manifest!r} in {src} was not written with manifest_text()")
    if not earlier.complete or earlier.manifest in (None, staged):
        return records
    if _entries(earlier.manifest) != _entries(staged):
        return records
    (src / manifest).unlink()  # a new file: never edit one that may be linked elsewhere
    kept = _write_small(src / manifest, manifest, earlier.manifest)
    return [kept if r.path == manifest else r for r in records]


def _write_small(path: Path, rel: str, text: str) -> FileRecord:
    """Write a small text we hold in memory; its record is hashed from memory, not read back."""
    data = text.encode()
    path.write_bytes(data)
    return FileRecord(rel, len(data), hashlib.sha256(data).hexdigest())


def _write_claim(
    folder: Path, src: Path, manifest: str, records: list[FileRecord], earlier: _Earlier
) -> FileRecord:
    """The claim as `folder`/`manifest`, to be put from `folder`."""
    path = folder / manifest
    path.parent.mkdir(parents=True, exist_ok=True)
    return _write_small(path, manifest, _claim(src, manifest, records, earlier))
