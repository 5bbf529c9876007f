"""What a source holds (Listing of RemoteFile) and what was written (FileRecord, the manifest entry)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from .uri import StorageUri


@dataclass
class RemoteFile:
    """One file at the source. Checksums are the ones the source states (None when it states none)."""

    path: str
    size: int | None
    source_path: str = ""  # the full path in the repo / key in the bucket / local path
    sha256: str | None = None
    md5: str | None = None
    git_blob_sha1: str | None = None
    mtime_ns: int | None = None  # local files: detects a changed file of the same size


@dataclass
class Listing:
    """What a source holds: files (paths relative to the URI) and, for hf://, the revision resolved to a commit."""

    uri: StorageUri
    files: list[RemoteFile]
    revision: str | None = None
    commit_sha: str | None = None
    repo_type: str = "model"
    endpoint_url: str | None = field(default=None, repr=False)

    def by_path(self) -> dict[str, RemoteFile]:
        return {f.path: f for f in self.files}

    def fingerprint(self, paths: Iterable[str]) -> str:
        """Identifies this exact content of `paths`: equal fingerprints mean a previous copy is still current."""
        remote = self.by_path()
        state = [self.uri.raw, self.commit_sha] + [
            [p, remote[p].size, remote[p].sha256, remote[p].md5, remote[p].git_blob_sha1, remote[p].mtime_ns]
            for p in sorted(paths)
        ]
        return hashlib.sha256(json.dumps(state).encode()).hexdigest()


@dataclass
class FileRecord:
    """A file as written to the destination: the manifest entry."""

    path: str
    size: int
    sha256: str
    md5: str | None = field(default=None, compare=False)  # from the one hashing pass, when it took them
    git_blob_sha1: str | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}
