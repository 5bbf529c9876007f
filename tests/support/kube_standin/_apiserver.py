"""The REST side: request semantics (authorization, create/admission/delete/get/list/watch, faults)."""

from __future__ import annotations

import bisect
import copy
import dataclasses
import http.server
import json
import secrets
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ._admission import admit_trainjob
from ._common import (
    GROUP_VERSIONS,
    KINDS,
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    ApiError,
    Route,
    invalid,
    parse_route,
    truthy,
    utc_now,
)
from ._controller import Controller
from ._gc import GarbageCollector
from ._http import Handler
from ._kueue import VISIBILITY_GROUP, Kueue, admit_queued_trainjob
from ._owners import json_merge_patch, owner_reference_errors
from ._rbac import (
    ACCESS_REVIEW_PATH,
    Authorization,
    RbacAuthorizer,
    request_attributes,
    self_subject_access_review,
)
from ._schema import SchemaValidator
from ._store import Store, WatchEvent
from ._typed_schema import TypedModelValidator
from ._types import RecordedRequest

_FAULT_MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected by kube-standin",
    503: "the server is currently unable to handle the request",
    # apimachinery pkg/api/errors NewTimeoutError, as the apiserver's request timeout answers
    # (staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go): the handler goes on and its write may commit.
    504: "the server was unable to return a response in the time allotted, but may still be processing the request",
}
WRITE_METHODS = ("POST", "DELETE")
_NOT_ALLOWED = "the server does not allow this method on the requested resource"
PATCHABLE_METADATA = {"ownerReferences", "labels", "annotations", "resourceVersion"}

# A response: (status, JSON payload, or a callable that streams the body itself once the lock is released).
Response = tuple[int, Any, Callable[[Handler], None] | None]


@dataclasses.dataclass
class Fault:
    count: int
    status: int
    method: str | None
    path_contains: str | None
    retry_after: int | None
    committed: bool = False  # the request takes effect, then the error is answered (writes only)


@dataclasses.dataclass(frozen=True)
class InjectedFault:
    error: ApiError
    committed: bool


class ApiServer:
    """What the API server (with the Trainer webhooks and the garbage collector) does with each request."""

    def __init__(
        self,
        store: Store,
        controller: Controller,
        schemas: dict[str, SchemaValidator | TypedModelValidator],
        token: str,
    ):
        self.store = store
        self.controller = controller
        self.gc = GarbageCollector(store)
        self.kueue = Kueue(store)
        self.schemas = schemas
        self.token = token
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self.watch_drops: list[tuple[int, bool]] = []  # (events before the drop, abrupt)
        self.watch_expiries: list[bool] = []  # as_http_error
        self.watch_delays: dict[str, float] = {}  # plural -> seconds its watch events are delivered late
        self.rbac: RbacAuthorizer | None = None  # None: the token's user may do anything
        self.authorizations: list[Authorization] = []

    def handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        api = self

        class BoundHandler(Handler):
            server_api = api

        return BoundHandler

    def injected_fault(self, method: str, path: str) -> InjectedFault | None:
        with self.store.cond:
            fault = next(
                (
                    f
                    for f in self.faults
                    if f.count > 0
                    and f.method in (None, method)
                    and (f.path_contains or "") in path
                    and (not f.committed or method in WRITE_METHODS)
                ),
                None,
            )
            if fault is None:
                return None
            fault.count -= 1
        retry = fault.retry_after
        error = ApiError(
            fault.status,
            _FAULT_MESSAGES.get(fault.status, "injected by kube-standin"),
            details={"retryAfterSeconds": retry} if retry is not None else None,
            headers={"Retry-After": str(retry)} if retry is not None else None,
        )
        return InjectedFault(error, fault.committed)

    def create(self, route: Route, body: Any, query: dict[str, str]) -> dict:
        if route.plural != "trainjobs" or route.namespace is None or route.name:
            raise ApiError(405, _NOT_ALLOWED)
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        body = copy.deepcopy(body)
        if body.get("apiVersion") != TRAINER_API_VERSION or body.get("kind") != "TrainJob":
            raise ApiError(
                400,
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version "
                f"({TRAINER_API_VERSION})",
            )
        meta = body.setdefault("metadata", {})
        if isinstance(meta, dict):  # else schema validation reports it
            if meta.get("namespace", route.namespace) != route.namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = route.namespace
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name", "") if isinstance(meta, dict) else ""
        # The API server's order: schema validation (with defaulting), admission webhooks, then storage.
        errors = self.schemas["trainjobs"].validate(body)
        errors += owner_reference_errors(meta if isinstance(meta, dict) else {})
        if errors:
            raise invalid("TrainJob", name, errors)
        admit_queued_trainjob(body)  # Kueue's webhooks (_kueue.py)
        admit_trainjob(body, self.store.runtime_of(body))
        body.pop("status", None)  # the status subresource is not written on create
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=utc_now(), generation=1)
        with self.store.cond:
            if self.store.find("trainjobs", route.namespace, name) is not None:
                raise ApiError(
                    409,
                    f'trainjobs.{TRAINER_GROUP} "{name}" already exists',
                    details={"name": name, "group": TRAINER_GROUP, "kind": "trainjobs"},
                )
            if query.get("dryRun") == "All":
                meta["resourceVersion"] = str(self.store.current_rv)
                return body
            stored = copy.deepcopy(self.store.put("trainjobs", body, "ADDED"))
            self.kueue.create_workload(stored)
        self.controller.start(stored)
        self.gc.delete_orphans(route.namespace, self.controller.cancel)  # an owner that does not exist here
        return stored

    def patch(self, route: Route, body: Any) -> dict:
        """A JSON merge patch of a TrainJob's metadata (_owners.py); ``metadata.resourceVersion`` in the patch is a
        precondition (409 Conflict when stale), as for any update."""
        if route.plural != "trainjobs" or route.name is None or route.namespace is None:
            raise ApiError(405, _NOT_ALLOWED)
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        meta_patch = body.get("metadata") or {}
        if set(body) - {"metadata"} or set(meta_patch) - PATCHABLE_METADATA:
            raise ApiError(405, "kube-standin serves PATCH of TrainJob metadata only (a known deviation)")
        with self.store.cond:
            job = self.store.get(route)
            wanted = meta_patch.get("resourceVersion")
            if wanted and wanted != job["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on trainjobs.{TRAINER_GROUP} "{route.name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    reason="Conflict",
                    details={"name": route.name, "group": TRAINER_GROUP, "kind": "trainjobs"},
                )
            patched = json_merge_patch(job, body)
            if errors := owner_reference_errors(patched["metadata"]):
                raise invalid("TrainJob", route.name, errors)
            patched["metadata"]["generation"] = job["metadata"]["generation"]  # metadata changes keep it
            stored = copy.deepcopy(self.store.put("trainjobs", patched, "MODIFIED"))
        self.gc.delete_orphans(route.namespace, self.controller.cancel)
        return stored

    def delete(self, route: Route, body: Any, query: dict[str, str]) -> dict:
        """DELETE of a TrainJob; its JobSet and pods (dependents) follow unless propagationPolicy is Orphan
        (_gc.py: at once, or step by step when garbage collection is held)."""
        if route.plural != "trainjobs" or route.name is None or route.namespace is None:
            raise ApiError(405, _NOT_ALLOWED)
        options = body if isinstance(body, dict) else {}
        policy = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        with self.store.cond:
            job = self.store.get(route)
            if query.get("dryRun") == "All" or options.get("dryRun") == ["All"]:
                return job
            self.controller.cancel(route.namespace, route.name)
            return copy.deepcopy(self.gc.delete_trainjob(job, policy))

    def authorize(self, method: str, path: str, query: dict[str, str]) -> None:
        """Record what the request asks for; with RBAC enforced, a 403 unless a binding grants it (before routing,
        as the apiserver's WithAuthorization filter: an unknown resource is forbidden, not a 404)."""
        attrs = request_attributes(method, path, query)
        if attrs is None:
            return
        with self.store.cond:
            rbac = self.rbac
            allowed = rbac is None or rbac.allows(attrs)
            self.authorizations.append(Authorization(attrs, rbac.user if rbac else "", allowed))
        if rbac is not None and not allowed:
            raise rbac.forbidden(attrs)

    def dispatch(
        self, method: str, path: str, query: dict[str, str], body: Any, authorization: str
    ) -> Response:
        if authorization != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        fault = self.injected_fault(method, path)
        if fault is not None and not fault.committed:
            raise fault.error
        if path.rstrip("/") == ACCESS_REVIEW_PATH:  # allowed for everyone (system:basic-user), not recorded
            if method != "POST":
                raise ApiError(405, _NOT_ALLOWED)
            with self.store.cond:
                return 201, self_subject_access_review(self.rbac, body), None
        self.authorize(method, path, query)
        if path.startswith(f"/apis/{VISIBILITY_GROUP}/"):  # Kueue's aggregated API server (_kueue.py)
            return self.kueue.visibility(method, path, query)
        route = parse_route(path)
        if (
            route is None
            or (route.subresource and (route.plural, route.subresource) != ("pods", "log"))
            or (not KINDS[route.plural][2] and route.namespace is not None)
        ):
            raise ApiError(404, "the server could not find the requested resource", details={})
        if method in WRITE_METHODS:
            done = {"POST": self.create, "DELETE": self.delete}[method](route, body, query)
            if fault is not None:  # committed: the client hears only the error
                raise fault.error
            return (201 if method == "POST" else 200), done, None
        if method == "PATCH":
            return 200, self.patch(route, body), None
        if method != "GET":
            raise ApiError(405, _NOT_ALLOWED)
        if route.subresource == "log":
            return 200, None, self.log_stream(self.store.get(route), query)
        if route.name:
            return 200, self.store.get(route), None
        if truthy(query.get("watch")):
            return 200, None, self.watch_stream(route, query)
        return 200, self.store.list_response(route, query), None

    # Streams: prepared here (so no event is missed and errors are still plain responses), written by the Handler.

    def watch_stream(self, route: Route, query: dict[str, str]) -> Callable[[Handler], None]:
        """A watch as the apiserver's watch cache serves it (apiserver pkg/storage/cacher: cacher.go, watch_cache.go,
        cache_watcher.go): ADDED events for what exists when no resourceVersion is given, else every change after
        it; a resourceVersion older than the kept history (``Store.compact``) or an injected expiry gets an ERROR
        event with a 410 ``Expired`` Status; with ``allowWatchBookmarks`` BOOKMARK events carry the newest
        resourceVersion (every minute, 2s before ``timeoutSeconds`` ends, and when a test asks)."""
        store = self.store
        selected = store.selector(route, query)
        since = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        bookmarks = truthy(query.get("allowWatchBookmarks"))
        with store.cond:
            expiry = self.watch_expiries.pop(0) if since not in ("", "0") and self.watch_expiries else None
            if expiry is None and since not in ("", "0") and int(since) < store.compacted_rv:
                expiry = False  # the cacher answers an expired version with an ERROR event (newErrWatcher)
            drop = self.watch_drops.pop(0) if self.watch_drops and expiry is None else None
            oldest = store.compacted_rv if int(since or 0) < store.compacted_rv else store.current_rv
            too_old = f"too old resource version: {since} ({oldest})"
            if expiry:  # as_http_error: a plain 410 answer instead of a stream
                raise ApiError(410, too_old, reason="Gone")
            if since in ("", "0"):  # a watch without a version starts with ADDED events for what exists now
                initial = [
                    WatchEvent(store.current_rv, p, ns, "ADDED", copy.deepcopy(obj))
                    for (p, ns, _), obj in sorted(store.objects.items())
                    if selected(p, ns, obj)
                ]
                position = store.current_rv
            else:
                initial, position = [], int(since)
            for event in initial:  # what exists when the watch opens is sent at once
                event.at = float("-inf")
            bookmarks_asked = store.bookmark_requests
        group, kind, _ = KINDS[route.plural]

        def bookmark(rv: int) -> WatchEvent:
            # Only the resourceVersion (cacher.go: the watch cache's newest version, past events the selectors
            # filtered out); for a custom resource an empty unstructured object of the kind.
            api_version = f"{group}/{GROUP_VERSIONS[group]}" if group else "v1"
            obj = {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": str(rv)}}
            return WatchEvent(rv, route.plural, route.namespace, "BOOKMARK", obj)

        def stream(handler: Handler) -> None:
            nonlocal bookmarks_asked
            handler.start_chunked("application/json")
            if expiry is False:  # the real server's way: an ERROR event carrying a 410 Status, then the end
                status = ApiError(410, too_old, reason="Expired").status
                handler.chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                handler.end_chunked()
                return
            pending, cursor, sent = list(initial), position, 0
            end = time.monotonic() + timeout if timeout else None

            def next_bookmark_time(now: float) -> float:
                # cache_watcher.go nextBookmarkTime: every minute, or 2s before the watch times out if sooner.
                due = now + 60.0
                if end is not None and end - 2.0 < due:
                    due = end - 2.0 if end - 2.0 > now else float("inf")
                return due

            next_bookmark = next_bookmark_time(time.monotonic())
            while True:
                with store.cond:
                    newer = store.history[bisect.bisect_right(store.history, cursor, key=lambda e: e.rv) :]
                    pending += [e for e in newer if selected(e.plural, e.namespace, e.obj)]
                    cursor = store.current_rv
                    now = time.monotonic()
                    if bookmarks and (store.bookmark_requests > bookmarks_asked or now >= next_bookmark):
                        pending.append(bookmark(cursor))
                        bookmarks_asked = store.bookmark_requests
                        if now >= next_bookmark:
                            next_bookmark = next_bookmark_time(now)
                    # A lagging watch (delay_watch_events) sends, in order, only what happened `lag` ago.
                    lag = self.watch_delays.get(route.plural, 0.0)
                    due = next((i for i, e in enumerate(pending) if e.at > now - lag), len(pending))
                    if not due:
                        if store.stopping or (end and time.monotonic() >= end):
                            break
                        store.cond.wait(0.1 if end is None else max(0.0, min(0.1, end - time.monotonic())))
                        continue
                    ready, pending = pending[:due], pending[due:]
                for event in ready:
                    if drop is not None and sent >= drop[0]:
                        if drop[1]:
                            handler.cut_connection()
                        else:
                            handler.end_chunked()
                        return
                    handler.chunk(json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n")
                    sent += 1
            handler.end_chunked()

        return stream

    def log_stream(self, pod: dict, query: dict[str, str]) -> Callable[[Handler], None]:
        store = self.store
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        container = query.get("container") or (containers[0] if len(containers) == 1 else None)
        if container is None:
            raise ApiError(
                400,
                f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]",
            )
        if container not in containers:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        if pod["status"]["phase"] == "Pending":
            statuses = pod["status"].get("containerStatuses") or [{}]
            reason = statuses[0].get("state", {}).get("waiting", {}).get("reason") or "ContainerCreating"
            raise ApiError(400, f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        # The kubelet's validateContainerLogStatus (pkg/kubelet/kubelet_pods.go): ``previous`` reads the container
        # in lastState.terminated (404-like 400 if none); a container waiting in CrashLoopBackOff serves the
        # crashed container's log; a follow ends when the container is not running.
        status = next((s for s in pod["status"].get("containerStatuses") or [] if s["name"] == container), {})
        previous = truthy(query.get("previous"))
        if previous and not (status.get("lastState") or {}).get("terminated"):
            raise ApiError(400, f'previous terminated container "{container}" in pod "{name}" not found')
        previous = previous and "running" in (status.get("state") or {})  # else the crashed one is current
        follow = truthy(query.get("follow")) and not truthy(query.get("previous"))
        timestamps = truthy(query.get("timestamps"))
        tail = int(query["tailLines"]) if query.get("tailLines") else None
        since = time.time() - int(query["sinceSeconds"]) if query.get("sinceSeconds") else None
        limit = int(query["limitBytes"]) if query.get("limitBytes") else None

        def render(entries: list[tuple[float, str]]) -> bytes:
            stamp = "%Y-%m-%dT%H:%M:%S.%f000Z "
            return "".join(
                (datetime.fromtimestamp(t, timezone.utc).strftime(stamp) if timestamps else "") + line
                for t, line in entries
            ).encode()

        cuts = store.log_cuts

        def stream(handler: Handler) -> None:
            handler.start_chunked("text/plain")
            entries = store.log_entries(namespace, name, previous=previous)
            position = len(entries)
            entries = [e for e in entries if since is None or e[0] >= since]
            if tail is not None:
                entries = entries[-tail:] if tail else []
            budget = limit
            while True:
                data = render(entries)
                if budget is not None:
                    data = data[:budget]
                    budget -= len(data)
                handler.chunk(data)
                if not follow or budget == 0:
                    break
                with store.cond:  # next lines, or the end once the container has terminated
                    entries = store.log_entries(namespace, name)[position:]
                    position += len(entries)
                    current = store.objects.get(("pods", namespace, name))
                    finished = current is None or not _container_running(current, container)
                    if store.log_cuts != cuts:  # the stream ends early while the container runs on
                        break
                    if not entries:
                        if finished or store.stopping:
                            break
                        store.cond.wait(0.1)
            handler.end_chunked()

        return stream


def _container_running(pod: dict, container: str) -> bool:
    if pod["status"]["phase"] in ("Succeeded", "Failed"):
        return False
    status = next((s for s in pod["status"].get("containerStatuses") or [] if s["name"] == container), {})
    return "running" in (status.get("state") or {"running": {}})
