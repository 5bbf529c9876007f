"""Output artifacts that point into the workspace: a small manifest file + metadata the KFP UI shows.

Heavy bytes stay in the workspace; the artifact records where they are (workspace-relative path) and what they
are (source, revision, files, sizes, sha256). Implementations take any object with `.path` and `.metadata`
(a KFP artifact, or a SimpleNamespace in tests), so they run without KFP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.names import instance_name

log = get_logger(__name__)


class ArtifactLike(Protocol):
    path: str
    metadata: dict


def write_artifact(artifact: ArtifactLike | None, manifest: dict, metadata: dict[str, Any]) -> None:
    """Write `manifest` as the artifact's file and merge `metadata` into its metadata (JSON-safe values)."""
    if artifact is None:
        return
    path = Path(artifact.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    artifact.metadata.update(json.loads(json.dumps(metadata)))


def entry_name(explicit: str, source: str, task_id: str = "") -> str:
    """The workspace entry name: `explicit`, else the last meaningful part of the source's path, made path-safe
    (only the path: a URI's query string or userinfo may hold credentials), followed by a hash of the KFP task id
    (see names.instance_name), so two sources whose paths end alike, or two uses of one source, get two entries."""
    if explicit and ("/" in explicit or "\\" in explicit or explicit.strip(".") == ""):
        # A name the user typed is refused, not rewritten: they would look for it under the name they gave.
        raise ValueError(f"invalid workspace entry name {explicit!r}: use a plain name without '/'")
    return instance_name(explicit or _source_name(source), task_id)


def _source_name(source: str) -> str:
    if "://" in source:
        parts = urllib.parse.urlsplit(source)
        source = (parts.hostname or "") + parts.path
    base = source.split("@", 1)[0].rstrip("/")
    base = base.rsplit("/", 1)[-1] or "default"
    base = re.sub(r"\.(jsonl|json|csv|parquet|arrow|txt)$", "", base)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip(".-") or "default"


def remove_stale_temps(final: Path) -> None:
    """Remove temp dirs a killed earlier attempt left beside `final` (see workspace.atomic_dir)."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        log.info("removing %s left by an interrupted earlier attempt", stale)
        shutil.rmtree(stale, ignore_errors=True)


def workspace_relative(path: Path, workspace: str | os.PathLike) -> str:
    return Path(path).resolve().relative_to(Path(workspace).resolve()).as_posix()


def entry_path(workspace: str | os.PathLike, recorded: str) -> Path:
    """Where an artifact's recorded entry (`workspace_path`, `merged_path`, ...) is: relative paths lie in the
    run workspace; an absolute one is a model used in place from a persistent cache volume (model-initialize's
    `cache_path`), which every step that reads it must mount as well."""
    path = Path(recorded)
    return path if path.is_absolute() else Path(workspace) / path


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
