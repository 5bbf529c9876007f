"""s3:// — S3 and compatible stores (MinIO, Ceph) through boto3; credentials from the AWS_* environment."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.redact import redact_uri

from .errors import IntegrityError, SourceChanged, StorageError
from .listing import FileRecord, Listing, RemoteFile
from .names import PROBE_PREFIX, is_stale_probe, probe_name, write_target
from .parallel import run_parallel
from .progress import Progress
from .retry import is_transient, status_code, with_retries
from .uri import StorageUri

log = get_logger(__name__)

COUNTS_FILES_ON_DISK = False
WRITABLE = True
ATOMIC_CHANGES = False
OWNS_DESTINATION = False  # shared: overwrite removes only what an earlier manifest lists


# Connections and part sizes. The defaults this replaces: botocore's Config(max_pool_connections=10) keeps at most
# 10 connections per client, and s3transfer's TransferConfig(multipart_threshold=8 MiB, multipart_chunksize=8 MiB,
# max_concurrency=10) cuts a 5 GB safetensors shard into 640 parts sent 10 at a time (we used to ask for 4).
# - POOL_CONNECTIONS: one client (and so one pool) serves every file of a fetch or a put; 64 connections.
# - PART_SIZE: 64 MiB parts: a 5 GB shard is 80 requests instead of 640 (S3 allows 10,000 parts, so up to
#   640 GB per object); files up to 64 MiB go in one request, so their ETag is their MD5 (read-back checks it).
# - FILE_WORKERS: many small files (tokenizer, config, parquet shards) need many files at once to use the pool:
#   up to 32 files in flight (the `max_workers` parameter only ever raises this).
# - files x parts <= pool: each file gets POOL_CONNECTIONS // (files in flight) parallel parts, so one big shard
#   uses all 64 connections, 4 shards 16 each, 32 small files 2 each; nothing waits for or overflows the pool.
POOL_CONNECTIONS = 64
PART_SIZE = 64 << 20
FILE_WORKERS = 32


def _concurrency(items: int, max_workers: int) -> tuple[int, int]:
    """(files in flight, parts in flight per file) for `items` files: their product stays within the pool."""
    files = max(1, min(items, max(max_workers, FILE_WORKERS), POOL_CONNECTIONS))
    return files, max(1, POOL_CONNECTIONS // files)


def _transfer_config(parts: int):
    """The one TransferConfig of uploads and downloads: PART_SIZE parts, `parts` of them at once."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE, max_concurrency=parts)


def endpoint(endpoint_url: str | None = None) -> str | None:
    """The S3 endpoint: the parameter, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / S3_ENDPOINT_URL, else AWS."""
    return (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("S3_ENDPOINT_URL")
        or None
    )


def _client(endpoint_url: str | None):
    import boto3
    from botocore.config import Config

    # Path-style addressing works for AWS and is what MinIO/Ceph expect on a custom endpoint.
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"},
        max_pool_connections=POOL_CONNECTIONS,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint(endpoint_url), config=config)


def _where(uri: StorageUri, endpoint_url: str | None, key: str | None = None) -> str:
    shown = f"s3://{uri.bucket}/{key}" if key else uri.shown
    return f"{shown} (endpoint {redact_uri(endpoint(endpoint_url) or 'AWS default')})"


def _gave_up(exc: BaseException, where: str) -> StorageError | None:
    """Retries run out (botocore's, then ours): S3 kept answering an error status (`SlowDown` 503, 500,
    throttling), or s3transfer kept losing the connection while reading an object (RetriesExceededError)."""
    from boto3.exceptions import RetriesExceededError
    from botocore.exceptions import ClientError
    from s3transfer.exceptions import RetriesExceededError as TransferRetriesExceeded

    if isinstance(exc, RetriesExceededError | TransferRetriesExceeded):
        last = exc.last_exception
        return StorageError(
            f"reading {where} broke off on every attempt ({type(last).__name__}: {str(last).splitlines()[0]}): "
            "the network or the S3 endpoint keeps dropping the connection; try again later."
        )
    if isinstance(exc, ClientError) and is_transient(exc):
        status = f"HTTP {status_code(exc)}"
        code = exc.response.get("Error", {}).get("Code", "")
        answer = f"{code} ({status})" if code and not code.isdigit() else status
        return StorageError(
            f"S3 kept answering {answer} to {exc.operation_name} for {where} after every retry: the store is "
            "overloaded or throttling; try again later."
        )
    return None


def error(
    exc: BaseException, uri: StorageUri, endpoint_url: str | None, key: str | None = None
) -> StorageError | None:
    """Turn a boto3 error into a message that names the bucket (and `key`) / endpoint and says what to do."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    where = _where(uri, endpoint_url, key)
    if isinstance(exc, EndpointConnectionError):
        return StorageError(f"cannot reach the S3 endpoint of {where} ({exc}): check s3_endpoint_url.")
    if isinstance(exc, NoCredentialsError):
        return StorageError(
            f"no S3 credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."
        )
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            return StorageError(f"bucket {uri.bucket!r} does not exist at {where}.")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            return StorageError(
                f"S3 rejected the credentials for {where} ({code}): check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN."
            )
        if code in ("AccessDenied", "403", "Forbidden"):
            return StorageError(f"access denied to {where}: the credentials lack s3:GetObject/ListBucket.")
        if code in ("NoSuchKey", "404", "NotFound"):
            return StorageError(f"no such object at {where}.")
    return _gave_up(exc, where)


@contextlib.contextmanager
def _mapped(uri: StorageUri, endpoint_url: str | None, key: str | None = None) -> Iterator[None]:
    """boto3's errors inside as StorageErrors naming `uri` (and the object `key`, when one is in play)."""
    from boto3.exceptions import RetriesExceededError, S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError, RetriesExceededError) as exc:
        raise (error(exc, uri, endpoint_url, key) or exc) from exc
    except S3UploadFailedError as exc:  # boto3's transfer manager wraps the ClientError
        cause = exc.__cause__ or exc.__context__
        raise ((error(cause, uri, endpoint_url, key) if cause else None) or exc) from exc


def _md5_etag(etag: str) -> str | None:
    # A single-part upload's ETag is the MD5 of the content; multipart ETags contain '-'.
    etag = etag.strip('"')
    return etag if len(etag) == 32 and "-" not in etag else None


def _stated(obj: dict) -> dict[str, str]:
    """What a listing states about an object's content besides its size: the ETag (a multipart one too: it is no
    MD5, yet any re-upload changes it or at least LastModified) and LastModified."""
    stated = {"etag": obj.get("ETag", "")}  # quoted, as If-Match wants it (RFC 9110 entity-tag)
    if obj.get("LastModified"):
        stated["last_modified"] = obj["LastModified"].isoformat()
    return {k: v for k, v in stated.items() if v}


# The x-amz-checksum-* S3 may keep for an object (HeadObject's Checksum<name>).
_CHECKSUMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")


def _describer(client, uri: StorageUri, endpoint_url: str | None):
    """`Listing.describe` for S3: one HEAD (ChecksumMode ENABLED) per chosen object adds what only a HEAD states —
    the version id and the checksums S3 keeps for it. A SHA256 without a `-<parts>` suffix is of the whole
    object: it becomes the file's sha256, so a copy (or a retry's leftover) is verified against it."""
    described: set[str] = set()

    def one(remote: RemoteFile) -> None:
        key = remote.source_path
        with _mapped(uri, endpoint_url, key):
            head = with_retries(
                lambda: client.head_object(Bucket=uri.bucket, Key=key, ChecksumMode="ENABLED"),
                what=f"read the metadata of s3 {key}",
            )
        if remote.stated.get("etag") not in (None, head.get("ETag")):
            raise SourceChanged(
                f"{uri.shown}: {remote.path} (key {key}) was replaced at the source after it was listed: run the "
                "step again."
            )
        if head.get("VersionId") not in (None, "null"):
            remote.stated["version_id"] = head["VersionId"]
        for name in _CHECKSUMS:
            if head.get(f"Checksum{name}"):
                remote.stated[f"checksum_{name.lower()}"] = head[f"Checksum{name}"]
        whole = head.get("ChecksumSHA256", "")
        if whole and "-" not in whole:
            remote.sha256 = base64.b64decode(whole).hex()
        described.add(key)

    def describe(files: list[RemoteFile]) -> None:
        run_parallel(one, [f for f in files if f.source_path not in described], FILE_WORKERS)

    return describe


def list_files(uri: StorageUri, *, repo_type: str, endpoint_url: str | None) -> Listing:
    client = _client(endpoint_url)
    prefix = uri.path

    def list_all() -> list[RemoteFile]:
        files: list[RemoteFile] = []
        # A prefix naming one object is a single file; otherwise it is a folder.
        dir_prefix = f"{prefix}/" if prefix else ""
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith("/"):
                    continue  # folder marker
                if key == prefix:
                    rel = key.rsplit("/", 1)[-1]
                elif key.startswith(dir_prefix):
                    rel = key[len(dir_prefix) :]
                else:
                    continue  # s3://b/data must not match s3://b/data2/x
                files.append(
                    RemoteFile(rel, obj["Size"], key, md5=_md5_etag(obj.get("ETag", "")), stated=_stated(obj))
                )
        return files

    with _mapped(uri, endpoint_url):
        files = with_retries(list_all, what=f"list {uri.shown}")
    if not files:
        raise StorageError(f"no objects under {_where(uri, endpoint_url)}.")
    return Listing(uri, files, endpoint_url=endpoint_url, describe=_describer(client, uri, endpoint_url))


def require_read(listing: Listing) -> None:
    """The credentials may read the listed objects: a HEAD of the first one (s3:GetObject, which a listing,
    s3:ListBucket, does not prove). Pre-flight's check of an s3:// source."""
    from botocore.exceptions import ClientError

    client = _client(listing.endpoint_url)
    uri, key = listing.uri, listing.files[0].source_path
    with _mapped(uri, listing.endpoint_url):
        try:
            with_retries(lambda: client.head_object(Bucket=uri.bucket, Key=key), what=f"read s3 {key}")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("AccessDenied", "403", "Forbidden"):
                raise
            where = _where(uri, listing.endpoint_url)
            raise StorageError(f"the S3 credentials may list {where} but not read its objects (HEAD {key}: "
                               f"{code}): grant s3:GetObject on the prefix.") from exc  # fmt: skip


def fetch(listing: Listing, paths: list[str], dest: Path, *, max_workers: int, progress: Progress) -> None:
    client = _client(listing.endpoint_url)
    uri = listing.uri
    remote = listing.by_path()
    targets = {p: write_target(dest, p, key=remote[p].source_path, source=uri.shown) for p in paths}
    files, parts = _concurrency(len(paths), max_workers)
    config = _transfer_config(parts)
    # Every request for an object's bytes carries If-Match with the listed ETag: an object replaced after the
    # listing answers 412 instead of other bytes (s3transfer's own If-Match pins only the parts to its HEAD).
    listed_etags = {
        remote[p].source_path: remote[p].stated["etag"] for p in paths if "etag" in remote[p].stated
    }

    def pin_to_listing(params: dict, **_) -> None:
        if params.get("Key") in listed_etags:
            params["IfMatch"] = listed_etags[params["Key"]]

    for operation in ("HeadObject", "GetObject"):
        client.meta.events.register(f"provide-client-params.s3.{operation}", pin_to_listing)

    def download(rel: str) -> None:
        from botocore.exceptions import ClientError, FlexibleChecksumError

        key = remote[rel].source_path
        try:
            with _mapped(uri, listing.endpoint_url, key):
                with_retries(
                    lambda: client.download_file(uri.bucket, key, str(targets[rel]), Config=config),
                    what=f"download s3 {key}",
                )
        except FlexibleChecksumError as exc:
            raise IntegrityError(f"{uri.shown}: {rel} (key {key}) is corrupt: {exc}.") from exc
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("412", "PreconditionFailed"):
                raise
            raise SourceChanged(
                f"{uri.shown}: {rel} (key {key}) was replaced at the source after it was listed: run the step "
                "again (it lists the source anew and fetches the new version whole)."
            ) from exc
        progress.file_done()

    with _mapped(uri, listing.endpoint_url):
        run_parallel(download, paths, files)


# --- destinations ---------------------------------------------------------------------------------------------


@dataclass
class Destination:
    uri: StorageUri
    endpoint_url: str | None
    client: object
    head: str | None = None  # a commit id: hf:// only


def is_root(uri: StorageUri) -> bool:
    """A whole bucket (`s3://bucket`, `s3://bucket/`): never a destination."""
    return not uri.path


def require_credentials(uri: StorageUri) -> None:
    import boto3

    if boto3.session.Session().get_credentials() is None:
        raise StorageError(
            f"no S3 credentials for {uri.shown}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(from a Kubernetes Secret)."
        )


def destination(
    uri: StorageUri, *, endpoint_url: str | None, private: bool, base_image: str = "", commit_message: str
) -> Destination:
    return Destination(uri, endpoint_url, _client(endpoint_url))


def probe(uri: StorageUri, *, endpoint_url: str | None) -> None:
    """Write and delete a small object under the prefix: what an export needs (s3:PutObject, s3:DeleteObject).
    First removes the probes killed pre-flights left there (names.is_stale_probe)."""
    import time

    from botocore.exceptions import BotoCoreError, ClientError

    client = _client(endpoint_url)
    _remove_stale_probes(client, uri)
    key = f"{uri.path}/{probe_name(time.time())}"
    where = _where(uri, endpoint_url)
    try:
        with_retries(lambda: client.put_object(Bucket=uri.bucket, Key=key, Body=b"kfp-finetune pre-flight\n"),
                     what=f"write a probe object to {uri.shown}")  # fmt: skip
    except (ClientError, BotoCoreError) as exc:
        code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
        if code in ("AccessDenied", "403", "Forbidden"):
            raise StorageError(f"the S3 credentials may not write to {where} ({code}): grant s3:PutObject on the "
                               "prefix, or choose another destination.") from exc  # fmt: skip
        raise (error(exc, uri, endpoint_url) or StorageError(f"cannot write to {where}: {exc}")) from exc
    try:
        with_retries(lambda: client.delete_object(Bucket=uri.bucket, Key=key), what=f"delete {key}")
    except (ClientError, BotoCoreError) as exc:
        # Writing is what an export needs; deleting only for overwrite. Say what was left behind.
        log.warning("could write but not delete the probe object s3://%s/%s (%s): the next pre-flight removes it, "
                    "or remove it by hand", uri.bucket, key, exc)  # fmt: skip


def _remove_stale_probes(client, uri: StorageUri) -> None:
    """Delete the probe objects directly under the prefix that killed pre-flights left (older than
    names.PROBE_STALE_AFTER_SECONDS by their name); no other object, however it is named. A listing or delete
    that fails is only logged: the probe that follows reports what the credentials cannot do."""
    import time

    from botocore.exceptions import BotoCoreError, ClientError

    folder = f"{uri.path}/"
    now = time.time()
    try:
        pages = with_retries(lambda: list(client.get_paginator("list_objects_v2").paginate(
            Bucket=uri.bucket, Prefix=folder + PROBE_PREFIX, Delimiter="/")), what=f"list probes in {uri.shown}")  # fmt: skip
        for key in (obj["Key"] for page in pages for obj in page.get("Contents", [])):
            if is_stale_probe(key[len(folder) :], now):
                with_retries(
                    lambda key=key: client.delete_object(Bucket=uri.bucket, Key=key), what=f"delete {key}"
                )
                log.info("removed s3://%s/%s, the probe of a pre-flight that was killed", uri.bucket, key)
    except (ClientError, BotoCoreError) as exc:
        log.info("could not look for probes killed pre-flights left in %s (%s)", uri.shown, exc)


def _key(dest: Destination, rel: str) -> str:
    return f"{dest.uri.path}/{rel}" if dest.uri.path else rel


def existing(dest: Destination) -> list[RemoteFile]:
    uri, client = dest.uri, dest.client
    dir_prefix = f"{uri.path}/" if uri.path else ""
    files = []
    with _mapped(uri, dest.endpoint_url):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=dir_prefix):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue
                head = client.head_object(Bucket=uri.bucket, Key=obj["Key"])
                files.append(
                    RemoteFile(
                        obj["Key"][len(dir_prefix) :],
                        head["ContentLength"],
                        obj["Key"],
                        sha256=head.get("Metadata", {}).get("sha256"),  # written by put
                        md5=_md5_etag(head.get("ETag", "")),
                    )
                )
    return files


def read_text(dest: Destination, rel: str) -> str:
    key = _key(dest, rel)
    with _mapped(dest.uri, dest.endpoint_url):
        body = with_retries(
            lambda: dest.client.get_object(Bucket=dest.uri.bucket, Key=key)["Body"].read(), what=f"read {key}"
        )
    return body.decode("utf-8", errors="replace")


def put(
    dest: Destination, src: Path, records: list[FileRecord], remove: list[str], *, max_workers: int,
    progress: Progress,
) -> None:  # fmt: skip
    """Upload `records` in parallel, then delete `remove`."""
    uri, client = dest.uri, dest.client
    files, parts = _concurrency(len(records), max_workers)
    config = _transfer_config(parts)

    def upload(record: FileRecord) -> None:
        key = _key(dest, record.path)
        # The sha256 goes into the object's metadata: S3 states no whole-object sha256 for multipart uploads,
        # and it lets a rerun recognise content it already uploaded.
        extra = {"Metadata": {"sha256": record.sha256}}
        with _mapped(uri, dest.endpoint_url, key):
            with_retries(
                lambda: client.upload_file(
                    str(src / record.path), uri.bucket, key, ExtraArgs=extra, Config=config
                ),
                what=f"upload s3 {key}",
            )
        progress.file_done(record.size)

    with _mapped(uri, dest.endpoint_url):
        run_parallel(upload, records, files)
        for rel in remove:
            key = _key(dest, rel)
            with_retries(
                lambda key=key: client.delete_object(Bucket=uri.bucket, Key=key), what=f"delete {key}"
            )
            log.info("removed %s from %s", rel, uri.shown)
