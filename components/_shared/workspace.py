"""The run workspace layout (DESIGN.md §1) and all-or-nothing writes into it.

    <workspace>/datasets/<name>-<task>/   parquet shards + manifest.json
    <workspace>/models/<name>-<task>/     HF-layout model + manifest.json
    <workspace>/runs/<trainjob name>/     resolved torchtune YAML, logs, checkpoints (exports/ stages the export)
    <workspace>/eval/<name>-<task>/       evaluation report and samples
    <workspace>/.cache/compile/<key>/     torch.compile's kernels, per torch version and GPU model (warm_start.py)

`<name>` is readable (the source's file or repo name, the fine-tune's tune_run_name); `<task>` is 8 hex characters
of a hash of KFP's id of the step's task instance (names.instance_name), and the TrainJob's name hashes it too, so
two uses of a step in one run (nested DAGs, sweep trials, sources whose paths end alike) never share an entry.

A step writes into a hidden temp dir beside the destination and renames it into place only when the content is
complete, so a failed or killed step never leaves something that looks finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "manifest.json"
# Names starting with this inside a partial folder are the transfer's own scratch (storage.fetch), never content.
SCRATCH_PREFIX = ".kfp-"
PARTIAL_JOURNAL = SCRATCH_PREFIX + "verified.jsonl"
AREAS = ("datasets", "models", "runs", "eval")
# The persistent model cache (model-initialize's cache_path), which outlives runs: `<cache>/models/<entry>/`
# (model_initialize/cache.py) and torch.compile's kernels beside it, `<cache>/compile/<key>/` (warm_start.py), as
# in the workspace's own `.cache/compile/<key>/`.
MODEL_CACHE_AREA = "models"
COMPILE_CACHE_AREA = "compile"


def cache_lock_path(entry: str | os.PathLike) -> Path:
    """The lock file of a model cache entry, `<cache>/models/.<entry>.lock`: flock'ed while a run checks or fills
    the entry, and its mtime is when a run last used the entry (model_initialize/cache.py)."""
    entry = Path(entry)
    return entry.parent / f".{entry.name}.lock"


def mark_cache_use(entry: str | os.PathLike) -> None:
    """Record that a run uses the model cache `entry` now (its lock file's mtime), so eviction keeps it."""
    cache_lock_path(entry).touch()  # sets the mtime of an existing file too


def area_dir(workspace: str | os.PathLike, area: str, name: str) -> Path:
    """`<workspace>/<area>/<name>`, refusing names that would escape the area."""
    if area not in AREAS:
        raise ValueError(f"unknown workspace area {area!r}; expected one of {AREAS}")
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"invalid workspace entry name {name!r}: use a plain name without '/'")
    return Path(workspace) / area / name


def compile_cache_root(run_dir: str | os.PathLike) -> Path | None:
    """`<workspace>/.cache/compile` for a run folder of this layout (`<workspace>/runs/<name>`), else None."""
    run_dir = Path(run_dir)
    return run_dir.parent.parent / ".cache" / COMPILE_CACHE_AREA if run_dir.parent.name == "runs" else None


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp dir; on success replace `final` with it, on error remove it. Old copies an earlier
    replace left when it was interrupted (`.<name>.old-*`) are removed first. (Temp dirs are the callers' to
    clear, e.g. artifacts.remove_stale_temps: a caller may hold a live `.<name>.tmp-scratch-*` beside us.)"""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace(tmp, final)


def partial_path(final: str | os.PathLike) -> Path:
    """`<parent>/.<name>.partial`: the stable folder a transfer into `final` writes to (see partial_dir)."""
    final = Path(final)
    return final.parent / f".{final.name}.partial"


@contextlib.contextmanager
def partial_dir(
    final: str | os.PathLike, *, discard_on: tuple[type[BaseException], ...] = ()
) -> Iterator[Path]:
    """Yield the stable partial folder of `final` (no random suffix), with whatever an earlier, killed or failed
    attempt left in it; on success remove the transfer's scratch (SCRATCH_PREFIX names) and replace `final` with
    it; on error keep it, so a retried step resumes (storage.download keeps what it can prove) — unless the error
    is one of `discard_on`: a source that is itself unusable, which no retry of the same source can fix. Nothing
    partial ever looks finished: `final` appears only by the rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = partial_path(final)
    partial.mkdir(exist_ok=True)
    try:
        yield partial
    except discard_on:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for scratch in partial.glob(SCRATCH_PREFIX + "*"):
        shutil.rmtree(scratch) if scratch.is_dir() and not scratch.is_symlink() else scratch.unlink()
    _replace(partial, final)


def _replace(tmp: Path, final: Path) -> None:
    if final.exists():
        stale = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, stale)
        os.rename(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.rename(tmp, final)


def write_json_atomic(path: str | os.PathLike, data: object) -> None:
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_manifest(directory: str | os.PathLike) -> dict | None:
    """The manifest of a complete entry, or None when there is none (or it is unreadable)."""
    path = Path(directory) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
