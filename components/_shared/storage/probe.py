"""The probe verbs (pre-flight): can the environment's credentials write to a publish destination
(`probe_destination`), and list and read a source (`probe_source`)? Checked before any download or training, so a
wrong bucket, a read-only token or an unwritable folder fails a run in seconds instead of after hours. Each scheme
module answers for itself (`probe`, `list_files`, and `require_read` where a listing does not prove read access).

A probe leaves nothing behind, even when its pre-flight is killed between writing and deleting it: its name is
unique and says when it was made (names.probe_name), and the next pre-flight at that destination first removes the
probes older than names.PROBE_STALE_AFTER_SECONDS directly in the folder — exactly those names, never a user's
file that merely starts alike, and never a probe another run's pre-flight is writing now."""

from __future__ import annotations

from .fetch import list_files
from .listing import Listing
from .publish import refuse_root
from .schemes import scheme_module
from .uri import StorageUri, parse_uri


def probe_source(
    uri: str | StorageUri, *, repo_type: str = "model", endpoint_url: str | None = None
) -> Listing:
    """The source's listing, or ValueError (not a source form) / StorageError (naming the fix) unless it exists,
    holds files and the environment's credentials may list and read them: s3:// lists the prefix and reads one
    object's metadata (ListBucket and GetObject are separate permissions); hf:// lists the repo, reading a gated
    repo's file metadata with the token."""
    listing = list_files(uri, repo_type=repo_type, endpoint_url=endpoint_url)
    require_read = getattr(scheme_module(listing.uri), "require_read", None)  # where a listing is not enough
    if require_read is not None:
        require_read(listing)
    return listing


def probe_destination(uri: str | StorageUri, *, endpoint_url: str | None = None) -> None:
    """Raise ValueError (not a destination form) or StorageError (naming the fix) unless `uri` can be published
    to with the environment's credentials: s3:// writes and deletes a small object under the prefix, hf:// asks
    the hub what the token may do, a local path needs a writable folder (or nearest existing parent)."""
    uri = parse_uri(uri)
    scheme = scheme_module(uri)
    if not scheme.WRITABLE:
        raise ValueError(
            f"cannot publish to {uri.shown!r}: use an s3://, hf://, oci:// or local path destination"
        )
    refuse_root(uri)
    scheme.require_credentials(uri)
    scheme.probe(uri, endpoint_url=endpoint_url)
