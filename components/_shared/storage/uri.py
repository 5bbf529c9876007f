"""Storage URIs: parsing (one parser per scheme, in a table); a URI is shown only through `redact_uri`
(_shared/redact.py), and one given as a parameter with credentials in it is refused (`refuse_credentials`).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from kfp_finetune.components._shared.redact import CREDENTIALS_IN_PARAMETER, credentials_in, redact_uri

from .errors import CredentialsInParameter

SUPPORTED_FORMS = (
    "hf://<org>/<repo>[/<path/in/repo>][@<revision>]",
    "s3://<bucket>[/<prefix>]",
    "file:///<absolute/path> or /<absolute/path>",
    "https://<host>/<path/to/file> (a single file)",
    "oci://<registry>/<repository>[:<tag>] (a KServe ModelCar image; a source may also end in @sha256:<digest>)",
)


@dataclass(frozen=True)
class StorageUri:
    """A parsed storage URI. `path` is the path in the repo (hf), the key prefix (s3), the local path (file)
    or the URL (https). `raw` may hold credentials: show `shown`, never `raw`."""

    scheme: str
    raw: str
    path: str = ""
    repo_id: str = (
        ""  # hf: <org>/<repo>; oci: the repository (its registry in `bucket`, its tag in `revision`)
    )
    revision: str | None = None
    bucket: str = ""
    repo_type: str | None = None  # hf:// only, when the URI says (hf://datasets/...)

    @property
    def shown(self) -> str:
        return redact_uri(self.raw)

    def __str__(self) -> str:
        return self.shown


def _invalid(uri: str, why: str) -> ValueError:
    forms = "\n  ".join(SUPPORTED_FORMS)
    return ValueError(f"invalid storage URI {redact_uri(uri)!r}: {why}. Supported forms:\n  {forms}")


def _parse_hf(uri: str, rest: str) -> StorageUri:
    body, at, revision = rest.partition("@")
    parts = [p for p in body.split("/") if p]
    repo_type = None
    if len(parts) >= 3 and parts[0] in ("datasets", "models"):  # HfFileSystem's hf://datasets/<org>/<name>
        repo_type, parts = parts[0][:-1], parts[1:]
    if "?" in rest:  # the hub reads no query; a token in one would only be echoed (the revision's name)
        raise _invalid(uri, "hf:// takes no query string (the token comes from HF_TOKEN)")
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


def _parse_s3(uri: str, rest: str) -> StorageUri:
    bucket, _, prefix = rest.partition("/")
    if not bucket or "@" in bucket or ":" in bucket:
        raise _invalid(uri, "expected a bucket name after 's3://' (credentials come from the environment)")
    return StorageUri("s3", uri, bucket=bucket, path=prefix.strip("/"))


def _local_path(path: str) -> str:
    # POSIX normpath keeps exactly two leading slashes ("//" stays "//"): on Linux they name the root too.
    return os.path.normpath("/" + path.lstrip("/"))


def _parse_file(uri: str, rest: str) -> StorageUri:
    if not rest.startswith("/"):
        raise _invalid(uri, "file:// needs an absolute path (file:///data/x)")
    return StorageUri("file", uri, path=_local_path(urllib.parse.unquote(rest)))


def _parse_https(uri: str, rest: str) -> StorageUri:
    parsed = urllib.parse.urlparse(uri)
    if not parsed.netloc or not parsed.path.strip("/"):
        raise _invalid(uri, "https:// needs a host and a file path")
    return StorageUri("https", uri, path=uri)


_OCI_REFERENCE = re.compile(
    r"(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


def _parse_oci(uri: str, rest: str) -> StorageUri:
    host, slash, reference = rest.partition("/")
    if not host or not slash or "@" in host or "?" in rest:
        raise _invalid(
            uri, "expected oci://<registry>/<repository>[:<tag>] (credentials come from oci_secret)"
        )
    match = _OCI_REFERENCE.fullmatch(reference)
    if match is None:
        raise _invalid(uri, "the repository is lowercase letters, digits and . _ - / separators, then :<tag>")
    return StorageUri(
        "oci", uri, bucket=host.lower(), repo_id=match["repo"], revision=match["digest"] or match["tag"]
    )


# What to do instead of an unsupported scheme (named in the error, after the scheme).
_COPY_FIRST = " (copy the files to S3, the Hugging Face Hub or a mounted volume first)"
_SCHEME_FIXES = {
    "gs": " (use Cloud Storage's S3-compatible API: s3://<bucket>/<prefix> with s3_endpoint_url="
    "https://storage.googleapis.com and HMAC keys as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
    "http": " (use https://: plain HTTP is refused because its bytes can be altered in transit)",
}

_PARSERS: dict[str, Callable[[str, str], StorageUri]] = {
    "hf": _parse_hf,
    "s3": _parse_s3,
    "file": _parse_file,
    "https": _parse_https,
    "oci": _parse_oci,
}


def parse_uri(uri: str | StorageUri) -> StorageUri:
    """Parse and validate a storage URI; raise ValueError listing the supported forms when it is not one."""
    if isinstance(uri, StorageUri):
        return uri
    if not isinstance(uri, str) or not uri.strip():
        raise _invalid(str(uri), "empty")
    uri = uri.strip()
    if uri.startswith("/"):
        return StorageUri("file", uri, path=_local_path(uri))
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise _invalid(uri, "no scheme and not an absolute path")
    parser = _PARSERS.get(scheme.lower())
    if parser is None:
        raise _invalid(
            uri, f"unknown scheme {scheme.lower()!r}{_SCHEME_FIXES.get(scheme.lower(), _COPY_FIRST)}"
        )
    return parser(uri, rest)


def last_name(uri: str | StorageUri) -> str:
    """The URI's last part: an OCI repository's or hub repo's name, a folder's or prefix's name."""
    uri = parse_uri(uri)
    name = uri.repo_id or uri.path or uri.bucket
    return name.rstrip("/").rsplit("/", 1)[-1]


def pinned_uri(uri: str | StorageUri, pin: str) -> str:
    """`uri` pinned to the bytes it held when `pin` was read: an OCI image by its manifest digest, a hub repo at its
    commit; other schemes as they are (shown: never with credentials)."""
    uri = parse_uri(uri)
    if uri.scheme == "oci" and pin:
        return f"oci://{uri.bucket}/{uri.repo_id}@{pin}"
    if uri.scheme == "hf" and pin:
        return f"hf://{uri.repo_id}{'/' + uri.path if uri.path else ''}@{pin}"
    return uri.shown


def refuse_credentials(**parameters: str) -> None:
    """Raise CredentialsInParameter when the value of a parameter (named as the pipeline user sets it, e.g.
    `data_uri`) carries credentials; the first step of every pipeline checks its URIs so."""
    for name, value in parameters.items():
        what = credentials_in(value)
        if what:
            raise CredentialsInParameter(name, f"{CREDENTIALS_IN_PARAMETER.format(what=what)}.")
