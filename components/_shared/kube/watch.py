"""List, then watch from the list's resourceVersion: a Watch object per watched collection, with stop().

Modelled on kubernetes-client's `watch.Watch` (kubernetes/base/watch/watch.py), with what client-go's Reflector
(tools/cache/reflector.go ListAndWatch) adds, so a caller sees one consistent stream until it stops it:

- list first (a `LISTED` event with every current object), then watch from the list's resourceVersion;
- ask for bookmarks (`allowWatchBookmarks=true`): a BOOKMARK (an object with only `metadata.resourceVersion`) only
  advances the resourceVersion the next watch starts from; it is never passed on as an object;
- 410 Gone (an `ERROR` event carrying a 410 Status, or an HTTP 410): the resourceVersion is too old, so list again
  (another `LISTED` event) and go on watching from there;
- a watch the server ended (`timeoutSeconds`) or a dropped connection is re-opened from the last resourceVersion;
  transient API errors (429, 5xx) are retried with endless exponential backoff;
- `stop()` from any thread ends `stream()` and cuts the open response (socket shutdown): a read blocked on a quiet
  watch ends at once instead of at the server's timeout. A stopped Watch stays stopped.

`Streams` does the cutting for any streaming response (pod logs too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff, call_with_retry, is_retryable

LISTED = "LISTED"
BOOKMARK = "BOOKMARK"


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """What a Watch yields.

    Attributes:
        type: `LISTED` (a fresh list: `items` is every object now; forget what you knew), `ADDED`, `MODIFIED` or
            `DELETED` (`object` is the object, as JSON).
        object: The object of an ADDED/MODIFIED/DELETED event; None for LISTED.
        items: The objects of a LISTED event; empty otherwise.
    """

    type: str
    object: dict | None = None
    items: list[dict] = dataclasses.field(default_factory=list)


class Streams:
    """The streaming responses being read, so that `close_all()` (from any thread) can cut them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self._closed = False

    @contextlib.contextmanager
    def reading(self, response: Any) -> Iterator[Any]:
        """Track `response` while it is read; it is released afterwards (and cut at once once closed)."""
        with self._lock:
            self._open.add(response)
            closed = self._closed
        try:
            if closed:
                shut_down(response)
            yield response
        finally:
            with self._lock:
                self._open.discard(response)
            response.close()
            response.release_conn()

    def close_all(self) -> None:
        """Cut every response being read now and any read later."""
        with self._lock:
            self._closed = True
            responses = list(self._open)
        for response in responses:
            shut_down(response)


def shut_down(response: Any) -> None:
    """End a streaming urllib3 response from another thread: shutdown() wakes a blocked read, close() does not."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def is_connection_error(error: BaseException) -> bool:
    """A dropped, cut or timed-out stream (including a line cut in half)."""
    from urllib3.exceptions import HTTPError as Urllib3Error

    return isinstance(error, Urllib3Error | ConnectionError | TimeoutError | json.JSONDecodeError)


class Watch:
    """List and watch one collection (see the module docstring).

    Args:
        backoff: Retry/backoff of the list and of re-opening the watch (its `sleep` is injectable).
        timeout_seconds: Server-side timeout of each watch request; the watch is then re-opened.
        on_retry: Called with (error, delay) before a transient error of the list is retried.
        log: Where to say that the watch expired and is re-listed.

    Use: `for event in watch.stream(core.list_namespaced_pod, namespace, label_selector=...)`, from one thread;
    `watch.stop()` from any thread.
    """

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        timeout_seconds: int = 60,
        on_retry: Callable[[BaseException, float], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.backoff = backoff or Backoff()
        self.timeout_seconds = timeout_seconds
        self.on_retry = on_retry
        self.log = log or logging.getLogger(__name__)
        self.resource_version: str | None = None  # where the next watch starts; None: list first
        self._stopped = threading.Event()
        self._streams = Streams()

    def stop(self) -> None:
        """End `stream()` and cut its open response; callable from any thread, before or during `stream()`."""
        self._stopped.set()
        self._streams.close_all()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stream(self, list_fn: Callable[..., Any], *args: Any, **selectors: Any) -> Iterator[WatchEvent]:
        """Events of the collection `list_fn(*args, **selectors)` lists, until `stop()` (see the module docstring).

        `list_fn` is a kubernetes-client list method (e.g. `CustomObjectsApi.list_namespaced_custom_object`);
        `selectors` are its keyword arguments (label_selector, field_selector). Non-transient API errors raise.
        """
        from kubernetes.client.exceptions import ApiException

        failures = self._endless_backoff()
        while not self.stopped:
            try:
                if self.resource_version is None:
                    listing = call_with_retry(
                        raw_json(list_fn), *args, backoff=self.backoff, on_retry=self._retrying, **selectors
                    )
                    self.resource_version = listing["metadata"]["resourceVersion"]
                    yield WatchEvent(LISTED, items=listing.get("items") or [])
                for event in self._watch_once(list_fn, *args, **selectors):
                    if self.stopped:
                        return
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    self.resource_version = version or self.resource_version
                    if event["type"] != BOOKMARK:  # a bookmark only moves the resourceVersion on
                        yield WatchEvent(event["type"], obj)
                failures = self._endless_backoff()  # a healthy watch resets the backoff
            except ApiException as error:
                if self.stopped:
                    return
                if error.status == 410:  # our resourceVersion is too old: start over from a fresh list
                    self.log.info("watch expired (410 Gone); re-listing")
                    self.resource_version = None
                    continue
                if not is_retryable(error):
                    raise
                self.backoff.sleep(next(failures))
            except Exception as error:  # dropped connection / read timeout / cut by stop(): re-open the watch
                if self.stopped:
                    return
                if not (is_retryable(error) or is_connection_error(error)):
                    raise
                self.backoff.sleep(min(next(failures), 1.0))

    def _watch_once(self, list_fn: Callable[..., Any], *args: Any, **selectors: Any) -> Iterator[dict]:
        """One watch request as parsed events; an ERROR event is raised as ApiException with its Status code."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        response = list_fn(
            *args,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_seconds,
            _preload_content=False,
            _request_timeout=(10, self.timeout_seconds + 10),
            **selectors,
        )
        with self._streams.reading(response):
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiException(
                        status=status.get("code", 500), reason=status.get("message", "watch error")
                    )
                yield event

    def _retrying(self, error: BaseException, delay: float) -> None:
        if self.stopped:  # no retries (and no log lines) once stopped
            raise error
        if self.on_retry:
            self.on_retry(error, delay)

    def _endless_backoff(self) -> Iterator[float]:
        """Backoff delays that never run out: a watch keeps trying until it is stopped."""
        return dataclasses.replace(self.backoff, attempts=1_000_000).delays()


def raw_json(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` answering the response JSON as plain dicts (the typed models are slow and lossy for pods)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        response = fn(*args, _preload_content=False, **kwargs)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    return call
