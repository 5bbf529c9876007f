"""Credentials in URLs: the one place they are taken out of what is shown, and found in parameters.

Credentials never leave the environment: a URI's query string (a presigned URL's X-Amz-Signature, a CDN's
Signature / Expires / Key-Pair-Id) and userinfo (`user:pass@`) are replaced by `<redacted>` wherever a URI is
logged, raised or recorded (`redact_uri`). `redact_text` does the same for every URL inside a text: a client's
error message naming the signed URL it requested, an endpoint with userinfo; logs.py passes every log record
through it, and StorageError every message. `credentials_in` finds them in a URI given as a pipeline parameter,
which is refused (KFP prints and stores parameters: `CREDENTIALS_IN_PARAMETER`).
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_USERINFO = re.compile(rf"^({_SCHEME}://)[^/?#]*@")
# A URL inside a text: a scheme, `://`, then everything up to white space, a quote (repr, JSON) or an angle
# bracket. A query runs to the end of the match, so all of a signed URL's parameters go with it.
_URL_IN_TEXT = re.compile(rf"""{_SCHEME}://[^\s'"<>`]+""")
# A signed URL's parameters seen without their URL (the hub client shows the last 40 characters of the URL it
# read in a size-mismatch error): S3 presigning (X-Amz-*), CloudFront (Signature, Policy, Key-Pair-Id, Expires),
# Azure SAS (sig), tokens.
_SIGNED_PARAMETER = re.compile(
    r"(?i)\b(X-Amz-[A-Za-z-]+|Signature|Policy|Key-Pair-Id|Expires|sig|token|access_token)=[^&\s'\"<>)]+"
)


def redact_uri(uri: str) -> str:
    """`uri` without secrets: `?<query>` becomes `?<redacted>`, `user:pass@` after the scheme `<redacted>@`."""
    uri = str(uri)
    base, question, _query = uri.partition("?")
    base = _USERINFO.sub(rf"\1{REDACTED}@", base)
    return f"{base}?{REDACTED}" if question else base


def _redacted_url(match: re.Match) -> str:
    # Punctuation that ends the sentence around a URL ("(… url); retry") is kept, not redacted with the query.
    url = match[0].rstrip(").,;:!")
    return redact_uri(url) + match[0][len(url) :]


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted as `redact_uri` does, and every signed URL's parameter outside one
    (`Signature=…` → `Signature=<redacted>`); the rest unchanged."""
    text = str(text)
    if "://" in text:
        text = _URL_IN_TEXT.sub(_redacted_url, text)
    return _SIGNED_PARAMETER.sub(rf"\1={REDACTED}", text) if "=" in text else text


# Why a URI with credentials is refused as a pipeline parameter, and what to do instead (after "<name> ").
CREDENTIALS_IN_PARAMETER = (
    "carries credentials ({what}): KFP prints every pipeline parameter in each step's log and stores it with "
    "the run, where the UI shows it. Give the URI without them and the credentials through a Kubernetes Secret: "
    "HF_TOKEN (the Secret named by hf_token_secret) for hf://, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the "
    "Secret named by s3_secret) for s3:// and its endpoint; copy a private https:// file to S3 or the hub first"
)


def credentials_in(value: str) -> str | None:
    """What credentials a URI carries in itself (userinfo, a query string), or None. A local path carries none
    (a `?` may be part of a file name)."""
    value = str(value).strip()
    scheme, sep, rest = value.partition("://")
    if not sep or not re.fullmatch(_SCHEME, scheme) or scheme.lower() == "file":
        return None
    found = []
    if _USERINFO.match(value.partition("?")[0]):
        found.append("user:password@ before the host")
    if "?" in rest:
        found.append("a query string, such as a presigned URL's signature")
    return " and ".join(found) or None
