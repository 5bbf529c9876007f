"""Retries: which errors are transient (timeouts, dropped connections, 408/429/5xx) and `with_retries`."""

from __future__ import annotations

import contextlib
import importlib
import os
import ssl
import time
import urllib.error
from collections.abc import Callable
from typing import TypeVar

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.redact import redact_text

log = get_logger(__name__)

T = TypeVar("T")


def status_code(exc: BaseException) -> int | None:
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
    from botocore.exceptions import FlexibleChecksumError, HTTPClientError

    # FlexibleChecksumError: the bytes boto3 read do not match the object's CRC, i.e. damaged in transit.
    errors: list[type[BaseException]] = [
        BotoConnectionError, HTTPClientError, FlexibleChecksumError, ConnectionError, TimeoutError,
    ]  # fmt: skip
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
        code = status_code(exc)
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


def _first_line(exc: BaseException) -> str:
    # Redacted before it is cut: a cut inside a URL's userinfo would leave nothing for the log's redaction to find.
    return redact_text(str(exc)).splitlines()[0][:200] if str(exc) else ""


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
                what, type(exc).__name__, _first_line(exc), attempt, attempts - 1, delay,
            )  # fmt: skip
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
