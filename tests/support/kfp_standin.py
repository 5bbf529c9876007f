"""An in-process stand-in for the KFP v2beta1 REST API, for tests that drive the real ``kfp.Client``.

It serves, on 127.0.0.1 over HTTP, the subset of the API server that `kfp.Client` uses to upload pipelines, start
runs and create recurring runs, keeps what was created, and records every request so tests can assert what the
client sent. Usage:

    with KfpStandin(token="secret", multi_user=True) as kfp_api:
        client = kfp.Client(host=kfp_api.url, existing_token="secret", namespace="team-a")
        ...
        kfp_api.requests_for("POST", "/apis/v2beta1/runs")[0].json    # the run body as sent
        kfp_api.runs, kfp_api.recurring_runs, kfp_api.pipelines, kfp_api.versions, kfp_api.experiments

The fixture ``kfp_standin`` yields a started single-user instance without auth.

Served (JSON in and out, grpc-gateway style errors ``{"error", "code", "message", "details"}``):
  * ``GET  /apis/v2beta1/healthz`` -> ``{"multi_user": ...}``
  * ``POST /apis/v2beta1/pipelines/upload`` (multipart ``uploadfile``; query name/display_name/description/
    namespace): creates a pipeline and its first version, named after the pipeline. 409 on a duplicate name.
  * ``POST /apis/v2beta1/pipelines/upload_version`` (multipart; query name/display_name/pipelineid/description):
    404 for an unknown pipeline, 409 on a duplicate version name within the pipeline.
  * ``GET  /apis/v2beta1/pipelines`` (filter, namespace), ``GET /apis/v2beta1/pipelines/{id}``,
    ``GET  /apis/v2beta1/pipelines/{id}/versions`` (filter, sort_by, page_size), ``.../versions/{version_id}``
  * ``GET/POST /apis/v2beta1/experiments`` (filter, namespace), ``GET /apis/v2beta1/experiments/{id}``
  * ``POST /apis/v2beta1/runs``, ``GET /apis/v2beta1/runs/{id}``
  * ``POST /apis/v2beta1/recurringruns``, ``GET /apis/v2beta1/recurringruns/{id}``
  * The same paths behind the Kubernetes API server's service proxy prefix
    ``/api/v1/namespaces/<ns>/services/ml-pipeline:http/proxy`` (how kfp.Client reaches KFP with a kubeconfig).

Validation mirrors the API server where the CLI depends on it: uploaded files must be compiled pipelines (YAML with
pipelineInfo and root); a run or recurring run needs exactly one of ``pipeline_spec`` and
``pipeline_version_reference`` (which must name an existing version of that pipeline) and an existing experiment;
``max_concurrency`` must be 1-10; a trigger needs exactly one of ``cron_schedule`` (5 or 6 fields, or an ``@``
descriptor, as robfig/cron v1 accepts) and ``periodic_schedule`` (interval > 0); in multi-user mode experiments
and uploads need a namespace. With ``token`` set, a request without ``Authorization: Bearer <token>`` gets 401.

Known deviations: no pagination (``next_page_token`` is never set), filters understand only ``EQUALS`` predicates,
``sort_by`` only ``created_at`` (asc/desc); nothing is ever executed (runs stay ``PENDING``); archives (.zip/.tar.gz)
are stored without being unpacked; runtime parameters are stored, not checked against the pipeline's inputs.
"""

from __future__ import annotations

import datetime
import email.parser
import email.policy
import itertools
import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

API = "/apis/v2beta1"
_PROXY_PREFIX = re.compile(
    r"^/api/v1/namespaces/(?P<namespace>[^/]+)/services/ml-pipeline:http/proxy(?P<rest>/.*)$"
)
_GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 6}


@dataclass
class RecordedRequest:
    method: str
    path: str  # without the proxy prefix and query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    json: Any = None
    # multipart field -> (filename, content)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    proxy_namespace: str | None = None  # set when the request came through the Kubernetes service proxy

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KfpStandin:
    def __init__(
        self, *, token: str | None = None, multi_user: bool = False, workspace_default: dict | None = None
    ):
        self.token = token
        self.multi_user = multi_user
        # The admin's default workspace PVC spec (config.json Workspace.VolumeClaimTemplateSpec); none by default,
        # as on a stock install.
        self.workspace_default = workspace_default
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}  # version id -> version (with pipeline_id)
        self.uploads: dict[str, bytes] = {}  # version id -> the uploaded file's bytes
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self._requests: list[RecordedRequest] = []
        self._order = itertools.count()  # creation order (timestamps tie within a second)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> KfpStandin:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _handle(self) -> None:
                status, body = standin._dispatch(self)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KfpStandin:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- inspection and seeding ------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, method: str, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path == path]

    def add_experiment(self, display_name: str, namespace: str = "") -> dict:
        with self._lock:
            return self._create_experiment({"display_name": display_name, "namespace": namespace})

    def versions_of(self, pipeline_id: str) -> list[dict]:
        """The pipeline's versions, oldest first."""
        with self._lock:
            return sorted(
                (v for v in self.versions.values() if v["pipeline_id"] == pipeline_id), key=_order_key
            )

    # --- request handling ------------------------------------------------------------------------------------

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> tuple[int, Any]:
        parts = urlsplit(handler.path)
        path, proxy_namespace = re.sub("/{2,}", "/", parts.path), None
        proxied = _PROXY_PREFIX.match(path)
        if proxied:
            path, proxy_namespace = proxied["rest"], proxied["namespace"]
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        request = RecordedRequest(
            method=handler.command,
            path=path.rstrip("/") or "/",
            query=parse_qs(parts.query, keep_blank_values=True),
            headers={name.lower(): value for name, value in handler.headers.items()},
            proxy_namespace=proxy_namespace,
        )
        content_type = handler.headers.get("Content-Type") or ""
        try:
            if content_type.startswith("multipart/form-data"):
                request.files = _parse_multipart(content_type, raw)
            elif raw:
                request.json = json.loads(raw)
        except ValueError as error:
            return self._error(400, f"cannot parse the request body: {error}")
        with self._lock:
            self._requests.append(request)
            try:
                self._authorize(request)
                return 200, self._route(request)
            except ApiError as error:
                return self._error(error.status, error.message)

    @staticmethod
    def _error(status: int, message: str) -> tuple[int, dict]:
        return status, {
            "error": message,
            "code": _GRPC_CODES.get(status, 13),
            "message": message,
            "details": [],
        }

    def _authorize(self, request: RecordedRequest) -> None:
        if self.token is None:
            return
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthenticated: the request carries no valid bearer token")

    def _route(self, request: RecordedRequest) -> Any:
        method, path = request.method, request.path
        if not path.startswith(API + "/"):
            raise ApiError(404, f"Not Found: {path}")
        segments = path[len(API) + 1 :].split("/")
        match method, segments:
            case "GET", ["healthz"]:
                return {"multi_user": self.multi_user}
            case "POST", ["pipelines", "upload"]:
                return self._upload_pipeline(request)
            case "POST", ["pipelines", "upload_version"]:
                return self._upload_version(request)
            case "GET", ["pipelines"]:
                namespace = request.param("namespace") or ""
                found = [p for p in self.pipelines.values() if p.get("namespace", "") == namespace]
                return _listing("pipelines", _filtered(found, request), request)
            case "GET", ["pipelines", pipeline_id]:
                return _public(self._pipeline(pipeline_id))
            case "GET", ["pipelines", pipeline_id, "versions"]:
                self._pipeline(pipeline_id)
                found = [v for v in self.versions.values() if v["pipeline_id"] == pipeline_id]
                return _listing("pipeline_versions", _filtered(found, request), request)
            case "GET", ["pipelines", pipeline_id, "versions", version_id]:
                return _public(self._version(pipeline_id, version_id))
            case "GET", ["experiments"]:
                namespace = request.param("namespace") or ""
                found = [e for e in self.experiments.values() if e["namespace"] == namespace]
                return _listing("experiments", _filtered(found, request), request)
            case "POST", ["experiments"]:
                return _public(self._create_experiment(request.json or {}))
            case "GET", ["experiments", experiment_id]:
                return _public(self._get(self.experiments, experiment_id, "experiment"))
            case "POST", ["runs"]:
                return _public(self._create_run(request.json or {}))
            case "GET", ["runs", run_id]:
                return _public(self._get(self.runs, run_id, "run"))
            case "POST", ["recurringruns"]:
                return _public(self._create_recurring_run(request.json or {}))
            case "GET", ["recurringruns", recurring_run_id]:
                return _public(self._get(self.recurring_runs, recurring_run_id, "recurring run"))
        raise ApiError(404 if method == "GET" else 405, f"{method} {path} is not served by the stand-in")

    # --- resources -------------------------------------------------------------------------------------------

    @staticmethod
    def _get(store: dict[str, dict], key: str, what: str) -> dict:
        if key not in store:
            raise ApiError(404, f"NotFoundError: {what} {key} not found")
        return store[key]

    def _pipeline(self, pipeline_id: str) -> dict:
        return self._get(self.pipelines, pipeline_id, "pipeline")

    def _version(self, pipeline_id: str, version_id: str) -> dict:
        version = self._get(self.versions, version_id, "pipeline version")
        if version["pipeline_id"] != pipeline_id:
            raise ApiError(
                404, f"NotFoundError: pipeline version {version_id} is not a version of {pipeline_id}"
            )
        return version

    def _upload_pipeline(self, request: RecordedRequest) -> dict:
        filename, content = _uploaded_file(request)
        name = request.param("name") or request.param("display_name") or filename
        namespace = request.param("namespace") or ""
        if self.multi_user and not namespace:
            raise ApiError(
                400, "InvalidInputError: a namespace is required to upload a pipeline in multi-user mode"
            )
        if any(p["name"] == name and p.get("namespace", "") == namespace for p in self.pipelines.values()):
            raise ApiError(409, f"AlreadyExistsError: a pipeline named {name} already exists")
        spec = _pipeline_spec(filename, content)
        pipeline = {
            "pipeline_id": str(uuid.uuid4()),
            "name": name,
            "display_name": request.param("display_name") or name,
            "description": request.param("description") or "",
            "namespace": namespace,
            "created_at": _now(),
            "_order": next(self._order),
        }
        self.pipelines[pipeline["pipeline_id"]] = pipeline
        self._add_version(pipeline["pipeline_id"], name, pipeline["description"], spec, content)
        return _public(pipeline)

    def _upload_version(self, request: RecordedRequest) -> dict:
        filename, content = _uploaded_file(request)
        pipeline = self._pipeline(request.param("pipelineid") or "")
        name = request.param("name") or request.param("display_name") or filename
        if any(
            v["name"] == name for v in self.versions.values() if v["pipeline_id"] == pipeline["pipeline_id"]
        ):
            raise ApiError(
                409, f"AlreadyExistsError: pipeline {pipeline['name']} already has a version named {name}"
            )
        spec = _pipeline_spec(filename, content)
        return _public(
            self._add_version(
                pipeline["pipeline_id"], name, request.param("description") or "", spec, content
            )
        )

    def _add_version(self, pipeline_id: str, name: str, description: str, spec: Any, content: bytes) -> dict:
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": str(uuid.uuid4()),
            "name": name,
            "display_name": name,
            "description": description,
            "pipeline_spec": spec,
            "created_at": _now(),
            "_order": next(self._order),
        }
        self.versions[version["pipeline_version_id"]] = version
        self.uploads[version["pipeline_version_id"]] = content
        return version

    def _create_experiment(self, body: dict) -> dict:
        name, namespace = body.get("display_name") or "", body.get("namespace") or ""
        if not name:
            raise ApiError(400, "InvalidInputError: experiment display_name is empty")
        if self.multi_user and not namespace:
            raise ApiError(
                400, "InvalidInputError: Invalid resource references for experiment. Namespace is empty"
            )
        if any(e["display_name"] == name and e["namespace"] == namespace for e in self.experiments.values()):
            raise ApiError(409, f"AlreadyExistsError: an experiment named {name} already exists")
        experiment = {
            "experiment_id": str(uuid.uuid4()),
            "display_name": name,
            "description": body.get("description") or "",
            "namespace": namespace,
            "created_at": _now(),
            "storage_state": "AVAILABLE",
            "_order": next(self._order),
        }
        self.experiments[experiment["experiment_id"]] = experiment
        return experiment

    def _check_pipeline_source(self, body: dict) -> None:
        reference = body.get("pipeline_version_reference")
        if bool(body.get("pipeline_spec")) == bool(reference):
            raise ApiError(
                400, "InvalidInputError: give exactly one of pipeline_spec and pipeline_version_reference"
            )
        if reference:
            version = self._version(
                reference.get("pipeline_id") or "", reference.get("pipeline_version_id") or ""
            )
            self._check_workspace(version["pipeline_spec"])
        if body.get("pipeline_spec"):
            self._check_workspace(body["pipeline_spec"])
        if not body.get("display_name"):
            raise ApiError(400, "InvalidInputError: display_name is empty")
        self._get(self.experiments, body.get("experiment_id") or "", "experiment")

    def _check_workspace(self, spec: Any) -> None:
        """The run's workspace PVC as KFP builds it (backend/src/v2/compiler/argocompiler/argo.go `GetWorkspacePVC`,
        `convertStructToPVCSpec`): the admin default patched by the pipeline's pvcSpecPatch, whose only allowed
        fields are accessModes and storageClassName. A claim without accessModes is refused."""
        platform = spec.get("platform_spec") if isinstance(spec, dict) else None
        config = ((platform or {}).get("platforms", {}).get("kubernetes", {}) or {}).get(
            "pipelineConfig"
        ) or {}
        workspace = config.get("workspace")
        if not workspace or "kubernetes" not in workspace:
            return  # argo.go adds a workspace PVC only when the workspace has a kubernetes section
        patch = workspace["kubernetes"].get("pvcSpecPatch") or {}
        unknown = sorted(set(patch) - {"accessModes", "storageClassName"})
        if unknown:
            raise ApiError(400, f"InvalidInputError: unknown fields in PVC spec patch: {unknown}")
        claim = {**(self.workspace_default or {}), **patch}
        if not claim.get("accessModes"):
            raise ApiError(400, "InvalidInputError: workspace PVC spec must specify accessModes")
        # Kubernetes' PVC validation (pkg/apis/core/validation ValidatePersistentVolumeClaimSpec) then refuses others.
        modes = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
        if not set(claim["accessModes"]) <= modes:
            raise ApiError(
                400, f"InvalidInputError: spec.accessModes: Unsupported value: {claim['accessModes']}"
            )

    def _create_run(self, body: dict) -> dict:
        self._check_pipeline_source(body)
        run = dict(
            body, run_id=str(uuid.uuid4()), state="PENDING", created_at=_now(), _order=next(self._order)
        )
        self.runs[run["run_id"]] = run
        return run

    def _create_recurring_run(self, body: dict) -> dict:
        self._check_pipeline_source(body)
        try:
            concurrency = int(body.get("max_concurrency") or 0)
        except ValueError:
            raise ApiError(400, "InvalidInputError: max_concurrency is not a number") from None
        if not 1 <= concurrency <= 10:
            raise ApiError(
                400,
                "InvalidInputError: The max concurrency of the recurring run is out of range. "
                f"Support 1-10. Received {concurrency}.",
            )
        trigger = body.get("trigger") or {}
        cron, periodic = trigger.get("cron_schedule"), trigger.get("periodic_schedule")
        if bool(cron) == bool(periodic):
            raise ApiError(
                400, "InvalidInputError: a trigger needs exactly one of cron_schedule and periodic_schedule"
            )
        if cron and not _robfig_cron_shape(cron.get("cron") or ""):
            raise ApiError(
                400, f"InvalidInputError: Schedule cron is not a supported format: {cron.get('cron')!r}"
            )
        if periodic and int(periodic.get("interval_second") or 0) <= 0:
            raise ApiError(400, "InvalidInputError: periodic schedule interval_second must be positive")
        recurring = dict(
            body,
            recurring_run_id=str(uuid.uuid4()),
            max_concurrency=str(concurrency),
            mode=body.get("mode") or "ENABLE",
            status="ENABLED" if body.get("mode", "ENABLE") == "ENABLE" else "DISABLED",
            created_at=_now(),
            _order=next(self._order),
        )
        self.recurring_runs[recurring["recurring_run_id"]] = recurring
        return recurring


# --- helpers ------------------------------------------------------------------------------------------------


def _order_key(item: dict) -> int:
    return item["_order"]


def _public(item: dict) -> dict:
    return {key: value for key, value in item.items() if not key.startswith("_")}


def _filtered(items: list[dict], request: RecordedRequest) -> list[dict]:
    raw_filter = request.param("filter")
    if raw_filter:
        for predicate in json.loads(raw_filter).get("predicates", []):
            if predicate.get("operation") not in ("EQUALS", 1):
                raise ApiError(400, f"stand-in: unsupported filter operation {predicate.get('operation')!r}")
            expected = predicate.get("stringValue", predicate.get("string_value"))
            items = [i for i in items if i.get(predicate.get("key")) == expected]
    sort_by = (request.param("sort_by") or "").split()
    if sort_by and sort_by[0] != "created_at":
        raise ApiError(400, f"stand-in: unsupported sort_by {request.param('sort_by')!r}")
    items = sorted(items, key=_order_key, reverse=sort_by[1:] == ["desc"])
    page_size = int(request.param("page_size") or 0)
    return items[:page_size] if page_size > 0 else items


def _listing(key: str, items: list[dict], request: RecordedRequest) -> dict:
    if not items:
        return {"total_size": 0}  # grpc-gateway omits empty repeated fields
    return {key: [_public(i) for i in items], "total_size": len(items)}


def _parse_multipart(content_type: str, raw: bytes) -> dict[str, tuple[str, bytes]]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    if not message.is_multipart():
        raise ValueError("not a multipart body")
    files = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        files[name] = (part.get_filename() or "", part.get_payload(decode=True) or b"")
    return files


def _uploaded_file(request: RecordedRequest) -> tuple[str, bytes]:
    if "uploadfile" not in request.files:
        raise ApiError(400, "InvalidInputError: Failed to read pipeline from file: no uploadfile part")
    return request.files["uploadfile"]


def _pipeline_spec(filename: str, content: bytes) -> Any:
    """What the server stores as the version's pipeline_spec: the spec, or spec + platform spec together."""
    if not filename.endswith((".yaml", ".yml")):
        return {"archive": filename}  # archives are not unpacked (see the module docstring)
    try:
        documents = [d for d in yaml.safe_load_all(content) if d is not None]
    except yaml.YAMLError as error:
        raise ApiError(400, f"InvalidInputError: Failed to parse the pipeline YAML: {error}") from None
    if (
        not documents
        or not isinstance(documents[0], dict)
        or not {"pipelineInfo", "root"} <= set(documents[0])
    ):
        raise ApiError(
            400, "InvalidInputError: the file is not a compiled KFP v2 pipeline (pipelineInfo, root)"
        )
    if len(documents) == 1:
        return documents[0]
    return {"pipeline_spec": documents[0], "platform_spec": documents[1]}


def _robfig_cron_shape(expression: str) -> bool:
    """What KFP's robfig/cron v1 parser accepts in shape: 5 or 6 fields (day of week optional), or a descriptor."""
    return expression.startswith("@") or len(expression.split()) in (5, 6)


@pytest.fixture
def kfp_standin() -> Iterator[KfpStandin]:
    """A started single-user stand-in without auth."""
    with KfpStandin() as standin:
        yield standin
