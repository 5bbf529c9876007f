"""Storage URIs: list and fetch files from the Hugging Face Hub, S3 (incl. MinIO/Ceph), local paths and https.

Supported forms (see SUPPORTED_FORMS):

    hf://<org>/<repo>[/<path/in/repo>][@<revision>]   (also hf://datasets/<org>/<name>, as HfFileSystem)
    s3://<bucket>[/<prefix>]            endpoint from a parameter or AWS_ENDPOINT_URL / S3_ENDPOINT_URL
    file:///abs/path  or  /abs/path     a file or a folder (e.g. a PVC mounted into the step)
    https://host/path/file.jsonl        a single file (datasets)

Credentials come only from the environment (HF_TOKEN, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN), which pipelines fill from Kubernetes Secrets. They are never parameters and never logged.

Two steps, so callers can decide what to fetch and whether a previous copy is still current:
`list_files(uri)` returns a `Listing` (paths, sizes, checksums the source provides, resolved revision) and
`download(listing, paths, dest)` copies the chosen files, verifies sizes and checksums and returns their sha256.
`upload_directory(src, uri)` writes a folder to s3:// or a local path, replacing it whole.
`publish_directory(src, uri)` (export steps) makes s3://, a local path or an hf:// repo hold exactly a folder:
resumable, verified by reading sizes and checksums back, a no-op when the content is already there, and
refusing to replace different content unless asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TypeVar

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import sha256_file

log = get_logger(__name__)

SUPPORTED_FORMS = (
    "hf://<org>/<repo>[/<path/in/repo>][@<revision>]",
    "s3://<bucket>[/<prefix>]",
    "file:///<absolute/path> or /<absolute/path>",
    "https://<host>/<path/to/file> (a single file)",
)

T = TypeVar("T")


class StorageError(RuntimeError):
    """A source could not be read; the message names the source and what to do."""


@dataclass(frozen=True)
class StorageUri:
    """A parsed storage URI. `path` is the path in the repo (hf), the key prefix (s3), the local path (file)
    or the URL (https)."""

    scheme: str
    raw: str
    path: str = ""
    repo_id: str = ""
    revision: str | None = None
    bucket: str = ""
    repo_type: str | None = None  # hf:// only, when the URI says (hf://datasets/...)

    def __str__(self) -> str:
        return self.raw


def _invalid(uri: str, why: str) -> ValueError:
    forms = "\n  ".join(SUPPORTED_FORMS)
    return ValueError(f"invalid storage URI {uri!r}: {why}. Supported forms:\n  {forms}")


def parse_uri(uri: str) -> StorageUri:
    """Parse and validate a storage URI; raise ValueError listing the supported forms when it is not one."""
    if not isinstance(uri, str) or not uri.strip():
        raise _invalid(str(uri), "empty")
    uri = uri.strip()
    if uri.startswith("/"):
        return StorageUri("file", uri, path=os.path.normpath(uri))
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise _invalid(uri, "no scheme and not an absolute path")
    scheme = scheme.lower()
    if scheme == "hf":
        body, at, revision = rest.partition("@")
        parts = [p for p in body.split("/") if p]
        repo_type = None
        if len(parts) >= 3 and parts[0] in (
            "datasets",
            "models",
        ):  # HfFileSystem's hf://datasets/<org>/<name>
            repo_type, parts = parts[0][:-1], parts[1:]
        if len(parts) < 2 or (at and not revision) or any(p in (".", "..") for p in parts):
            raise _invalid(uri, "expected an <org>/<repo> and, after '@', a non-empty revision")
        return StorageUri(
            "hf",
            uri,
            repo_id="/".join(parts[:2]),
            path="/".join(parts[2:]),
            revision=revision or None,
            repo_type=repo_type,
        )
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket or "@" in bucket or ":" in bucket:
            raise _invalid(uri, "expected a bucket name after 's3://'")
        return StorageUri("s3", uri, bucket=bucket, path=prefix.strip("/"))
    if scheme == "file":
        if not rest.startswith("/"):
            raise _invalid(uri, "file:// needs an absolute path (file:///data/x)")
        return StorageUri("file", uri, path=os.path.normpath(urllib.parse.unquote(rest)))
    if scheme == "https":
        parsed = urllib.parse.urlparse(uri)
        if not parsed.netloc or not parsed.path.strip("/"):
            raise _invalid(uri, "https:// needs a host and a file path")
        return StorageUri("https", uri, path=uri)
    raise _invalid(uri, f"unknown scheme {scheme!r}")


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

    def as_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


# --- retries ------------------------------------------------------------------------------------------------


def _status_code(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if isinstance(code, int):
        return code
    if isinstance(response, dict):  # botocore ClientError
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code if isinstance(code, int) else None
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of the HTTP clients in use (huggingface_hub uses httpx2, older ones httpx or
    requests; boto3 uses botocore)."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    errors: list[type[BaseException]] = [BotoConnectionError, HTTPClientError, ConnectionError, TimeoutError]
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests.exceptions", ("ConnectionError", "Timeout", "ChunkedEncodingError"))):  # fmt: skip
        with contextlib.suppress(ImportError):
            imported = importlib.import_module(module)
            errors += [getattr(imported, name) for name in names]
    return tuple(errors)


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: timeouts, dropped connections, 408/429/5xx. Walks the cause chain because the hub
    client wraps a failed HEAD (e.g. a 500) into a LocalEntryNotFoundError. Other 4xx and local validation errors
    (ValueError, TypeError, LookupError: bad URLs, parameters, content) are permanent, even when raised while
    handling a transient one."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    transport_errors = _transport_errors()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OfflineModeIsEnabled):
            return False  # a ConnectionError subclass, but retrying cannot help
        code = _status_code(exc)
        if code is not None:
            return code in (408, 429) or code >= 500
        if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, ssl.SSLCertVerificationError):
            return False  # an untrusted certificate stays untrusted
        if isinstance(exc, ValueError | TypeError | LookupError) and not isinstance(exc, transport_errors):
            return False
        if isinstance(exc, (*transport_errors, urllib.error.URLError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def with_retries(
    action: Callable[[], T], *, what: str, attempts: int | None = None, base_delay: float | None = None
) -> T:
    """Run `action`, retrying transient errors with exponential backoff (attempts and first delay default to
    KFP_FINETUNE_RETRIES=5 and KFP_FINETUNE_RETRY_DELAY=2 seconds)."""
    attempts = attempts or int(os.environ.get("KFP_FINETUNE_RETRIES", "5"))
    delay = base_delay if base_delay is not None else float(os.environ.get("KFP_FINETUNE_RETRY_DELAY", "2"))
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            log.warning(
                "%s: transient error (%s: %s); retry %d/%d in %.1fs",
                what, type(exc).__name__, str(exc).splitlines()[0][:200], attempt, attempts - 1, delay,
            )  # fmt: skip
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


# --- progress -----------------------------------------------------------------------------------------------


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024:
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TiB"


class Progress:
    """Logs files and bytes done / total and throughput every `interval` seconds while a transfer runs.

    Bytes are measured on disk under `dest` (partial files included), so it works for every transport. Files
    done are counted by `file_done()` calls or, with `count_on_disk` (for clients without a per-file
    callback), as the finished files on disk: not `*.incomplete` and not under a `.cache` folder.
    """

    def __init__(
        self,
        dest: Path,
        *,
        what: str,
        total_files: int,
        total_bytes: int,
        interval: float | None = None,
        count_on_disk: bool = False,
    ):
        self.dest, self.what, self.count_on_disk = dest, what, count_on_disk
        self.total_files, self.total_bytes = total_files, total_bytes
        self.interval = interval or float(os.environ.get("KFP_FINETUNE_PROGRESS_INTERVAL", "10"))
        self.files_done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1

    def _bytes_on_disk(self) -> int:
        total = 0
        for root, _, names in os.walk(self.dest):
            for name in names:
                with contextlib.suppress(OSError):  # a temp file renamed between walk and stat
                    total += os.lstat(os.path.join(root, name)).st_size
        return total

    def _files_on_disk(self) -> int:
        count = 0
        for _root, dirs, names in os.walk(self.dest):
            dirs[:] = [d for d in dirs if d != ".cache"]  # the hub client's partial downloads
            count += sum(1 for name in names if not name.endswith(".incomplete"))
        return count

    def report(self, final: bool = False) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        done = self.total_bytes if final else min(self._bytes_on_disk(), self.total_bytes)
        files = (
            self.total_files if final else (self._files_on_disk() if self.count_on_disk else self.files_done)
        )
        log.info(
            "%s: %s%d/%d files, %s / %s, %s/s",
            self.what, "done: " if final else "", files, self.total_files,
            _human(done), _human(self.total_bytes), _human(done / elapsed),
        )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def __enter__(self) -> Progress:
        log.info("%s: %d files, %s", self.what, self.total_files, _human(self.total_bytes))
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self.report(final=True)


# --- listing ------------------------------------------------------------------------------------------------


def s3_endpoint(endpoint_url: str | None = None) -> str | None:
    """The S3 endpoint: the parameter, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / S3_ENDPOINT_URL, else AWS."""
    return (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("S3_ENDPOINT_URL")
        or None
    )


def _s3_client(endpoint_url: str | None):
    import boto3
    from botocore.config import Config

    # Path-style addressing works for AWS and is what MinIO/Ceph expect on a custom endpoint.
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, s3={"addressing_style": "path"})
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint(endpoint_url), config=config)


def _hf_token() -> str | bool:
    # Env only; False (not None) so huggingface_hub does not fall back to a token stored on disk.
    return os.environ.get("HF_TOKEN") or False


def _hf_endpoint() -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once at import.
    return os.environ.get("HF_ENDPOINT") or None


def _hf_error(exc: Exception, uri: StorageUri, repo_type: str) -> StorageError | None:
    """Turn a hub client error into a message that names the repo and says what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo = f"{repo_type} repo {uri.repo_id!r} ({uri.raw})"
    has_token = bool(os.environ.get("HF_TOKEN"))
    code = _status_code(exc)
    if isinstance(exc, GatedRepoError):
        if has_token:
            return StorageError(
                f"{repo} is gated and the token in HF_TOKEN has no access ({code}): accept the model's terms "
                "on the hub with the token's account, or use a token that has access."
            )
        return StorageError(
            f"{repo} is gated ({code}) and HF_TOKEN is not set: set HF_TOKEN (from a Kubernetes Secret) to a "
            "token whose account accepted the model's terms."
        )
    if isinstance(exc, RevisionNotFoundError):
        return StorageError(
            f"revision {uri.revision!r} not found in {repo}: use a branch, tag or commit sha."
        )
    # A missing remote file (hub 1.x: RemoteEntryNotFoundError, 0.x: EntryNotFoundError) is an HTTP error; a
    # missing cached file (LocalEntryNotFoundError) is not.
    if isinstance(exc, EntryNotFoundError) and isinstance(exc, HfHubHTTPError):
        return StorageError(f"a file is missing in {repo}: {exc}".splitlines()[0])
    if isinstance(exc, RepositoryNotFoundError):
        hint = "check the name, and the token's access" if has_token else "if it is private, set HF_TOKEN"
        return StorageError(f"{repo} not found or not accessible ({code}): {hint}.")
    if isinstance(exc, HfHubHTTPError) and code in (401, 403):
        return StorageError(f"access to {repo} denied ({code}): check HF_TOKEN.")
    return None


def _list_hf(uri: StorageUri, repo_type: str) -> Listing:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi(endpoint=_hf_endpoint(), token=_hf_token())
    what = f"list hf {repo_type} {uri.repo_id}"
    try:
        info = with_retries(
            lambda: api.repo_info(
                uri.repo_id, repo_type=repo_type, revision=uri.revision, files_metadata=True
            ),
            what=what,
        )
    except HfHubHTTPError as exc:
        raise (_hf_error(exc, uri, repo_type) or exc) from exc
    except OfflineModeIsEnabled as exc:
        raise StorageError(
            f"cannot read {uri.raw}: HF_HUB_OFFLINE is set in the step's environment."
        ) from exc
    prefix = uri.path.strip("/")
    files = []
    for sibling in info.siblings or []:
        if prefix and not (sibling.rfilename == prefix or sibling.rfilename.startswith(prefix + "/")):
            continue
        rel = (
            sibling.rfilename
            if not prefix
            else (PurePosixPath(sibling.rfilename).relative_to(prefix).as_posix())
        )
        if rel == ".":
            rel = PurePosixPath(sibling.rfilename).name
        lfs = sibling.lfs
        files.append(
            RemoteFile(
                path=rel,
                size=lfs.size if lfs else sibling.size,
                source_path=sibling.rfilename,
                sha256=lfs.sha256 if lfs else None,
                git_blob_sha1=None if lfs else sibling.blob_id,
            )
        )
    if not files:
        where = f"under {prefix!r} in " if prefix else "in "
        raise StorageError(f"no files {where}{repo_type} repo {uri.repo_id!r} ({uri.raw}).")
    return Listing(uri, files, revision=uri.revision or "main", commit_sha=info.sha, repo_type=repo_type)


def _s3_error(exc: Exception, uri: StorageUri, endpoint_url: str | None) -> StorageError | None:
    from botocore.exceptions import ClientError, NoCredentialsError

    where = f"{uri.raw} (endpoint {s3_endpoint(endpoint_url) or 'AWS default'})"
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
    return None


def _list_s3(uri: StorageUri, endpoint_url: str | None) -> Listing:
    from botocore.exceptions import BotoCoreError, ClientError

    client = _s3_client(endpoint_url)
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
                    rel = PurePosixPath(key).name
                elif key.startswith(dir_prefix):
                    rel = key[len(dir_prefix) :]
                else:
                    continue  # s3://b/data must not match s3://b/data2/x
                etag = obj.get("ETag", "").strip('"')
                # A single-part upload's ETag is the MD5 of the content; multipart ETags contain '-'.
                md5 = etag if etag and "-" not in etag and len(etag) == 32 else None
                files.append(RemoteFile(path=rel, size=obj["Size"], source_path=key, md5=md5))
        return files

    try:
        files = with_retries(list_all, what=f"list {uri.raw}")
    except (ClientError, BotoCoreError) as exc:
        raise (_s3_error(exc, uri, endpoint_url) or exc) from exc
    if not files:
        raise StorageError(
            f"no objects under {uri.raw} (endpoint {s3_endpoint(endpoint_url) or 'AWS default'})."
        )
    return Listing(uri, files, endpoint_url=endpoint_url)


def _list_local(uri: StorageUri) -> Listing:
    root = Path(uri.path)
    if root.is_file():
        stat = root.stat()
        only = RemoteFile(root.name, stat.st_size, source_path=str(root), mtime_ns=stat.st_mtime_ns)
        return Listing(uri, [only])
    if not root.is_dir():
        raise StorageError(f"{uri.raw}: no such file or directory.")
    files = [
        RemoteFile(
            p.relative_to(root).as_posix(),
            p.stat().st_size,
            source_path=str(p),
            mtime_ns=p.stat().st_mtime_ns,
        )
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    if not files:
        raise StorageError(f"{uri.raw} is an empty directory.")
    return Listing(uri, files)


def _https_request(url: str, method: str = "GET", headers: dict | None = None):
    request = urllib.request.Request(
        url, method=method, headers={"User-Agent": "kfp-finetune", **(headers or {})}
    )
    return urllib.request.urlopen(request, timeout=60)  # noqa: S310 (scheme checked by parse_uri)


def _list_https(uri: StorageUri) -> Listing:
    def head() -> int | None:
        with _https_request(uri.path, "HEAD") as response:
            length = response.headers.get("Content-Length")
            return int(length) if length is not None else None

    try:
        size = with_retries(head, what=f"HEAD {uri.raw}")
    except urllib.error.HTTPError as exc:
        raise StorageError(f"{uri.raw}: HTTP {exc.code} {exc.reason}.") from exc
    name = PurePosixPath(urllib.parse.urlparse(uri.path).path).name
    return Listing(uri, [RemoteFile(path=name, size=size, source_path=uri.path)])


def list_files(
    uri: str | StorageUri, *, repo_type: str = "model", endpoint_url: str | None = None
) -> Listing:
    """List the files at a source. `repo_type` ("model"/"dataset") applies to hf://, `endpoint_url` to s3://.

    Raises ValueError for a malformed URI and StorageError (naming the source) when it cannot be read.
    """
    uri = parse_uri(uri) if isinstance(uri, str) else uri
    # One line per HTTP request (httpx2, used by huggingface_hub) would drown the step log's progress lines.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    if uri.scheme == "hf":
        return _list_hf(uri, uri.repo_type or repo_type)
    if uri.scheme == "s3":
        return _list_s3(uri, endpoint_url)
    if uri.scheme == "file":
        return _list_local(uri)
    return _list_https(uri)


# --- download -----------------------------------------------------------------------------------------------


def _git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _verify(local: Path, remote: RemoteFile, source: str) -> FileRecord:
    """Check size and every checksum the source stated; return the manifest entry."""
    size = local.stat().st_size
    if remote.size is not None and size != remote.size:
        raise StorageError(f"{source}: {remote.path} has {size} bytes, the source says {remote.size}.")
    sha256 = sha256_file(local)
    if remote.sha256 and sha256 != remote.sha256:
        raise StorageError(
            f"{source}: {remote.path} sha256 {sha256} does not match the source's {remote.sha256}."
        )
    if remote.md5 and hashlib.md5(local.read_bytes(), usedforsecurity=False).hexdigest() != remote.md5:
        raise StorageError(f"{source}: {remote.path} does not match the source's MD5 ETag.")
    if remote.git_blob_sha1 and _git_blob_sha1(local) != remote.git_blob_sha1:
        raise StorageError(f"{source}: {remote.path} does not match the source's git blob id.")
    return FileRecord(remote.path, size, sha256)


def _download_hf(listing: Listing, paths: list[str], dest: Path, max_workers: int) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # tqdm bars garble step logs; Progress reports instead
    uri = listing.uri
    remote = listing.by_path()
    # Exact file names as allow patterns; pinned to the listed commit so every file comes from one revision.
    repo_paths = [remote[p].source_path for p in paths]
    hub_dir = dest / ".hub-download"

    def fetch() -> None:
        snapshot_download(
            uri.repo_id,
            repo_type=listing.repo_type,
            revision=listing.commit_sha,
            local_dir=hub_dir,
            allow_patterns=repo_paths,
            max_workers=max_workers,
            token=_hf_token(),
            endpoint=_hf_endpoint(),
        )

    try:
        with_retries(fetch, what=f"download {uri.raw}")
    except (HfHubHTTPError, LocalEntryNotFoundError) as exc:
        cause = exc if isinstance(exc, HfHubHTTPError) else exc.__cause__
        mapped = _hf_error(cause, uri, listing.repo_type) if isinstance(cause, Exception) else None
        raise (mapped or StorageError(f"download of {uri.raw} failed: {exc}")) from exc
    for rel, repo_path in zip(paths, repo_paths, strict=True):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(hub_dir / repo_path, target)
    shutil.rmtree(hub_dir)  # the hub client's own resume metadata (.cache/) is not part of the copy


def _download_s3(
    listing: Listing, paths: list[str], dest: Path, max_workers: int, progress: Progress
) -> None:
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    client = _s3_client(listing.endpoint_url)
    uri = listing.uri
    remote = listing.by_path()

    def fetch(rel: str) -> None:
        key = remote[rel].source_path
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        config = TransferConfig(max_concurrency=4)
        with_retries(
            lambda: client.download_file(uri.bucket, key, str(target), Config=config),
            what=f"download s3 {key}",
        )
        progress.file_done()

    try:
        _run_parallel(fetch, paths, max_workers)
    except (ClientError, BotoCoreError) as exc:
        raise (_s3_error(exc, uri, listing.endpoint_url) or exc) from exc


def _download_local(
    listing: Listing, paths: list[str], dest: Path, max_workers: int, progress: Progress
) -> None:
    remote = listing.by_path()

    def fetch(rel: str) -> None:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote[rel].source_path, target)
        progress.file_done()

    _run_parallel(fetch, paths, max_workers)


def _download_https(listing: Listing, dest: Path, progress: Progress) -> None:
    url = listing.uri.path
    target = dest / listing.files[0].path

    def fetch() -> None:
        with _https_request(url) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)

    try:
        with_retries(fetch, what=f"download {url}")
    except urllib.error.HTTPError as exc:
        raise StorageError(f"{url}: HTTP {exc.code} {exc.reason}.") from exc
    progress.file_done()


def _run_parallel(action: Callable[[str], None], items: Iterable[str], max_workers: int) -> None:
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()  # re-raises the first failure


def download(
    listing: Listing, paths: list[str], dest: str | os.PathLike, *, max_workers: int = 8
) -> list[FileRecord]:
    """Copy `paths` (relative, as listed) from the source into `dest`, in parallel, with retries and progress.

    Every file is verified against the listing (size, and sha256 / MD5 ETag / git blob id where the source
    states one). Returns the manifest entries, sorted by path. `dest` should be a temp dir the caller renames
    into place (workspace.atomic_dir), so an interrupted download never looks complete.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = listing.by_path()
    missing = [p for p in paths if p not in remote]
    if missing:
        raise StorageError(f"{listing.uri.raw}: not at the source: {', '.join(missing)}.")
    total = sum(remote[p].size or 0 for p in paths)
    scheme = listing.uri.scheme
    with Progress(
        dest,
        what=f"fetch {listing.uri.raw}",
        total_files=len(paths),
        total_bytes=total,
        count_on_disk=scheme == "hf",  # the hub client gives no per-file callback
    ) as progress:
        if scheme == "hf":
            _download_hf(listing, paths, dest, max_workers)
        elif scheme == "s3":
            _download_s3(listing, paths, dest, max_workers, progress)
        elif scheme == "file":
            _download_local(listing, paths, dest, max_workers, progress)
        else:
            _download_https(listing, dest, progress)
    records: list[FileRecord] = []

    def verify(rel: str) -> None:
        records.append(_verify(dest / rel, remote[rel], listing.uri.raw))

    _run_parallel(verify, paths, max_workers)
    return sorted(records, key=lambda r: r.path)


# --- upload -------------------------------------------------------------------------------------------------


def upload_directory(
    src: str | os.PathLike, uri: str | StorageUri, *, endpoint_url: str | None = None, max_workers: int = 8
) -> list[FileRecord]:
    """Copy every file under `src` to `uri` (s3:// prefix or file:// / path folder), in parallel, with retries
    and progress; returns what was written (path relative to `uri`, size, sha256).

    Local destinations are written to a temp folder and renamed into place, so readers never see half a copy.
    hf:// destinations are not handled here (use huggingface_hub's upload_folder, which commits atomically).
    """
    src = Path(src)
    uri = parse_uri(uri) if isinstance(uri, str) else uri
    if uri.scheme not in ("s3", "file"):
        raise ValueError(f"upload_directory supports s3:// and file:// destinations, not {uri.raw!r}")
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise StorageError(f"nothing to upload: {src} holds no files")
    records = [FileRecord(p.relative_to(src).as_posix(), p.stat().st_size, sha256_file(p)) for p in files]
    total = sum(r.size for r in records)
    with Progress(src, what=f"upload to {uri.raw}", total_files=len(files), total_bytes=total) as progress:
        if uri.scheme == "file":
            from kfp_finetune.components._shared.workspace import atomic_dir

            with atomic_dir(uri.path) as tmp:
                for record in records:
                    (tmp / record.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src / record.path, tmp / record.path)
                    progress.file_done()
        else:
            _upload_s3(src, records, uri, endpoint_url, max_workers, progress)
    return records


def _upload_s3(
    src: Path,
    records: list[FileRecord],
    uri: StorageUri,
    endpoint_url: str | None,
    max_workers: int,
    progress: Progress,
) -> None:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    client = _s3_client(endpoint_url)
    by_path = {r.path: r for r in records}

    def put(rel: str) -> None:
        key = f"{uri.path}/{rel}" if uri.path else rel
        with_retries(lambda: client.upload_file(str(src / rel), uri.bucket, key), what=f"upload s3 {key}")
        # botocore checksums each request; the size check catches an object replaced or cut short meanwhile.
        size = client.head_object(Bucket=uri.bucket, Key=key)["ContentLength"]
        if size != by_path[rel].size:
            raise StorageError(
                f"s3://{uri.bucket}/{key} has {size} bytes after upload, expected {by_path[rel].size}"
            )
        progress.file_done()

    try:
        _run_parallel(put, list(by_path), max_workers)
    except (ClientError, BotoCoreError) as exc:
        raise (_s3_error(exc, uri, endpoint_url) or exc) from exc
    except S3UploadFailedError as exc:  # boto3's transfer manager wraps the ClientError
        cause = exc.__cause__ or exc.__context__
        mapped = _s3_error(cause, uri, endpoint_url) if isinstance(cause, Exception) else None
        raise (mapped or exc) from exc


# --- publish: resumable, verified, conflict-aware upload (export steps) ----------------------------------------

_HF_REPO_FILES = {".gitattributes"}  # the hub creates it with every repo: not a conflict, never deleted
_PART_MARK = ".part-"  # local destinations: `.<name>.part-<id>` while a file is being written


class DestinationConflict(StorageError):
    """The destination holds different content and overwrite was not requested."""


@dataclass
class PublishResult:
    """What `publish_directory` did. `state`: created (destination was empty), resumed (it held part of this
    content, e.g. from an interrupted run), unchanged (it already held exactly this content) or replaced
    (overwrite=True replaced different content)."""

    uri: str
    state: str
    records: list[FileRecord]
    uploaded: list[str]
    deleted: list[str]
    commit_sha: str | None = None  # hf:// only: the commit holding the files

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.records)


def require_credentials(uri: str | StorageUri) -> None:
    """Fail before any transfer when the environment has no credentials for writing to `uri`."""
    uri = parse_uri(uri) if isinstance(uri, str) else uri
    if uri.scheme == "hf" and not os.environ.get("HF_TOKEN"):
        raise StorageError(
            f"cannot push to {uri.raw}: HF_TOKEN is not set. Set it (from a Kubernetes Secret) to a token with "
            "write access to the repo's namespace."
        )
    if uri.scheme == "s3":
        import boto3

        if boto3.session.Session().get_credentials() is None:
            raise StorageError(
                f"no S3 credentials for {uri.raw}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(from a Kubernetes Secret)."
            )


def _same_content(local: Path, record: FileRecord, remote: RemoteFile) -> bool:
    """True when `remote` provably holds `record`'s bytes: same size and every checksum the destination states
    matches (an S3 object's sha256 metadata and, for single-part uploads, its server-computed MD5 ETag)."""
    checks = [
        (remote.sha256, lambda: record.sha256),
        (remote.md5, lambda: _md5_file(local)),
        (remote.git_blob_sha1, lambda: _git_blob_sha1(local)),
    ]
    stated = [(value, compute) for value, compute in checks if value]
    # Nothing to compare means different: never assume content is there.
    return (
        remote.size == record.size and bool(stated) and all(value == compute() for value, compute in stated)
    )


def _md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _join_key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def _dest_local(uri: StorageUri) -> list[RemoteFile]:
    root = Path(uri.path)
    if root.exists() and not root.is_dir():
        raise StorageError(f"destination {uri.raw} is a file, not a folder.")
    files = []
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        rel = path.relative_to(root)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts):
            continue  # hidden: our own partial files and tool state, not content
        # Read back: the only checksum a plain folder can state is the one we compute.
        files.append(RemoteFile(rel.as_posix(), path.stat().st_size, str(path), sha256=sha256_file(path)))
    return files


def _dest_s3(client, uri: StorageUri) -> list[RemoteFile]:
    files = []
    dir_prefix = f"{uri.path}/" if uri.path else ""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=dir_prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/"):
                continue
            head = client.head_object(Bucket=uri.bucket, Key=obj["Key"])
            etag = head.get("ETag", "").strip('"')
            files.append(
                RemoteFile(
                    obj["Key"][len(dir_prefix) :],
                    head["ContentLength"],
                    obj["Key"],
                    sha256=head.get("Metadata", {}).get("sha256"),  # written by _publish_s3
                    md5=etag if len(etag) == 32 and "-" not in etag else None,
                )
            )
    return files


def _dest_hf(api, uri: StorageUri) -> tuple[list[RemoteFile], str | None, bool]:
    """Files under the URI's path in the repo, the head commit, and whether the repo exists."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.repo_info(uri.repo_id, repo_type="model", revision=uri.revision, files_metadata=True)
    except RevisionNotFoundError as exc:
        raise StorageError(
            f"branch {uri.revision!r} does not exist in {uri.repo_id}: create it first or push to main."
        ) from exc
    except RepositoryNotFoundError:
        return [], None, False
    prefix = uri.path.strip("/")
    files = []
    for sibling in info.siblings or []:
        name = sibling.rfilename
        if prefix and not name.startswith(prefix + "/"):
            continue
        rel = name[len(prefix) + 1 :] if prefix else name
        if not prefix and rel in _HF_REPO_FILES:
            continue
        lfs = sibling.lfs
        files.append(
            RemoteFile(
                rel,
                lfs.size if lfs else sibling.size,
                name,
                sha256=lfs.sha256 if lfs else None,
                git_blob_sha1=None if lfs else sibling.blob_id,
            )
        )
    return files, info.sha, True


class _UploadLog:
    """Logs each finished file with files and bytes done / total (thread-safe)."""

    def __init__(self, what: str, records: list[FileRecord]):
        self.what, self.total_files, self.total_bytes = what, len(records), sum(r.size for r in records)
        self.files = self.bytes = 0
        self._lock = threading.Lock()
        self._start = time.monotonic()
        log.info("%s: %d files, %s", what, self.total_files, _human(self.total_bytes))

    def done(self, record: FileRecord) -> None:
        with self._lock:
            self.files += 1
            self.bytes += record.size
            rate = self.bytes / max(time.monotonic() - self._start, 1e-6)
            log.info(
                "%s: %d/%d files, %s / %s, %s/s (%s)",
                self.what, self.files, self.total_files, _human(self.bytes), _human(self.total_bytes),
                _human(rate), record.path,
            )  # fmt: skip


def publish_directory(
    src: str | os.PathLike,
    uri: str | StorageUri,
    *,
    overwrite: bool = False,
    marker: str | None = None,
    endpoint_url: str | None = None,
    private: bool = True,
    commit_message: str = "Upload with kfp-finetune",
    max_workers: int = 8,
) -> PublishResult:
    """Make `uri` hold exactly the files under `src`: an s3:// prefix, a local folder or an hf:// model repo
    (optionally a folder in it, @branch). Resumable, verified and conflict-aware:

    - files already at the destination with the same content are not transferred again, so a rerun after an
      interruption only sends what is missing, and rerunning a finished export transfers nothing;
    - a destination holding different content (changed files, or files that are not in `src`) is refused with
      DestinationConflict before anything is written, unless `overwrite`: then changed files are replaced and
      the others deleted (the hub's .gitattributes is kept);
    - s3:// and local: `marker` (a path in `src`, e.g. a checksum manifest) is written last, so its presence
      means the copy is complete; local files appear atomically (temp name, then rename). hf:// writes one
      commit, which is atomic; LFS objects uploaded by an interrupted run are not sent again.
    - afterwards every file is read back (sizes and the checksums the destination states: sha256, MD5 ETag or
      git blob id) and compared with `src`.

    hf:// repos are created when missing, private unless `private=False`. Credentials come from the
    environment only (HF_TOKEN, AWS_*); missing ones fail before any transfer.
    """
    src = Path(src)
    uri = parse_uri(uri) if isinstance(uri, str) else uri
    if uri.scheme not in ("s3", "file", "hf"):
        raise ValueError(f"cannot publish to {uri.raw!r}: use an s3://, hf:// or local path destination")
    if uri.scheme == "hf" and uri.repo_type not in (None, "model"):
        raise ValueError(f"cannot publish to {uri.raw!r}: only model repos are supported")
    require_credentials(uri)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise StorageError(f"nothing to publish: {src} holds no files")
    records = [FileRecord(p.relative_to(src).as_posix(), p.stat().st_size, sha256_file(p)) for p in files]
    if marker is not None and marker not in {r.path for r in records}:
        raise ValueError(f"marker {marker!r} is not a file in {src}")
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    if uri.scheme == "hf":
        return _publish_hf(src, records, uri, overwrite, private, commit_message)
    client = _s3_client(endpoint_url) if uri.scheme == "s3" else None
    try:
        remote = _dest_s3(client, uri) if client else _dest_local(uri)
        plan = _plan(src, records, remote, uri, overwrite)
        if plan.upload or plan.delete:
            ordered = [r for r in plan.upload if r.path != marker]
            last = [r for r in plan.upload if r.path == marker]
            # Overwriting: remove the old completion marker first, so a half-replaced copy never looks complete.
            if marker and marker in plan.changed:
                _delete(client, uri, [marker])
            transfer = _publish_s3 if client else _publish_local
            progress = _UploadLog(f"upload to {uri.raw}", plan.upload)
            transfer(client, src, ordered, uri, max_workers, progress)
            _delete(client, uri, plan.delete)
            transfer(client, src, last, uri, 1, progress)
        remote = _dest_s3(client, uri) if client else _dest_local(uri)
    except _boto_errors() as exc:
        raise (_s3_error(exc, uri, endpoint_url) or exc) from exc
    _verify_published(src, records, remote, uri)
    return PublishResult(uri.raw, plan.state, records, [r.path for r in plan.upload], plan.delete)


def _boto_errors() -> tuple[type[BaseException], ...]:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError, S3UploadFailedError)


@dataclass
class _Plan:
    state: str
    upload: list[FileRecord]
    delete: list[str]  # destination files not in the source (overwrite only)
    changed: list[str]  # files whose destination copy differs (overwrite only)


def _plan(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], uri: StorageUri, overwrite: bool
) -> _Plan:
    by_path = {f.path: f for f in remote}
    ours = {r.path for r in records}
    missing = [r for r in records if r.path not in by_path]
    changed = [
        r for r in records if r.path in by_path and not _same_content(src / r.path, r, by_path[r.path])
    ]
    foreign = sorted(p for p in by_path if p not in ours)
    if changed or foreign:
        if not overwrite:
            details = [f"{p} (different content)" for p in (r.path for r in changed)]
            details += [f"{p} (not part of this export)" for p in foreign]
            shown = "; ".join(details[:10]) + (f"; and {len(details) - 10} more" if len(details) > 10 else "")
            raise DestinationConflict(
                f"{uri.raw} already holds different content: {shown}. Nothing was written. Choose another "
                "destination, or set overwrite=True to replace it."
            )
        log.info("%s: replacing %d changed and removing %d other files (overwrite)", uri.raw, len(changed),
                 len(foreign))  # fmt: skip
        return _Plan("replaced", missing + changed, foreign, [r.path for r in changed])
    if not remote:
        return _Plan("created", records, [], [])
    if not missing:
        log.info("%s already holds these %d files with the same content: nothing to upload", uri.raw,
                 len(records))  # fmt: skip
        return _Plan("unchanged", [], [], [])
    log.info("%s holds %d of %d files already (an earlier, interrupted upload): sending the other %d",
             uri.raw, len(records) - len(missing), len(records), len(missing))  # fmt: skip
    return _Plan("resumed", missing, [], [])


def _publish_local(
    _client, src: Path, records: list[FileRecord], uri: StorageUri, max_workers: int, progress: _UploadLog
) -> None:
    import uuid

    root = Path(uri.path)
    for stale in root.rglob(f".*{_PART_MARK}*") if root.is_dir() else []:
        stale.unlink(missing_ok=True)  # left by an interrupted copy

    def copy(record: FileRecord) -> None:
        target = root / record.path
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.parent / f".{target.name}{_PART_MARK}{uuid.uuid4().hex[:8]}"
        shutil.copyfile(src / record.path, part)
        os.replace(part, target)  # readers never see a half-written file under its real name
        progress.done(record)

    _run_parallel_records(copy, records, max_workers)


def _publish_s3(
    client, src: Path, records: list[FileRecord], uri: StorageUri, max_workers: int, progress: _UploadLog
) -> None:
    def put(record: FileRecord) -> None:
        key = _join_key(uri.path, record.path)
        # The sha256 goes into the object's metadata: S3 states no whole-object sha256 for multipart uploads,
        # and it lets a rerun recognise content it already uploaded.
        extra = {"Metadata": {"sha256": record.sha256}}
        with_retries(
            lambda: client.upload_file(str(src / record.path), uri.bucket, key, ExtraArgs=extra),
            what=f"upload s3 {key}",
        )
        progress.done(record)

    _run_parallel_records(put, records, max_workers)


def _run_parallel_records(
    action: Callable[[FileRecord], None], records: list[FileRecord], workers: int
) -> None:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(action, record) for record in records]:
            future.result()


def _delete(client, uri: StorageUri, paths: list[str]) -> None:
    for rel in paths:
        if client is None:
            (Path(uri.path) / rel).unlink(missing_ok=True)
        else:
            key = _join_key(uri.path, rel)
            with_retries(
                lambda key=key: client.delete_object(Bucket=uri.bucket, Key=key), what=f"delete {key}"
            )
        log.info("removed %s from %s", rel, uri.raw)


def _verify_published(
    src: Path, records: list[FileRecord], remote: list[RemoteFile], uri: StorageUri
) -> None:
    by_path = {f.path: f for f in remote}
    for record in records:
        found = by_path.get(record.path)
        if found is None:
            raise StorageError(
                f"verification failed: {record.path} is missing at {uri.raw} after the upload."
            )
        if not _same_content(src / record.path, record, found):
            raise StorageError(
                f"verification failed: {record.path} at {uri.raw} has {found.size} bytes / other checksum "
                f"than the {record.size} bytes uploaded."
            )
    extra = sorted(set(by_path) - {r.path for r in records})
    if extra:
        raise StorageError(
            f"verification failed: {uri.raw} holds files that are not in the export: {extra[:5]}"
        )
    log.info("verified %d files at %s (sizes and checksums read back)", len(records), uri.raw)


def _publish_hf(
    src: Path, records: list[FileRecord], uri: StorageUri, overwrite: bool, private: bool, message: str
) -> PublishResult:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    api = HfApi(endpoint=_hf_endpoint(), token=_hf_token())
    prefix = uri.path.strip("/")
    try:
        remote, head, exists = with_retries(lambda: _dest_hf(api, uri), what=f"list {uri.raw}")
        plan = _plan(src, records, remote, uri, overwrite)
        if not exists:
            if uri.revision not in (None, "main"):
                raise StorageError(f"{uri.repo_id} does not exist yet: push to its main branch first.")
            log.info("creating %s model repo %s", "private" if private else "public", uri.repo_id)
            with_retries(
                lambda: api.create_repo(uri.repo_id, repo_type="model", private=private, exist_ok=True),
                what=f"create repo {uri.repo_id}",
            )
        if plan.upload or plan.delete:
            log.info(
                "%s: committing %d files (%s), removing %d", uri.raw, len(plan.upload),
                _human(sum(r.size for r in plan.upload)), len(plan.delete),
            )  # fmt: skip

            def commit() -> None:
                # Fresh operations per attempt: the client marks them as used. LFS objects an earlier attempt
                # (or an interrupted run) uploaded are recognised by the hub and not sent again.
                operations = [
                    CommitOperationAdd(_join_key(prefix, r.path), str(src / r.path)) for r in plan.upload
                ] + [CommitOperationDelete(_join_key(prefix, p)) for p in plan.delete]
                api.create_commit(
                    uri.repo_id,
                    operations,
                    commit_message=message,
                    repo_type="model",
                    revision=uri.revision,
                    parent_commit=head,  # fails instead of silently mixing with a concurrent push
                )

            with_retries(commit, what=f"commit to {uri.raw}")
        remote, commit_sha, _ = with_retries(lambda: _dest_hf(api, uri), what=f"list {uri.raw}")
    except HfHubHTTPError as exc:
        raise (_hf_error(exc, uri, "model") or StorageError(f"push to {uri.raw} failed: {exc}")) from exc
    _verify_published(src, records, remote, uri)
    uploaded = [r.path for r in plan.upload]
    return PublishResult(uri.raw, plan.state, records, uploaded, plan.delete, commit_sha)
