"""https:// — a single file (datasets), e.g. a presigned URL; its query string is a credential, never shown."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

from .errors import SourceChanged, StorageError
from .listing import Listing, RemoteFile
from .names import write_target
from .progress import Progress
from .retry import with_retries
from .uri import StorageUri

COUNTS_FILES_ON_DISK = False
WRITABLE = False


def _request(url: str, method: str = "GET"):
    request = urllib.request.Request(url, method=method, headers={"User-Agent": "kfp-finetune"})
    return urllib.request.urlopen(request, timeout=60)  # noqa: S310 (scheme checked by parse_uri)


def _mapped(uri: StorageUri, action):
    try:
        return with_retries(action, what=f"{action.__name__} {uri.shown}")
    except urllib.error.HTTPError as exc:
        raise StorageError(f"{uri.shown}: HTTP {exc.code} {exc.reason}.") from exc


def _stated(headers) -> dict[str, str]:
    """What the server states about the content besides its length (RFC 9110 validators)."""
    stated = {"etag": headers.get("ETag"), "last_modified": headers.get("Last-Modified")}
    return {k: v for k, v in stated.items() if v}


def list_files(uri: StorageUri, *, repo_type: str, endpoint_url: str | None) -> Listing:
    def head() -> tuple[int | None, dict[str, str]]:
        with _request(uri.path, "HEAD") as response:
            length = response.headers.get("Content-Length")
            return (int(length) if length is not None else None), _stated(response.headers)

    size, stated = _mapped(uri, head)
    # The entry's name comes from the URL's path alone: never from the query string.
    name = PurePosixPath(urllib.parse.urlsplit(uri.path).path).name
    return Listing(uri, [RemoteFile(path=name, size=size, source_path=uri.path, stated=stated)])


def fetch(listing: Listing, paths: list[str], dest: Path, *, max_workers: int, progress: Progress) -> None:
    uri = listing.uri
    (remote,) = listing.files
    target = write_target(dest, remote.path, key=remote.path, source=uri.shown)

    def download() -> None:
        with _request(uri.path) as response:
            now = _stated(response.headers)
            if any(now.get(k, v) != v for k, v in remote.stated.items()):  # another version than was listed
                raise SourceChanged(
                    f"{uri.shown} changed at the source after it was listed (ETag / Last-Modified): run the step "
                    "again."
                )
            with open(target, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)

    _mapped(uri, download)
    progress.file_done()
