"""Storage URIs: list and fetch files from the Hugging Face Hub, S3 (incl. MinIO/Ceph), local paths and https,
and OCI registries (ModelCar images), and publish a folder to s3://, hf://, oci:// or a local path.

Supported forms (see SUPPORTED_FORMS):

    hf://<org>/<repo>[/<path/in/repo>][@<revision>]   (also hf://datasets/<org>/<name>, as HfFileSystem)
    s3://<bucket>[/<prefix>]            endpoint from a parameter or AWS_ENDPOINT_URL / S3_ENDPOINT_URL
    file:///abs/path  or  /abs/path     a file or a folder (e.g. a PVC mounted into the step)
    https://host/path/file.jsonl        a single file (datasets)
    oci://<registry>/<repository>[:tag] a KServe ModelCar image (files under /models); credentials from the docker
                                        config at $DOCKER_CONFIG

Credentials come only from the environment (HF_TOKEN, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN), which pipelines fill from Kubernetes Secrets; a URI's own (a presigned URL's query string,
`user:pass@`) is shown only through `redact_uri` / `redact_text` (every StorageError message and log line) and
is refused as a pipeline parameter (`refuse_credentials`). Remote names that could land outside a destination are
refused (HostileName) before anything is written.

Local sources follow symlinks only inside the source folder: by default a link whose target resolves outside it
(a model's `LICENSE.txt -> /etc/passwd`, a link to another team's data file or folder) is refused (LinkEscape,
naming the link and where it points) when the folder is listed, and each file is checked again as it is read
(`LocalRoot.open` / `LocalRoot.resolve`), so nothing outside the folder is read, copied, trained on or published.

`list_files(uri)` returns a `Listing` whose files carry what the source states about their content (checksums,
S3 ETag + LastModified, https validators; a local file's sha256), so `Listing.fingerprint` changes whenever the
content does; `download(listing, paths, dest)` copies the chosen files and verifies them, fetching a damaged file
once more before an IntegrityError, pinning S3 reads to the listed ETag (SourceChanged otherwise) and keeping an
earlier attempt's leftovers only when hashed again (fetch.py); `damaged_files(folder, records)` checks a reused
copy against its manifest, hashing a file again only after it changed (checksums.py); `verify_hub_cache(listing)` does the
same check for hub files the `datasets` library downloaded. `publish_directory(src, uri)` makes a destination hold exactly a folder (publish.py);
`probe_destination(uri)` checks, before any work, that it could, and `probe_source(uri)` that a source can be listed
and read (probe.py). One
module per scheme (hf, s3, local, https; registered in schemes.py) does the transfers.
"""

from kfp_finetune.components._shared.redact import redact_text, redact_uri

from .checksums import FileHash, damaged_files, hash_file, hash_files
from .errors import (
    CredentialsInParameter,
    DestinationConflict,
    HostileName,
    IntegrityError,
    SourceChanged,
    StorageError,
)
from .fetch import download, list_files
from .hf import truncated as hub_truncation
from .hf import verify_cached as verify_hub_cache
from .links import LinkEscape, LocalRoot
from .listing import FileRecord, Listing, RemoteFile
from .oci_base import check_base_image, parse_image
from .probe import probe_destination, probe_source
from .publish import (
    PublishResult,
    manifest_text,
    publish_directory,
    refuse_root,
    require_credentials,
)
from .retry import is_transient, with_retries
from .uri import SUPPORTED_FORMS, StorageUri, last_name, parse_uri, pinned_uri, refuse_credentials

__all__ = [
    "SUPPORTED_FORMS",
    "CredentialsInParameter",
    "DestinationConflict",
    "FileHash",
    "FileRecord",
    "HostileName",
    "IntegrityError",
    "LinkEscape",
    "Listing",
    "LocalRoot",
    "PublishResult",
    "RemoteFile",
    "SourceChanged",
    "StorageError",
    "StorageUri",
    "check_base_image",
    "damaged_files",
    "download",
    "hash_file",
    "hash_files",
    "hub_truncation",
    "is_transient",
    "last_name",
    "list_files",
    "manifest_text",
    "parse_image",
    "parse_uri",
    "pinned_uri",
    "probe_destination",
    "probe_source",
    "publish_directory",
    "redact_text",
    "redact_uri",
    "refuse_credentials",
    "refuse_root",
    "require_credentials",
    "verify_hub_cache",
    "with_retries",
]
