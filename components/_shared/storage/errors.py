"""The errors storage raises; each message names the source and says what to do."""

from __future__ import annotations


class StorageError(RuntimeError):
    """A source could not be read or a destination written; the message names it and what to do."""


class DestinationConflict(StorageError):
    """The destination holds different content and overwrite was not requested."""


class HostileName(StorageError):
    """A remote name that would write outside the destination (absolute, `..`, control characters, ...)."""


class IntegrityError(StorageError):
    """Bytes read do not match what their source states (size, sha256, MD5 ETag or git blob id)."""


class SourceChanged(StorageError):
    """A file changed at the source after it was listed: one attempt never mixes two versions of a source."""
