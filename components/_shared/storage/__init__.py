"""Storage URIs: list and fetch files from the Hugging Face Hub, S3 (incl. MinIO/Ceph), local paths and https,
and publish a folder to s3://, hf:// or a local path.

Supported forms (see SUPPORTED_FORMS):

    hf://<org>/<repo>[/<path/in/repo>][@<revision>]   (also hf://datasets/<org>/<name>, as HfFileSystem)
    s3://<bucket>[/<prefix>]            endpoint from a parameter or AWS_ENDPOINT_URL / S3_ENDPOINT_URL
    file:///abs/path  or  /abs/path     a file or a folder (e.g. a PVC mounted into the step)
    https://host/path/file.jsonl        a single file (datasets)

Credentials come only from the environment (HF_TOKEN, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN), which pipelines fill from Kubernetes Secrets; a URI's own (a presigned URL's query string,
`user:pass@`) is shown only through `redact_uri`. Remote names that could land outside a destination are
refused (HostileName) before anything is written.

`list_files(uri)` returns a `Listing`; `download(listing, paths, dest)` copies the chosen files and verifies
them, fetching a damaged file once more before an IntegrityError (fetch.py); `verify_hub_cache(listing)` does the
same check for hub files the `datasets` library downloaded. `publish_directory(src, uri)` makes a destination hold exactly a folder (publish.py);
`probe_destination(uri)` checks, before any work, that it could, and `probe_source(uri)` that a source can be listed
and read (probe.py). One
module per scheme (hf, s3, local, https; registered in schemes.py) does the transfers.
"""

from .checksums import FileHash, hash_file, hash_files
from .errors import DestinationConflict, HostileName, IntegrityError, StorageError
from .fetch import download, list_files
from .hf import truncated as hub_truncation
from .hf import verify_cached as verify_hub_cache
from .listing import FileRecord, Listing, RemoteFile
from .probe import probe_destination, probe_source
from .publish import PublishResult, publish_directory, refuse_root, require_credentials
from .retry import is_transient, with_retries
from .uri import SUPPORTED_FORMS, StorageUri, parse_uri, redact_uri

__all__ = [
    "SUPPORTED_FORMS",
    "DestinationConflict",
    "FileHash",
    "FileRecord",
    "HostileName",
    "IntegrityError",
    "Listing",
    "PublishResult",
    "RemoteFile",
    "StorageError",
    "StorageUri",
    "download",
    "hash_file",
    "hash_files",
    "hub_truncation",
    "is_transient",
    "list_files",
    "parse_uri",
    "probe_destination",
    "probe_source",
    "publish_directory",
    "redact_uri",
    "refuse_root",
    "require_credentials",
    "verify_hub_cache",
    "with_retries",
]
