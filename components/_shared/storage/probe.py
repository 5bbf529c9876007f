"""The probe verb (pre-flight): can the environment's credentials write to a publish destination? Checked before
any download or training, so a wrong bucket, a read-only token or an unwritable folder fails a run in seconds
instead of after hours. Each scheme module answers for itself (`probe`); a probe leaves nothing behind."""

from __future__ import annotations

from .publish import refuse_root
from .schemes import scheme_module
from .uri import StorageUri, parse_uri


def probe_destination(uri: str | StorageUri, *, endpoint_url: str | None = None) -> None:
    """Raise ValueError (not a destination form) or StorageError (naming the fix) unless `uri` can be published
    to with the environment's credentials: s3:// writes and deletes a small object under the prefix, hf:// asks
    the hub what the token may do, a local path needs a writable folder (or nearest existing parent)."""
    uri = parse_uri(uri)
    scheme = scheme_module(uri)
    if not scheme.WRITABLE:
        raise ValueError(f"cannot publish to {uri.shown!r}: use an s3://, hf:// or local path destination")
    refuse_root(uri)
    scheme.require_credentials(uri)
    scheme.probe(uri, endpoint_url=endpoint_url)
