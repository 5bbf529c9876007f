"""The errors storage raises; each message names the source and says what to do."""

from __future__ import annotations

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.redact import redact_text


class StorageError(RuntimeError):
    """A source could not be read or a destination written; the message names it and what to do. A URL in the
    message (one a client's error named) is redacted: the message reaches step logs and the UI."""

    def __init__(self, message: str):
        super().__init__(redact_text(message))


class CredentialsInParameter(SettingError):
    """A URI given as a parameter (`setting`, named as the pipeline user sets it) carries credentials (a presigned
    query, user:password@); `problem` says why that is refused and how to pass them through a Secret."""


class DestinationConflict(StorageError):
    """The destination holds different content and overwrite was not requested."""


class HostileName(StorageError):
    """A remote name that would write outside the destination (absolute, `..`, control characters, ...)."""


class IntegrityError(StorageError):
    """Bytes read do not match what their source states (size, sha256, MD5 ETag or git blob id)."""


class SourceChanged(StorageError):
    """A file changed at the source after it was listed: one attempt never mixes two versions of a source."""
