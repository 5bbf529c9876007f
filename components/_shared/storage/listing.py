"""What a source holds (Listing of RemoteFile) and what was written (FileRecord, the manifest entry)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .uri import StorageUri


@dataclass
class RemoteFile:
    """One file at the source. Checksums are the ones the source states (None when it states none); `stated` holds
    the other facts it states that change whenever the content does (S3: `etag`, multipart ones included, and
    `last_modified`, and after `Listing.settle` the `version_id` and `checksum_*`; https: `etag`, `last_modified`),
    so two versions of a file with the same size never look alike. Local files get their sha256 from
    `Listing.settle` (a plain folder states nothing)."""

    path: str
    size: int | None
    source_path: str = ""  # the full path in the repo / key in the bucket / local path
    sha256: str | None = None
    md5: str | None = None
    git_blob_sha1: str | None = None
    mtime_ns: int | None = None
    stated: dict[str, str] = field(default_factory=dict)

    def identity(self) -> list:
        """What identifies this content at the source: equal identities mean the same bytes (as far as the source
        can say; a size alone says nothing)."""
        return [
            self.size,
            self.sha256,
            self.md5,
            self.git_blob_sha1,
            [[k, v] for k, v in sorted(self.stated.items())],
        ]

    def identified(self) -> bool:
        """True when the source states something about the content besides its size (a checksum or `stated`)."""
        return self.states_checksum() or bool(self.stated)

    def states_checksum(self) -> bool:
        """True when the source states a checksum a copy can be verified against (not an ETag of unknown kind)."""
        return bool(self.sha256 or self.md5 or self.git_blob_sha1)


@dataclass
class Listing:
    """What a source holds: files (paths relative to the URI) and, for hf://, the revision resolved to a commit."""

    uri: StorageUri
    files: list[RemoteFile]
    revision: str | None = None
    commit_sha: str | None = None
    repo_type: str = "model"
    endpoint_url: str | None = field(default=None, repr=False)
    # Adds to the chosen files what the listing itself does not state (a local file's sha256, an S3 object's
    # version id and x-amz-checksum-*), for `settle`; called again for the same files it does nothing.
    describe: Callable[[list[RemoteFile]], None] | None = field(default=None, repr=False, compare=False)

    def by_path(self) -> dict[str, RemoteFile]:
        return {f.path: f for f in self.files}

    def settle(self, paths: Iterable[str]) -> None:
        """Give every file of `paths` the identity its scheme can know beyond the listing (a local file's sha256,
        hashed once per process; an S3 object's version id and checksums, from one HEAD)."""
        if self.describe:
            remote = self.by_path()
            self.describe([remote[p] for p in paths if p in remote])

    def fingerprint(self, paths: Iterable[str]) -> str:
        """Identifies this exact content of `paths`: equal fingerprints mean a previous copy is still current. A
        file its source states nothing about but its size (an https server without ETag / Last-Modified) makes
        the fingerprint unique to this listing: such content is never taken to be unchanged."""
        paths = sorted(paths)
        self.settle(paths)
        remote = self.by_path()
        state = [self.uri.raw, self.commit_sha] + [[p, remote[p].identity()] for p in paths]
        if not all(remote[p].identified() for p in paths):
            state.append(uuid.uuid4().hex)
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
