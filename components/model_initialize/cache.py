"""The persistent model cache: a folder on a volume that outlives runs (`cache_path`), so a scheduled run with an
unchanged base model copies 0 bytes.

    <cache>/models/<name>-<fingerprint[:12]>/         a complete, verified model + manifest.json
    <cache>/models/.<name>-<fingerprint[:12]>.partial/ the fetch in progress (kept across killed attempts)
    <cache>/models/.<name>-<fingerprint[:12]>.lock     flock'ed while one run checks or fills the entry

Entries are content-addressed (the listing's fingerprint: what the source states about each file's content, e.g. an
S3 ETag and LastModified, a hub commit and sha256, a local file's sha256), so a changed source makes a new entry
and never replaces one another run may be training from. The workspace entry is made of hard links to the cache
entry (same filesystem: 0 bytes copied); where links cannot be made (EXDEV: the cache is its own volume) the cache
entry is used in place.

Trust on reuse. A hit is verified against the sha256 its manifest records before it is linked (storage.damaged_files:
a file is hashed again whenever its inode, size, mtime or ctime changed since it was last proven, so bytes changed
in place are found even with the mtime set back); a damaged entry is discarded and filled again, and the step log
says which file. Hard links share their inode, so every hit also changes ctime and the next hit hashes the entry
again: one read of the model per run, a small fraction of fetching it.

Read-only by mode, verified by content. Entry files are made mode 0444, so a step running as a non-root user cannot
write through its workspace link into the shared entry (an editor or a tool that replaces a file by rename only
breaks its own link). Mode bits do not stop root, and KFP steps often run as root: there the guarantee is the
verification above — a write through a link damages at most the run that made it, and the next run finds the entry
changed and refills it. We keep hard links rather than copies because no step writes into a base model folder
(torchtune reads the base checkpoint and writes to the run folder); copies would cost a model's bytes per run.

Eviction. Every run that uses an entry marks it used, in the mtime of its lock file: a hit or a fill when it takes
the lock and when it is done, a fine-tune when it starts. A hit's checksum ledger counts as a use too, so entries
that older versions used are kept. After using the cache, a run removes the entries (and the partial folders of
killed fetches) no run has used for `keep_days`: a source whose content changed leaves its old entry behind, and a
schedule would otherwise fill the volume one version at a time. An entry is removed only under its lock, taken
without waiting (one a run is checking or filling is skipped), and renamed out of its name before it is deleted,
so no run sees half of it; an error removing one is logged and never fails the run. A workspace made of hard
links keeps its files when the entry goes; a run using an entry in place reads the cache entry itself, so
`keep_days` must be longer than the longest fine-tune (a resume re-reads the base model). Lock files stay:
removing one another run has opened would let two runs hold the lock at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.storage.checksums import ledger_path
from kfp_finetune.components._shared.unset import UNSET_NUMBER
from kfp_finetune.components._shared.workspace import (
    MODEL_CACHE_AREA,
    atomic_dir,
    cache_lock_path,
    mark_cache_use,
    partial_path,
)

log = get_logger(__name__)

# How messages name the setting: the pipeline parameter, and the component argument it feeds.
SETTING = "model_cache_path (model-initialize's cache_path)"
KEEP_DAYS_SETTING = "model_cache_keep_days (model-initialize's cache_keep_days)"
DAY_SECONDS = 24 * 60 * 60
# Days an entry no run uses stays: longer than any fine-tune, short enough that a monthly schedule keeps its model.
DEFAULT_KEEP_DAYS = 30


def check_cache_path(cache_path: str) -> None:
    """SettingError naming the pipelines' `model_cache_path` (which feeds `cache_path`) unless the cache's model
    area can be written there: an absolute folder (made when missing) in which a file can be created, which is the
    test a read-only mount, a file in its place or a missing permission cannot pass. Checked before the source is
    listed."""
    fix = (
        "name a folder on a read-write volume that outlives runs (e.g. a PVC), or leave it empty for no cache"
    )
    if not os.path.isabs(cache_path):
        raise SettingError(SETTING, f"must be an absolute path (got {cache_path!r}): {fix}")
    area = Path(cache_path) / MODEL_CACHE_AREA
    existing = next(p for p in (area, *area.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise SettingError(SETTING, f"{cache_path}: {existing} is a file, not a folder: {fix}")
    try:
        area.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=area, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise SettingError(
            SETTING, f"{cache_path} cannot be written ({exc.strerror or exc}): {fix}"
        ) from None


def check_keep_days(keep_days: int) -> None:
    """SettingError unless `keep_days` is a whole number of days, at least 1, or -1 (never remove an entry)."""
    if keep_days == UNSET_NUMBER:
        return
    if isinstance(keep_days, bool) or not isinstance(keep_days, int) or keep_days < 1:
        raise SettingError(
            KEEP_DAYS_SETTING,
            f"must be 1 or more days, or -1 to keep every entry (got {keep_days!r}): a run using an entry in place "
            "reads it until it ends, so set it above the longest run",
        )


def cache_entry(cache_path: str | os.PathLike, name: str, fingerprint: str) -> Path:
    return Path(cache_path) / MODEL_CACHE_AREA / f"{name}-{fingerprint[:12]}"


@contextlib.contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Hold the entry's lock file (fcntl.flock beside it): a second run fetching the same model waits here. Taking
    it marks the entry used, so a fill in progress (its partial folder) is not evicted by a cache whose
    filesystem does not share flocks between hosts."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_lock_path(entry), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another run holds %s in the model cache: waiting for it", entry.name)
            fcntl.flock(lock, fcntl.LOCK_EX)
            log.info("the other run is done with %s", entry.name)
        mark_cache_use(entry)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def link_file(src: Path, dst: Path) -> None:
    """The one place the cache makes a hard link (tests make it fail with EXDEV to act as another volume)."""
    os.link(src, dst)


def make_read_only(entry: Path) -> None:
    """Files of a cache entry are 0444 (the workspace links share the mode); only files not so yet are changed."""
    for path in entry.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o222:
            path.chmod(0o444)


def links_to(final: Path, entry: Path) -> bool:
    """True when the workspace entry `final` is made of hard links to exactly the files of `entry`."""
    files = sorted(p.relative_to(entry) for p in entry.rglob("*") if p.is_file())
    linked = sorted(p.relative_to(final) for p in final.rglob("*") if p.is_file()) if final.is_dir() else []
    return files == linked and all(os.path.samefile(entry / rel, final / rel) for rel in files)


def link_or_use_in_place(entry: Path, final: Path) -> str:
    """Make `final` (the workspace entry) of hard links to every file of `entry`; return "hardlink". When the
    cache is on another filesystem (EXDEV) nothing is made and "in place" is returned: use `entry` itself."""
    try:
        with atomic_dir(final) as tmp:
            for src in sorted(p for p in entry.rglob("*") if p.is_file()):
                dst = tmp / src.relative_to(entry)
                dst.parent.mkdir(parents=True, exist_ok=True)
                link_file(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        log.info("the model cache is on another volume (%s): using the cache entry in place", exc.strerror)
        return "in place"
    return "hardlink"


def last_used(entry: Path) -> float:
    """When a run last used `entry`, as a POSIX time: its lock file's mtime (workspace.mark_cache_use), or the
    last time a hit verified it (its checksum ledger, rewritten by every hit, also by kfp-finetune versions that
    did not mark use yet), whichever is later."""
    times = [path.stat().st_mtime for path in (cache_lock_path(entry), ledger_path(entry)) if path.exists()]
    return max(times, default=0.0)


@dataclass(frozen=True)
class Evicted:
    name: str
    bytes: int


def _entry_names(area: Path) -> set[str]:
    """The entries the cache area has a lock file for: complete, partial, or removed (the lock stays)."""
    return {path.name[1 : -len(".lock")] for path in area.glob(".*.lock")}


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _remove(entry: Path) -> int | None:
    """Delete `entry` and its partial folder, each renamed out of its name first (to `.<entry>.old-*`, which
    atomic_dir and partial_dir also clear), with what an interrupted removal left; the bytes they held (a
    workspace made of hard links to them keeps its share), None when there was nothing to remove."""
    removed, found = 0, False
    for folder in (entry, partial_path(entry)):
        if folder.is_dir():
            removed, found = removed + _folder_bytes(folder), True
            folder.rename(entry.parent / f".{entry.name}.old-{uuid.uuid4().hex[:8]}")
    for gone in entry.parent.glob(f".{glob.escape(entry.name)}.old-*"):
        found = True
        shutil.rmtree(gone, ignore_errors=True)
        if gone.exists():
            log.warning("model cache: %s could not be deleted entirely; the next eviction tries again", gone)
    return removed if found else None


def evict_unused(cache_path: str | os.PathLike, keep_days: int, in_use: Path) -> list[Evicted]:
    """Remove the cache entries, with their partial folders, that no run has used for `keep_days` (-1: none), but
    `in_use`, the entry this run uses; an entry whose lock another run holds is skipped. The removed entries."""
    if keep_days == UNSET_NUMBER:
        return []
    area = Path(cache_path) / MODEL_CACHE_AREA
    cutoff = time.time() - keep_days * DAY_SECONDS
    evicted = []
    for name in sorted(_entry_names(area) - {in_use.name}):
        try:  # eviction tidies the cache: it never fails the run that uses it
            removed = _evict_if_unused(area / name, cutoff)
        except OSError as err:
            log.warning(
                "model cache: %s was not evicted (%s); it stays until a later run removes it", name, err
            )
            continue
        if removed is not None:
            evicted.append(Evicted(name, removed))
    return evicted


def _evict_if_unused(entry: Path, cutoff: float) -> int | None:
    """Remove `entry` when no run used it since `cutoff` and no run holds its lock; the bytes removed, or None."""
    held = [entry, partial_path(entry), *entry.parent.glob(f".{glob.escape(entry.name)}.old-*")]
    if last_used(entry) >= cutoff or not any(p.is_dir() for p in held):
        return None
    with open(cache_lock_path(entry), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a run is checking or filling it: in use
        try:
            if last_used(entry) >= cutoff:  # again under the lock: a run may have used it meanwhile
                return None
            return _remove(entry)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
