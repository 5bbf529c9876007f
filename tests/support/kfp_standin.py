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

  * ``POST /apis/v2beta1/recurringruns/{id}:enable`` and ``:disable``

Validation follows the API server (tests/support/kfp_validation.py names the upstream file of each rule): uploads
must be v2 pipeline specs whose name passes both of the server's checks (the spec's, and MLMD's: lowercase letters,
digits and '-', at most 128); a run or recurring run needs exactly one of ``pipeline_spec`` and
``pipeline_version_reference``, a display name, and runtime parameters that match the pipeline's inputs (missing,
unknown, wrong kind: 400); no experiment means the "Default" experiment (multi-user mode needs one);
``max_concurrency`` 1-10; a cron robfig/cron v1 parses (6 fields, or 5 without day of week); an interval >= 1;
a recurring run without ``mode`` is disabled. With ``token`` set, a request without the bearer token gets 401.
Errors have grpc-gateway's body ``{"code", "message", "details"}``; the upload endpoints answer
``{"error_message", "error_details"}``.

Runs stay ``PENDING`` until a test moves them: ``set_run_state(run_id, "RUNNING", tasks={...})``, or
``plan_next_run((state, tasks), ...)`` before a run is created: each read of it then moves it one step.

Known deviations: no pagination (``next_page_token`` is never set), filters understand only ``EQUALS`` predicates,
``sort_by`` only ``created_at`` (asc/desc); archives (.zip/.tar.gz) are stored without being unpacked (so their
runs' parameters are not checked); recurring runs start runs only when a test calls ``tick`` (the controller's
sync at a given time; tests/support/kfp_schedule.py).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support import kfp_validation as rules
from tests.support.kfp_http import (
    ApiError,
    RecordedRequest,
    _order_key,
    filtered,
    listing,
    parse_multipart,
    public,
    uploaded_file,
    uploaded_spec,
)
from tests.support.kfp_schedule import TERMINAL_STATES, RecurringRuns, _now

API = "/apis/v2beta1"
_PROXY_PREFIX = re.compile(
    r"^/api/v1/namespaces/(?P<namespace>[^/]+)/services/ml-pipeline:http/proxy(?P<rest>/.*)$"
)
_GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 6}


class KfpStandin(RecurringRuns):
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
        self._planned: list[list[tuple]] = []  # plan_next_run
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
                request.files = parse_multipart(content_type, raw)
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
                if request.path.startswith(f"{API}/pipelines/upload"):
                    # server/pipeline_upload_server.go `writeErrorToResponse`: a v1beta1 api.Error body.
                    return error.status, {"error_message": error.message, "error_details": error.message}
                return self._error(error.status, error.message)

    @staticmethod
    def _error(status: int, message: str) -> tuple[int, dict]:
        """grpc-gateway v2's body for a google.rpc.Status (common/util/error.go `UserError.GRPCStatus`)."""
        code = _GRPC_CODES.get(status, 13)
        detail = {"@type": "type.googleapis.com/google.rpc.Status", "code": code, "message": message}
        return status, {"code": code, "message": message, "details": [detail]}

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
                return listing("pipelines", filtered(found, request), request)
            case "GET", ["pipelines", pipeline_id]:
                return public(self._pipeline(pipeline_id))
            case "GET", ["pipelines", pipeline_id, "versions"]:
                self._pipeline(pipeline_id)
                found = [v for v in self.versions.values() if v["pipeline_id"] == pipeline_id]
                return listing("pipeline_versions", filtered(found, request), request)
            case "GET", ["pipelines", pipeline_id, "versions", version_id]:
                return public(self._version(pipeline_id, version_id))
            case "GET", ["experiments"]:
                namespace = request.param("namespace") or ""
                found = [e for e in self.experiments.values() if e["namespace"] == namespace]
                return listing("experiments", filtered(found, request), request)
            case "POST", ["experiments"]:
                return public(self._create_experiment(request.json or {}))
            case "GET", ["experiments", experiment_id]:
                return public(self._get(self.experiments, experiment_id, "experiment"))
            case "POST", ["runs"]:
                return public(self._create_run(request.json or {}))
            case "GET", ["runs", run_id]:
                run = self._get(self.runs, run_id, "run")
                if run.get("_plan"):
                    self._move(run, *run["_plan"].pop(0))
                return public(run)
            case "POST", ["recurringruns"]:
                return public(self._create_recurring_run(request.json or {}))
            case "POST", ["recurringruns", action] if action.endswith((":enable", ":disable")):
                recurring_run_id, _, verb = action.rpartition(":")
                return self._set_recurring_mode(recurring_run_id, verb == "enable")
            case "GET", ["recurringruns", recurring_run_id]:
                return public(self._get(self.recurring_runs, recurring_run_id, "recurring run"))
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
        filename, content = uploaded_file(request)
        name = request.param("name") or request.param("display_name") or filename
        if len(name) > 128:  # validation/length.go: Pipeline.Name at most 128 characters
            raise ApiError(400, f"Pipeline.Name length cannot exceed 128 characters, got {len(name)}")
        namespace = request.param("namespace") or ""
        if self.multi_user and not namespace:
            raise ApiError(
                400, "InvalidInputError: a namespace is required to upload a pipeline in multi-user mode"
            )
        spec = uploaded_spec(filename, content)  # the spec's checks come before the store's duplicate check
        if any(p["name"] == name and p.get("namespace", "") == namespace for p in self.pipelines.values()):
            raise ApiError(409, f"AlreadyExistsError: a pipeline named {name} already exists")
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
        return public(pipeline)

    def _upload_version(self, request: RecordedRequest) -> dict:
        filename, content = uploaded_file(request)
        pipeline = self._pipeline(request.param("pipelineid") or "")
        name = request.param("name") or request.param("display_name") or filename
        spec = uploaded_spec(filename, content)
        if any(
            v["name"] == name for v in self.versions.values() if v["pipeline_id"] == pipeline["pipeline_id"]
        ):
            raise ApiError(
                409, f"AlreadyExistsError: pipeline {pipeline['name']} already has a version named {name}"
            )
        return public(
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

    def _check_pipeline_source(self, body: dict, what: str = "run") -> None:
        reference = body.get("pipeline_version_reference")
        if bool(body.get("pipeline_spec")) == bool(reference):
            raise ApiError(
                400, "InvalidInputError: give exactly one of pipeline_spec and pipeline_version_reference"
            )
        if reference:
            version = self._version(
                reference.get("pipeline_id") or "", reference.get("pipeline_version_id") or ""
            )
            stored = version["pipeline_spec"]
        else:
            stored = body["pipeline_spec"]
        self._check_workspace(stored)
        if not body.get("display_name"):
            # server/run_server.go `createRun`; for recurring runs server/api_converter.go `toModelJob` (a 500).
            if what == "run":
                raise ApiError(400, "The run name is empty. Please specify a valid name")
            raise ApiError(500, "InternalServerError: Recurring run's name cannot be empty")
        body["experiment_id"] = self._experiment_for(body)
        spec = stored.get("pipeline_spec", stored) if isinstance(stored, dict) else None
        if isinstance(spec, dict) and "root" in spec:
            values = (body.get("runtime_config") or {}).get("parameters")
            problem = rules.pipeline_job_input_problem(spec, values)
            if problem:
                raise ApiError(400, problem)

    def _experiment_for(self, body: dict) -> str:
        """resource/resource_manager.go `GetValidExperimentNamespacePair`: no experiment means the default one
        ("Default", created when missing, `CreateDefaultExperiment`); in multi-user mode an experiment is needed."""
        experiment_id = body.get("experiment_id") or ""
        if experiment_id:
            return self._get(self.experiments, experiment_id, "experiment")["experiment_id"]
        if self.multi_user:
            raise ApiError(400, "Experiment id can not be empty in multi-user mode")
        default = next((e for e in self.experiments.values() if e["display_name"] == "Default"), None)
        if default is None:
            default = self._create_experiment(
                {
                    "display_name": "Default",
                    "description": "All runs created without specifying an experiment will be grouped here.",
                }
            )
        return default["experiment_id"]

    def _check_workspace(self, spec: Any) -> None:
        problem = rules.workspace_problem(spec, self.workspace_default)
        if problem:
            raise ApiError(400, problem)

    def _create_run(self, body: dict) -> dict:
        self._check_pipeline_source(body)
        run = dict(
            body, run_id=str(uuid.uuid4()), state="PENDING", created_at=_now(), _order=next(self._order)
        )
        run["_plan"] = self._planned.pop(0) if self._planned else []
        self.runs[run["run_id"]] = run
        return run

    # --- moving runs (test side) -----------------------------------------------------------------------------

    def set_run_state(self, run_id: str, state: str, tasks: dict[str, str] | None = None) -> None:
        """Move a run to `state` (RUNNING, SUCCEEDED, FAILED, CANCELED, ...) with its tasks' states (display name ->
        state) as `run_details.task_details` reports them. Nothing moves unless a test moves it."""
        with self._lock:
            self._move(self._get(self.runs, run_id, "run"), state, tasks)

    def plan_next_run(self, *steps: tuple[str, dict[str, str] | None]) -> None:
        """The next run created moves one step per read: the first GET answers steps[0], the next steps[1], ...
        (then it stays). A test drives a polling client through states this way without sleeping."""
        with self._lock:
            self._planned.append(list(steps))

    def _move(self, run: dict, state: str, tasks: dict[str, str] | None) -> None:
        run["state"] = state
        if tasks is not None:
            details = [
                {
                    "run_id": run["run_id"],
                    "task_id": f"{run['run_id']}-{n}",
                    "display_name": name,
                    "state": task,
                }
                for n, (name, task) in enumerate(tasks.items())
            ]
            run["run_details"] = {"task_details": details}
        if state in TERMINAL_STATES:
            run["finished_at"] = _now()


# --- helpers ------------------------------------------------------------------------------------------------


@pytest.fixture
def kfp_standin() -> Iterator[KfpStandin]:
    """A started single-user stand-in without auth."""
    with KfpStandin() as standin:
        yield standin
