"""The REST side: request semantics (create/admission/delete/get/list, faults) and the HTTP transport."""

from __future__ import annotations

import bisect
import copy
import dataclasses
import http.server
import json
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ._common import (
    KINDS,
    PLURAL_OF_KIND,
    TORCH_RESERVED_ENV,
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    TUNE_ENTRYPOINT,
    ApiError,
    Route,
    invalid,
    parse_route,
    truthy,
    utc_now,
)
from ._controller import Controller
from ._gc import GarbageCollector
from ._schema import SchemaValidator
from ._store import Store, WatchEvent
from ._typed_schema import TypedModelValidator
from ._types import RecordedRequest

_FAULT_MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected by kube-standin",
    503: "the server is currently unable to handle the request",
}
_NOT_ALLOWED = "the server does not allow this method on the requested resource"
_WEBHOOK_DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '

# A response: (status, JSON payload, or a callable that streams the body itself once the lock is released).
Response = tuple[int, Any, Callable[["_Handler"], None] | None]


@dataclasses.dataclass
class Fault:
    count: int
    status: int
    method: str | None
    path_contains: str | None
    retry_after: int | None


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
        self.schemas = schemas
        self.token = token
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self.watch_drops: list[tuple[int, bool]] = []  # (events before the drop, abrupt)
        self.watch_expiries: list[bool] = []  # as_http_error

    def handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        api = self

        class Handler(_Handler):
            server_api = api

        return Handler

    def injected_fault(self, method: str, path: str) -> ApiError | None:
        with self.store.cond:
            fault = next(
                (
                    f
                    for f in self.faults
                    if f.count > 0 and f.method in (None, method) and (f.path_contains or "") in path
                ),
                None,
            )
            if fault is None:
                return None
            fault.count -= 1
        retry = fault.retry_after
        return ApiError(
            fault.status,
            _FAULT_MESSAGES.get(fault.status, "injected by kube-standin"),
            details={"retryAfterSeconds": retry} if retry is not None else None,
            headers={"Retry-After": str(retry)} if retry is not None else None,
        )

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
        if errors:
            raise invalid("TrainJob", name, errors)
        self._admit_trainjob(body)
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
        self.controller.start(stored)
        return stored

    def _admit_trainjob(self, job: dict) -> None:
        """The Trainer v2.3 webhooks on create: stamp runtimePatches[].time, check the runtime and torch env."""
        now = utc_now()
        for patch in job["spec"].get("runtimePatches", []):
            patch.setdefault("time", now)
        ref = job["spec"]["runtimeRef"]
        if ref.get("apiGroup") != TRAINER_GROUP or ref.get("kind") not in PLURAL_OF_KIND:
            raise ApiError(
                403, _WEBHOOK_DENIED + f"unsupported runtime: {ref.get('kind')}.{ref.get('apiGroup')}"
            )
        runtime = self.store.runtime_of(job)
        if runtime is None:
            cluster = ref["kind"] == "ClusterTrainingRuntime"
            field = (
                "spec.RuntimeRef" if cluster else "spec.runtimeRef"
            )  # sic: upstream spells them differently
            which = "clusterTrainingRuntime" if cluster else "trainingRuntime"
            raise ApiError(
                403,
                _WEBHOOK_DENIED + f"{field}: Invalid value: {json.dumps(ref, separators=(',', ':'))}: "
                f'{ref["kind"]}.{TRAINER_GROUP} "{ref["name"]}" not found: specified {which} must be created '
                "before the TrainJob is created",
            )
        trainer = job["spec"].get("trainer") or {}
        if "torch" in runtime["spec"].get("mlPolicy", {}) and trainer.get("command") != TUNE_ENTRYPOINT:
            reserved = sorted({e["name"] for e in trainer.get("env", []) if e["name"] in TORCH_RESERVED_ENV})
            if reserved:
                raise ApiError(
                    403,
                    _WEBHOOK_DENIED + "spec.trainer.env: Invalid value: "
                    f"{json.dumps(trainer['env'], separators=(',', ':'))}: must not have reserved envs, invalid "
                    f"envs configured: [{' '.join(reserved)}]",
                )

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

    def dispatch(
        self, method: str, path: str, query: dict[str, str], body: Any, authorization: str
    ) -> Response:
        if authorization != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        if fault := self.injected_fault(method, path):
            raise fault
        route = parse_route(path)
        if (
            route is None
            or (route.subresource and (route.plural, route.subresource) != ("pods", "log"))
            or (not KINDS[route.plural][2] and route.namespace is not None)
        ):
            raise ApiError(404, "the server could not find the requested resource", details={})
        if method == "POST":
            return 201, self.create(route, body, query), None
        if method == "DELETE":
            return 200, self.delete(route, body, query), None
        if method != "GET":
            raise ApiError(405, _NOT_ALLOWED)
        if route.subresource == "log":
            return 200, None, self.log_stream(self.store.get(route), query)
        if route.name:
            return 200, self.store.get(route), None
        if truthy(query.get("watch")):
            return 200, None, self.watch_stream(route, query)
        return 200, self.store.list_response(route, query), None

    # Streams: prepared here (so no event is missed and errors are still plain responses), written by _Handler.

    def watch_stream(self, route: Route, query: dict[str, str]) -> Callable[[_Handler], None]:
        store = self.store
        selected = store.selector(route, query)
        since = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        with store.cond:
            expiry = self.watch_expiries.pop(0) if since not in ("", "0") and self.watch_expiries else None
            drop = self.watch_drops.pop(0) if self.watch_drops and expiry is None else None
            too_old = f"too old resource version: {since} ({store.current_rv})"
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

        def stream(handler: _Handler) -> None:
            handler.start_chunked("application/json")
            if expiry is False:  # the real server's way: an ERROR event carrying a 410 Status, then the end
                status = ApiError(410, too_old, reason="Expired").status
                handler.chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                handler.end_chunked()
                return
            pending, cursor, sent = list(initial), position, 0
            end = time.monotonic() + timeout if timeout else None
            while True:
                with store.cond:
                    newer = store.history[bisect.bisect_right(store.history, cursor, key=lambda e: e.rv) :]
                    pending += [e for e in newer if selected(e.plural, e.namespace, e.obj)]
                    cursor = store.current_rv
                    if not pending:
                        if store.stopping or (end and time.monotonic() >= end):
                            break
                        store.cond.wait(0.1 if end is None else max(0.0, min(0.1, end - time.monotonic())))
                        continue
                for event in pending:
                    if drop is not None and sent >= drop[0]:
                        if drop[1]:
                            handler.cut_connection()
                        else:
                            handler.end_chunked()
                        return
                    handler.chunk(json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n")
                    sent += 1
                pending = []
            handler.end_chunked()

        return stream

    def log_stream(self, pod: dict, query: dict[str, str]) -> Callable[[_Handler], None]:
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

        def stream(handler: _Handler) -> None:
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


class _Handler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 transport: JSON answers with Content-Length, watch and log streams chunked, as kube-apiserver."""

    protocol_version = "HTTP/1.1"  # keep-alive connections, as the client's urllib3 pool expects
    server_api: ApiServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the request log is kept in memory
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        api = self.server_api
        split = urlsplit(self.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        headers: Mapping[str, str] = {}
        try:
            status, payload, stream = api.dispatch(
                method, split.path, query, body, self.headers.get("Authorization", "")
            )
        except ApiError as error:
            status, payload, stream, headers = error.code, error.status, None, error.headers
        except Exception as error:  # a stand-in bug must surface as a 500, not as a hung client
            status, payload, stream = 500, ApiError(500, f"kube-standin: {error!r}").status, None
        with api.store.cond:
            api.requests.append(RecordedRequest(method, split.path, query, body, status))
            api.store.cond.notify_all()  # for KubeStandin.wait_for_request
        if stream is None:
            self._send_json(status, payload, headers)
            return
        try:
            stream(self)
        except (BrokenPipeError, ConnectionResetError):  # the client went away mid-stream
            self.close_connection = True

    def _send_json(self, status: int, payload: Any, headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def cut_connection(self) -> None:
        """Close mid-stream without the final chunk: the client sees a broken connection."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)
